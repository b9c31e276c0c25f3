// Package boltcheck opens bbolt files defensively, for the data
// directories questrt recovers from (a grid's sequence table, its page
// stores' manifests, the disk tier's index). bbolt trusts its pages and
// reads them through a memory map: one flipped byte in a branch or leaf
// page can make it panic, or read past the map and crash the process
// with a fault no recover catches, the first time a transaction walks
// that page. Open and Check run with the goroutine's faults turned into
// panics (runtime/debug.SetPanicOnFault) and recover them: Open reads
// the meta and freelist pages, Check checks the meta page's high-water
// mark against the file and then reads every bucket, key and value once,
// so that a damaged file is refused (ErrCorrupt) before anything else
// touches it, and a file that passes has no page left that a later read
// could fault on. bbolt's own Tx.Check runs last, once the walk has read
// every reachable page: it walks them on a goroutine of its own, where a
// fault could not be caught, so it must never be the first to touch a
// page; it adds what a walk cannot see (a page both in use and free,
// which the next commit would overwrite; keys out of order).
package boltcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrCorrupt wraps what Open and Check report of a damaged file.
var ErrCorrupt = errors.New("boltcheck: damaged bbolt file")

// maxDepth bounds nested buckets (a damaged bucket page can point back
// at an ancestor).
const maxDepth = 64

// Open is bolt.Open, with a panic or a fault while reading the file's
// meta and freelist pages, and bbolt's invalid-file errors (not a bbolt
// file, a meta page's checksum, a version it does not read), wrapped in
// ErrCorrupt; other errors (permissions, the lock's timeout) as bolt.Open
// returns them.
func Open(path string, mode os.FileMode, opt *bolt.Options) (db *bolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: %s: opening it failed: %v", ErrCorrupt, path, r)
		}
	}()
	db, err = bolt.Open(path, mode, opt)
	if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch) {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	return db, err
}

// Check reads every bucket, key and value of db once in a read
// transaction, faults turned into errors (its cost grows with the file:
// the metadata files it serves are small), and returns nil for a file
// whose structure holds, an error wrapping ErrCorrupt otherwise. Values
// are only read, not judged: the callers' own records carry checksums.
func Check(db *bolt.DB) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: reading it failed: %v", ErrCorrupt, db.Path(), r)
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		fi, err := os.Stat(db.Path())
		if err != nil {
			return err
		}
		if tx.Size() > fi.Size() {
			return fmt.Errorf("%w: %s: its meta page claims %d bytes of pages, the file has %d", ErrCorrupt, db.Path(), tx.Size(), fi.Size())
		}
		// Pages first: every page in use must lie below the high-water
		// mark, every leaf's and branch's elements in their page, and
		// no branch may lead back to itself, before a cursor follows
		// them (a cursor descends a cycle of branch pages for ever).
		if err := checkPages(tx, db.Path(), int(tx.Size()/int64(db.Info().PageSize)), db.Info().PageSize); err != nil {
			return err
		}
		var sum uint32
		// A leaf element takes at least 16 bytes: a walk that meets more
		// keys than the file could hold goes round a cycle of pages.
		keys, maxKeys := int64(0), tx.Size()/16+1
		var walk func(b *bolt.Bucket, depth int) error
		walk = func(b *bolt.Bucket, depth int) error {
			if depth > maxDepth {
				return fmt.Errorf("%w: %s: buckets nested deeper than %d", ErrCorrupt, db.Path(), maxDepth)
			}
			return b.ForEach(func(k, v []byte) error {
				if keys++; keys > maxKeys {
					return fmt.Errorf("%w: %s: more than %d keys in %d bytes: its pages form a cycle", ErrCorrupt, db.Path(), maxKeys, tx.Size())
				}
				sum = crc32.Update(sum, crc32.IEEETable, k)
				if v != nil {
					sum = crc32.Update(sum, crc32.IEEETable, v)
					return nil
				}
				nb := b.Bucket(k)
				if nb == nil {
					return fmt.Errorf("%w: %s: key %x is neither a value nor a bucket", ErrCorrupt, db.Path(), k)
				}
				return walk(nb, depth+1)
			})
		}
		if err := tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(b, 1) }); err != nil {
			return err
		}
		// Every reachable page has been read safely above; bbolt's own
		// check now finds what a walk cannot: pages both reachable and
		// free (a later commit would overwrite them), pages freed twice
		// or lost, keys out of order (a lookup would miss them).
		var errs []error
		for err := range tx.Check() {
			if len(errs) < 4 {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%w: %s: bbolt's consistency check: %w", ErrCorrupt, db.Path(), errors.Join(errs...))
		}
		return nil
	})
}

// OpenChecked is Open then Check; a file that fails the check is closed.
// A read-only open (bolt.Options.ReadOnly) must set PreLoadFreelist: the
// check needs the freelist.
func OpenChecked(path string, mode os.FileMode, opt *bolt.Options) (*bolt.DB, error) {
	db, err := Open(path, mode, opt)
	if err != nil {
		return nil, err
	}
	if err := Check(db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// Update is db.Update with a panic or a fault inside it (bbolt's own
// assertions on a damaged page it meets only when it writes, a page
// past the map) returned as an error wrapping ErrCorrupt; the
// transaction is rolled back, as bbolt does for any panic, and the
// process goes on.
func Update(db *bolt.DB, fn func(*bolt.Tx) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: a write failed: %v", ErrCorrupt, db.Path(), r)
		}
	}()
	return db.Update(fn)
}

// View is db.View with a panic or a fault inside it returned as an
// error wrapping ErrCorrupt.
func View(db *bolt.DB, fn func(*bolt.Tx) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: a read failed: %v", ErrCorrupt, db.Path(), r)
		}
	}()
	return db.View(fn)
}

// bbolt's on-disk layout (go.etcd.io/bbolt/internal/common): a page
// header of 16 bytes (id uint64, flags uint16 at 8, count uint16 at 10,
// overflow uint32 at 12), leaf elements of 16 bytes (flags, pos, ksize,
// vsize: uint32 each, pos counted from the element), a bucket value of
// a 16-byte header (root page id, sequence) followed, for an inline
// bucket (root 0), by a leaf page of its own. Native byte order.
const (
	pageHeaderSize  = 16
	leafElementSize = 16
	// A branch element: pos, ksize (uint32 each), the child's page id.
	branchElementSize = 16
	branchPageFlag    = 0x01
	bucketHeader      = 16
	leafPageFlag      = 0x02
	bucketLeafFlag    = 0x01
)

// checkPages walks the pages below the high-water mark hwm by their
// headers, a page in use and its overflow at a time (the overflow's own
// first bytes are data, not a header), and refuses a page whose
// overflow runs past hwm or into free pages (the commit that frees it
// would free them twice: a panic). It reads each leaf page from the
// file and checks what bbolt takes on trust: each element's key and
// value lie inside its page, and the value of each inline bucket holds
// exactly its inline page. bbolt copies an inline bucket's value by
// its declared size (when it is not 8-byte aligned, which is most of
// them) and reads the inline page's elements through that copy: a
// value size cut by a flipped byte reads heap memory past the copy as
// keys and values, and the next write of the parent page saves the cut
// value, losing keys without an error (a sequence table's next-key
// record, so that a new sequence overwrote an old one's entry).
func checkPages(tx *bolt.Tx, path string, hwm, pageSize int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	ne := binary.NativeEndian
	var buf []byte
	children := map[int][]int{} // branch page -> its children
	for id := 0; id < hwm; {
		pi, err := tx.Page(id)
		if errors.Is(err, berrors.ErrFreePagesNotLoaded) {
			return fmt.Errorf("boltcheck: %s: a read-only check needs bolt.Options.PreLoadFreelist: %w", path, err)
		}
		if err != nil {
			return fmt.Errorf("%w: %s: page %d: %w", ErrCorrupt, path, id, err)
		}
		if pi == nil {
			break
		}
		switch pi.Type {
		case "leaf", "branch", "meta", "freelist":
		default: // free, or a header bbolt does not know: bbolt's check judges it
			id++
			continue
		}
		if id+pi.OverflowCount >= hwm {
			return fmt.Errorf("%w: %s: %s page %d claims %d overflow pages, the file has %d pages", ErrCorrupt, path, pi.Type, id, pi.OverflowCount, hwm)
		}
		for o := id + 1; o <= id+pi.OverflowCount; o++ {
			if po, err := tx.Page(o); err == nil && po != nil && po.Type == "free" {
				return fmt.Errorf("%w: %s: %s page %d overflows into free page %d", ErrCorrupt, path, pi.Type, id, o)
			}
		}
		if pi.Type != "leaf" && pi.Type != "branch" {
			id += 1 + pi.OverflowCount
			continue
		}
		n := (1 + pi.OverflowCount) * pageSize
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := f.ReadAt(buf, int64(id)*int64(pageSize)); err != nil {
			return fmt.Errorf("%w: %s: %s page %d: %w", ErrCorrupt, path, pi.Type, id, err)
		}
		if pi.Type == "branch" {
			// bbolt's check reads every branch key (a cursor reads only
			// the child page ids): each must lie in its page, and each
			// child below the high-water mark.
			if ne.Uint16(buf[8:])&branchPageFlag == 0 {
				return fmt.Errorf("%w: %s: page %d is no longer a branch", ErrCorrupt, path, id)
			}
			count := int(ne.Uint16(buf[10:]))
			if pageHeaderSize+count*branchElementSize > n {
				return fmt.Errorf("%w: %s: branch page %d: %d elements do not fit in %d bytes", ErrCorrupt, path, id, count, n)
			}
			for i := range count {
				e := pageHeaderSize + i*branchElementSize
				end := int64(e) + int64(ne.Uint32(buf[e:])) + int64(ne.Uint32(buf[e+4:]))
				if end > int64(n) {
					return fmt.Errorf("%w: %s: branch page %d element %d: key past the page's %d bytes", ErrCorrupt, path, id, i, n)
				}
				child := ne.Uint64(buf[e+8:])
				if child < 2 || child >= uint64(hwm) {
					return fmt.Errorf("%w: %s: branch page %d element %d: child page %d outside 2..%d", ErrCorrupt, path, id, i, child, hwm-1)
				}
				children[id] = append(children[id], int(child))
			}
			id += 1 + pi.OverflowCount
			continue
		}
		if ne.Uint16(buf[8:])&leafPageFlag == 0 { // changed under us: not reached under the tx
			return fmt.Errorf("%w: %s: page %d is no longer a leaf", ErrCorrupt, path, id)
		}
		count := int(ne.Uint16(buf[10:]))
		if pageHeaderSize+count*leafElementSize > n {
			return fmt.Errorf("%w: %s: leaf page %d: %d elements do not fit in %d bytes", ErrCorrupt, path, id, count, n)
		}
		for i := range count {
			e := pageHeaderSize + i*leafElementSize
			flags := ne.Uint32(buf[e:])
			start := int64(e) + int64(ne.Uint32(buf[e+4:])) + int64(ne.Uint32(buf[e+8:]))
			vsize := int64(ne.Uint32(buf[e+12:]))
			if start+vsize > int64(n) {
				return fmt.Errorf("%w: %s: leaf page %d element %d: key or value past the page's %d bytes", ErrCorrupt, path, id, i, n)
			}
			if flags&bucketLeafFlag == 0 {
				continue
			}
			if err := checkBucketValue(buf[start : start+vsize]); err != nil {
				return fmt.Errorf("%w: %s: leaf page %d element %d: bucket value of %d bytes: %w", ErrCorrupt, path, id, i, vsize, err)
			}
		}
		id += 1 + pi.OverflowCount
	}
	return branchCycle(children, path)
}

// branchCycle refuses branch pages that lead back to one of themselves
// (a depth-first walk over the branches' child lists; leaves end it).
func branchCycle(children map[int][]int, path string) error {
	const (
		unseen = iota
		open
		done
	)
	state := make(map[int]int, len(children))
	var visit func(p int) error
	visit = func(p int) error {
		switch state[p] {
		case open:
			return fmt.Errorf("%w: %s: branch page %d is its own descendant: the pages form a cycle", ErrCorrupt, path, p)
		case done:
			return nil
		}
		state[p] = open
		for _, c := range children[p] {
			if _, branch := children[c]; branch {
				if err := visit(c); err != nil {
					return err
				}
			}
		}
		state[p] = done
		return nil
	}
	for p := range children {
		if err := visit(p); err != nil {
			return err
		}
	}
	return nil
}

// checkBucketValue checks that a bucket value (header and, for an
// inline bucket, its page) holds everything its inline page's elements
// name; bbolt writes an inline bucket's value at exactly that size.
func checkBucketValue(v []byte) error {
	ne := binary.NativeEndian
	if len(v) < bucketHeader {
		return errors.New("shorter than a bucket header")
	}
	if ne.Uint64(v) != 0 {
		return nil // its own pages: walked as any other
	}
	p := v[bucketHeader:]
	if len(p) < pageHeaderSize {
		return errors.New("inline page shorter than its header")
	}
	if ne.Uint16(p[8:])&leafPageFlag == 0 {
		return fmt.Errorf("inline page flags %#x are not a leaf's", ne.Uint16(p[8:]))
	}
	count := int(ne.Uint16(p[10:]))
	end := pageHeaderSize + count*leafElementSize
	if end > len(p) {
		return fmt.Errorf("inline page of %d elements in %d bytes", count, len(p))
	}
	for i := range count {
		e := pageHeaderSize + i*leafElementSize
		if ne.Uint32(p[e:])&bucketLeafFlag != 0 {
			return fmt.Errorf("inline element %d is a bucket (bbolt never inlines a bucket with buckets)", i)
		}
		x := int64(e) + int64(ne.Uint32(p[e+4:])) + int64(ne.Uint32(p[e+8:])) + int64(ne.Uint32(p[e+12:]))
		if x > int64(len(p)) {
			return fmt.Errorf("inline element %d ends at byte %d of an inline page of %d", i, x, len(p))
		}
		end = max(end, int(x))
	}
	if end != len(p) {
		return fmt.Errorf("inline page of %d bytes holds %d", len(p), end)
	}
	return nil
}
