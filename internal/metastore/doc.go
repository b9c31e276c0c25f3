// Package metastore is the one home of questrt's durable metadata: the
// small records that say what a data directory holds, kept apart from
// the page payloads (slab files). Each kind of record is one small
// interface in the words of its owner, with a bbolt implementation (the
// on-disk format) and an in-memory twin beside it, both checked by one
// conformance suite (metastoretest.Run), as hashicorp raft keeps its
// LogStore and StableStore with raft-boltdb and InmemStore.
//
// It holds the worker's sequence table ([SeqTable]: the format record
// of a data directory, one entry per sequence naming its store sequence
// on every hosted rank, and the step markers that make a decode step
// atomic across a crash), a page store's manifests ([Manifests]: its
// geometry, one manifest per persisted sequence naming the slab slots
// of its pages, and each slot's payload checksum) and a disk tier's
// index ([SlotIndex]: the slab geometry and each written slot's payload
// length and checksum). Each is a bbolt file of its own in its owner's
// directory, with the buckets, keys and encodings those owners wrote
// before this package existed.
//
// Every bbolt file is opened through internal/boltcheck: a damaged file
// is refused with an error wrapping [ErrCorrupt] before anything walks
// its pages, and [CheckFile] runs the same check on any bbolt file of a
// data directory, read-only.
package metastore
