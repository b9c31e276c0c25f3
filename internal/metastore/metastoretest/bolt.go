package metastoretest

import (
	"encoding/hex"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// BoltContents returns what the bbolt file at path holds, opened
// read-only: bucket name -> hex key -> value (as a string), for tests
// that pin the on-disk encoding (golden files, fixtures written by older
// code). Nested buckets are not expected and fail the test.
func BoltContents(t testing.TB, path string) map[string]map[string]string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer db.Close()
	out := map[string]map[string]string{}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			m := map[string]string{}
			out[string(name)] = m
			return b.ForEach(func(k, v []byte) error {
				if v == nil {
					t.Errorf("%s: bucket %s holds a nested bucket %x", path, name, k)
				}
				m[hex.EncodeToString(k)] = string(v)
				return nil
			})
		})
	})
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return out
}
