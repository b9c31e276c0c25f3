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
// could fault on. (bbolt's own Tx.Check is not used: it walks the pages
// on a goroutine of its own, where such a fault cannot be caught.)
package boltcheck

import (
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
		var sum uint32
		var walk func(b *bolt.Bucket, depth int) error
		walk = func(b *bolt.Bucket, depth int) error {
			if depth > maxDepth {
				return fmt.Errorf("%w: %s: buckets nested deeper than %d", ErrCorrupt, db.Path(), maxDepth)
			}
			return b.ForEach(func(k, v []byte) error {
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
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(b, 1) })
	})
}

// OpenChecked is Open then Check; a file that fails the check is closed.
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
