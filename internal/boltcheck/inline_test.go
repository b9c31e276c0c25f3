package boltcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// rootLeaf returns the offset of the root bucket's page in a bbolt
// file, read from the meta page with the higher transaction id (meta:
// root page id at byte 32 of the page, txid at 64; page size at 24).
func rootLeaf(t *testing.T, b []byte) int {
	t.Helper()
	ps := int(binary.LittleEndian.Uint32(b[24:]))
	meta := 0
	if binary.LittleEndian.Uint64(b[ps+64:]) > binary.LittleEndian.Uint64(b[64:]) {
		meta = ps
	}
	off := int(binary.LittleEndian.Uint64(b[meta+32:])) * ps
	if flags := binary.LittleEndian.Uint16(b[off+8:]); flags != leafPageFlag {
		t.Fatalf("root page at %d has flags %#x, want a leaf", off, flags)
	}
	return off
}

// TestInlineBucketValueSize damages the declared value size of each
// inline bucket in a root leaf page, as a worker's sequence table has
// them (a format record and a next-key record in one, entries in
// another, an empty one), one bit at a time, shrinking and growing it.
// bbolt reads the inline page through a copy of that many bytes, so a
// cut size reads heap memory as keys (a sequence table lost its
// next-key record that way and a new sequence overwrote an old one):
// every such file must be refused as ErrCorrupt, the intact one
// opened.
func TestInlineBucketValueSize(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "intact.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		if err := meta.Put([]byte("format"), []byte(`{"version":1,"layers":2,"QHeads":4,"KVHeads":2,"HeadDim":16,"PageSize":16,"ranks":[{"TP":0,"CP":0}]}`)); err != nil {
			return err
		}
		if err := meta.Put([]byte("next"), binary.BigEndian.AppendUint64(nil, 5)); err != nil {
			return err
		}
		seqs, err := tx.CreateBucket([]byte("seqs"))
		if err != nil {
			return err
		}
		for i := range 3 {
			if err := seqs.Put(binary.BigEndian.AppendUint64(nil, uint64(i+1)), fmt.Appendf(nil, `{"seq":%d,"ranks":[{"store":%d}]}`, i+1, i+1)); err != nil {
				return err
			}
		}
		_, err = tx.CreateBucket([]byte("steps"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := OpenChecked(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatalf("the intact file: %v", err)
	}
	ok.Close()

	root := rootLeaf(t, orig)
	count := int(binary.LittleEndian.Uint16(orig[root+10:]))
	if count != 3 {
		t.Fatalf("root leaf has %d elements, want 3 buckets", count)
	}
	flips := 0
	for i := range count {
		e := root + pageHeaderSize + i*leafElementSize
		if binary.LittleEndian.Uint32(orig[e:])&bucketLeafFlag == 0 {
			t.Fatalf("root element %d is not a bucket", i)
		}
		for bit := range 8 {
			b := append([]byte(nil), orig...)
			b[e+12] ^= 1 << bit // the value size's low byte
			p := filepath.Join(dir, fmt.Sprintf("e%d-b%d.db", i, bit))
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			db, err := OpenChecked(p, 0o600, &bolt.Options{Timeout: time.Second})
			if err == nil {
				db.Close()
				t.Errorf("element %d, value size %d -> %d: opened, want ErrCorrupt",
					i, binary.LittleEndian.Uint32(orig[e+12:]), binary.LittleEndian.Uint32(b[e+12:]))
				continue
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("element %d bit %d: %v, want ErrCorrupt", i, bit, err)
			}
			flips++
		}
	}
	if flips != 24 {
		t.Errorf("%d flips refused, want 24", flips)
	}
}

// TestCheckPassesWrittenFiles writes random files as bbolt makes them
// (inline, empty and paged buckets, buckets nested in paged ones,
// values up to several pages, deletes that leave free pages and shrink
// buckets back inline) and requires every one to pass OpenChecked: the
// checks of leaf elements and inline bucket sizes hold for whatever
// bbolt writes.
func TestCheckPassesWrittenFiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 9))
	dir := t.TempDir()
	for n := range 12 {
		path := filepath.Join(dir, fmt.Sprintf("f%d.db", n))
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		var fill func(b *bolt.Bucket, depth int) error
		fill = func(b *bolt.Bucket, depth int) error {
			keys := rng.IntN(60)
			for k := range keys {
				v := make([]byte, rng.IntN(200))
				if rng.IntN(40) == 0 {
					v = make([]byte, 4096*(1+rng.IntN(3)))
				}
				for i := range v {
					v[i] = byte(rng.Uint32())
				}
				if err := b.Put(fmt.Appendf(nil, "k%04d", k), v); err != nil {
					return err
				}
			}
			for c := range rng.IntN(3) {
				if depth >= 3 {
					break
				}
				nb, err := b.CreateBucket(fmt.Appendf(nil, "b%d", c))
				if err != nil {
					return err
				}
				if err := fill(nb, depth+1); err != nil {
					return err
				}
			}
			return nil
		}
		for txn := range 3 {
			err = db.Update(func(tx *bolt.Tx) error {
				for r := range 1 + rng.IntN(4) {
					name := fmt.Appendf(nil, "root%d-%d", txn, r)
					b, err := tx.CreateBucket(name)
					if err != nil {
						return err
					}
					if err := fill(b, 1); err != nil {
						return err
					}
				}
				// Shrink some buckets of an earlier transaction.
				return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
					if rng.IntN(2) == 0 {
						return nil
					}
					c := b.Cursor()
					for k, v := c.First(); k != nil; k, v = c.Next() {
						if v != nil && rng.IntN(4) != 0 {
							if err := c.Delete(); err != nil {
								return err
							}
						}
					}
					return nil
				})
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		db.Close()
		db, err = OpenChecked(path, 0o600, &bolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatalf("file %d as bbolt wrote it: %v", n, err)
		}
		db.Close()
	}
}

// TestBranchCycle: branch pages that lead back to themselves (directly,
// or through other branches) are refused before a cursor descends them;
// a tree, and branches sharing a leaf, pass.
func TestBranchCycle(t *testing.T) {
	for name, c := range map[string]struct {
		children map[int][]int
		cycle    bool
	}{
		"tree":        {map[int][]int{3: {4, 5}, 4: {6, 7}, 5: {8}}, false},
		"shared leaf": {map[int][]int{3: {4, 5}, 4: {9}, 5: {9}}, false},
		"self":        {map[int][]int{3: {4, 3}}, true},
		"two":         {map[int][]int{3: {4}, 4: {5, 3}}, true},
		"deep":        {map[int][]int{3: {4}, 4: {5}, 5: {6}, 6: {7}, 7: {4}}, true},
	} {
		err := branchCycle(c.children, "f.db")
		if got := errors.Is(err, ErrCorrupt); got != c.cycle {
			t.Errorf("%s: %v, want a cycle %v", name, err, c.cycle)
		}
	}
}
