package worker

import "encoding/binary"

// The sequence table's on-disk names (internal/metastore's bbolt
// layout), for the tests that damage a table with bbolt directly.
var bkWorkerSeqs = []byte("seqs")

// entryKey is the key of entry k in the table's buckets.
func entryKey(k uint64) []byte { return binary.BigEndian.AppendUint64(nil, k) }
