package metastore

import (
	"context"

	"github.com/questrt/questrt/plan"
)

// Manifests are a page store's durable manifests (pagestore with a
// DataDir): the geometry its data directory was made for, one Manifest
// per persisted store sequence, the payload checksum of every slab slot
// a manifest may name, and the next sequence id.
//
// Every Commit is atomic and durable when it returns, as a SeqTable's
// writes are; Manifests are safe for concurrent use. Every method but
// Close checks ctx first and, when it is done, returns ctx.Err()
// changing nothing.
type Manifests interface {
	// Init checks the format record against f and commits f when there
	// is none; another record fails with a *FormatError
	// (ErrOtherFormat) and changes nothing.
	Init(ctx context.Context, f ManifestFormat) error
	// Load reads every manifest and slot record, checking each against
	// its checksum (damage is reported per record, not as an error).
	Load(ctx context.Context) (Loaded, error)
	// Commit makes b durable in one commit.
	Commit(ctx context.Context, b ManifestBatch) error
	// Close releases the manifests (and their lock); idempotent.
	Close() error
}

// ManifestFormat is the fixed geometry of a page store's data
// directory.
type ManifestFormat struct {
	Layers, KVHeads, HeadDim, PageSize int
	DType                              plan.DType
}

// Manifest is one persisted store sequence.
type Manifest struct {
	ID uint64
	// LenRec is the index of the sequence's record in the store's
	// lengths file.
	LenRec int32
	// Lens are its persisted lengths, one per layer.
	Lens []int
	// Slots are the slab slots of its pages, in page order.
	Slots []int32
}

// ManifestRecord is one manifest as Load read it.
type ManifestRecord struct {
	Manifest Manifest
	// Err says why the manifest failed its checks (wrapping
	// ErrCorrupt and tier.ErrCorrupt); Manifest then holds what
	// decoded: its ID always, LenRec and Lens when its header did.
	Err error
}

// Loaded is what Load read.
type Loaded struct {
	// NextID is the next sequence id recorded (0 for none).
	NextID uint64
	// Manifests are by increasing id.
	Manifests []ManifestRecord
	// SlotCRC is the payload checksum of each slot whose record passed
	// its check; BadSlots why the others failed (wrapping ErrCorrupt
	// and tier.ErrCorrupt).
	SlotCRC  map[int32]uint32
	BadSlots map[int32]error
	// Summaries are the page summaries recorded with a slot (see
	// ManifestBatch.Summaries), of the slots whose summary record
	// passed its check and describes the payload SlotCRC names (a
	// record of an older payload of the slot is not returned);
	// BadSummaries why the others failed their check (wrapping
	// ErrCorrupt and tier.ErrCorrupt). Both are nil when empty: a
	// directory written before summary records holds none.
	Summaries    map[int32][]byte
	BadSummaries map[int32]error
}

// ManifestBatch is one Commit: it records SlotCRC (with, for the slots
// in Summaries, their summary record: the bytes and the payload
// checksum they describe; a slot of SlotCRC without one loses any
// summary record it had), replaces the
// manifests of Put, deletes those of Delete, then (when RetainSlots is
// not nil) deletes every slot and summary record whose slot is not in
// RetainSlots,
// and records NextID when it is not 0. Commit reads the batch only, but
// may keep the Slots of Put (to rewrite only what the next commit of
// the same manifest changes): the caller does not change them after.
type ManifestBatch struct {
	SlotCRC map[int32]uint32
	// Summaries: a slot's summary bytes (opaque here), recorded only
	// with the slot's SlotCRC of the same batch (an entry without one
	// is ignored). Commit reads them only.
	Summaries   map[int32][]byte
	Put         []Manifest
	Delete      []uint64
	RetainSlots map[int32]bool
	NextID      uint64
}
