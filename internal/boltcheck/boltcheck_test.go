package boltcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// build writes a bbolt file with nested buckets and enough keys for
// branch pages, as the sequence tables and manifests are, and returns
// its bytes.
func build(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "x.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{FreelistType: bolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for b := range 3 {
			bk, err := tx.CreateBucket([]byte(fmt.Sprintf("bucket-%d", b)))
			if err != nil {
				return err
			}
			for i := range 400 {
				k := binary.BigEndian.AppendUint64(nil, uint64(i))
				if err := bk.Put(k, []byte(fmt.Sprintf("value %d of bucket %d, some bytes to fill the leaf pages", i, b))); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Churn, so that the freelist holds pages.
	err = db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte("bucket-1"))
		for i := 0; i < 400; i += 3 {
			if err := bk.Delete(binary.BigEndian.AppendUint64(nil, uint64(i))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readAll walks every bucket and key (what recovery does).
func readAll(db *bolt.DB) error {
	return db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error { return nil })
		})
	})
}

// TestOpenCheckedFlippedBytes flips one byte at a time across a whole
// bbolt file (meta, freelist, branch and leaf pages; every 61st byte)
// and opens the copy: never a panic, and the file is either refused
// with ErrCorrupt or sound enough that reading every key does not panic
// (a flipped value byte changes data, which the callers' own checksums
// catch, not bbolt's structure). The intact file opens and reads.
func TestOpenCheckedFlippedBytes(t *testing.T) {
	orig := build(t)
	dir := t.TempDir()
	refused, opened := 0, 0
	for pos := 0; pos < len(orig); pos += 61 {
		// A file of its own each time: an open that failed part-way may
		// keep its lock until the process ends. Removed after its trial
		// (about 2,700 copies of 0.5 MB).
		path := filepath.Join(dir, fmt.Sprintf("x%d.db", pos))
		b := append([]byte(nil), orig...)
		b[pos] ^= 0xff
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		func() {
			defer os.Remove(path)
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("byte %d flipped: panic past the check: %v", pos, r)
				}
			}()
			db, err := OpenChecked(path, 0o600, &bolt.Options{FreelistType: bolt.FreelistMapType, Timeout: time.Second})
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("byte %d flipped: %v, want ErrCorrupt", pos, err)
				}
				refused++
				return
			}
			defer db.Close()
			opened++
			if err := readAll(db); err != nil {
				t.Logf("byte %d flipped: opened, reading: %v", pos, err)
			}
		}()
	}
	t.Logf("%d bytes of %d: %d refused as damaged, %d opened", refused+opened, len(orig), refused, opened)
	if refused == 0 || opened == 0 {
		t.Errorf("refused %d, opened %d: want both (meta damage refused, value bytes opened)", refused, opened)
	}
	path := filepath.Join(dir, "intact.db")
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := OpenChecked(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatalf("the intact file: %v", err)
	}
	defer db.Close()
	if err := readAll(db); err != nil {
		t.Fatal(err)
	}
}
