package metastore

import "context"

// SlotIndex is a disk tier's durable index (pagestore/disktier): the
// geometry of its slab files and, per written slot, the length and
// checksum of the payload it holds. The whole index is read once, at
// Init; a free slot has no entry.
//
// Every Init and Commit is atomic and durable when it returns; a
// SlotIndex is safe for concurrent use. Every method but Close checks
// ctx first and, when it is done, returns ctx.Err() changing nothing.
type SlotIndex interface {
	// Init checks the geometry record against f (Slots aside: it
	// records the last count), commits f, and returns the entry of each
	// of f.Slots slots, in one commit: on error nothing changes. Another
	// geometry, or a payload in a slot past f.Slots, fails with an
	// error wrapping ErrOtherFormat; a record that does not decode with
	// one wrapping ErrCorrupt and tier.ErrCorrupt.
	Init(ctx context.Context, f SlotFormat) ([]SlotEntry, error)
	// Commit records the entries of changes (by slot) in one commit: a
	// used one is written, an unused one removed.
	Commit(ctx context.Context, changes map[int]SlotEntry) error
	// Close releases the index (and its lock); idempotent.
	Close() error
}

// SlotFormat is the geometry of a disk tier's slab files.
//
// Its JSON names are the bbolt index's encoding: never change them.
type SlotFormat struct {
	PayloadBytes int   `json:"payload_bytes"`
	SlotAlign    int   `json:"slot_align"`
	SlotsPerFile int   `json:"slots_per_file"`
	SlotBytes    int64 `json:"slot_bytes"`
	Slots        int   `json:"slots"` // the count of the last Init (informational)
}

// SlotEntry is one slot's entry: Used when it holds a payload, whose
// checksum is CRC.
type SlotEntry struct {
	Used bool
	CRC  uint32
}
