package pagestore

import "errors"

// Sentinel errors. Every error returned by the store wraps one of them with
// context (sequence, layer, sizes); test with errors.Is.
var (
	// ErrInvalidConfig: a Config field is out of range or unsupported.
	ErrInvalidConfig = errors.New("pagestore: invalid config")
	// ErrPoolExhausted: not enough free pages for an append or a
	// copy-on-write; the sequence is unchanged.
	ErrPoolExhausted = errors.New("pagestore: page pool exhausted")
	// ErrUnknownSequence: no live sequence has this id.
	ErrUnknownSequence = errors.New("pagestore: unknown sequence")
	// ErrUnevenLayers: Fork or Rollback on a sequence whose layers have
	// different lengths (a step is half-appended).
	ErrUnevenLayers = errors.New("pagestore: layers have different lengths")
	// ErrLayerOutOfRange: a layer index outside [0, Layers).
	ErrLayerOutOfRange = errors.New("pagestore: layer out of range")
	// ErrBadShape: a K/V slice whose length is not a positive multiple of
	// KVHeads*HeadDim, or k and v of different lengths.
	ErrBadShape = errors.New("pagestore: bad K/V shape")
	// ErrNonFinite: a NaN or an infinity in an appended key or value.
	ErrNonFinite = errors.New("pagestore: non-finite K/V element")
	// ErrOutOfRange: a count outside its valid range (rollback of n <= 0
	// tokens or past the start of the sequence).
	ErrOutOfRange = errors.New("pagestore: out of range")
	// ErrData: the store's [PageData] failed (a device fault, say); see
	// [Store.Append] and [Store.Rollback] for what then changed.
	ErrData = errors.New("pagestore: page data")
	// ErrDeviceFull: an offloading store (see [Config.DeviceBudget])
	// cannot bring the pages an operation needs into the device pool:
	// every other slot is held by pinned pages or by pages the same
	// operation needs.
	ErrDeviceFull = errors.New("pagestore: device budget exhausted")
	// ErrPersist: a persisting store ([Config.DataDir]) could not write
	// or read its data directory. An operation returning it took effect
	// in memory; what is durable is what the last successful commit
	// wrote (see the package doc, "Persistence").
	ErrPersist = errors.New("pagestore: persistence")
	// ErrInUse: the data directory is open in another store, in this
	// process or another.
	ErrInUse = errors.New("pagestore: data directory in use")
	// ErrOtherFormat: the data directory's format record (its geometry,
	// or a page of its index outside the configured slots) does not
	// match the config. It comes with ErrInvalidConfig: the directory
	// was made for another config, or the record is damaged; a caller
	// that derives the directory's name from the config (worker/remote)
	// knows it is damage and treats it as tier.ErrCorrupt.
	ErrOtherFormat = errors.New("pagestore: data directory of another format")
	// ErrDamaged: a recovered sequence's persisted page failed its check
	// when first read ([VerifyOnRead]: its payload's checksum, or its
	// persisted summaries against the keys). The sequence was released
	// (its manifest deleted, as recovery does with a damaged sequence)
	// and every later operation on its id returns ErrDamaged too; the
	// error also wraps tier.ErrCorrupt. Other sequences are unaffected
	// unless they share the bad page. See [Store.Scrub].
	ErrDamaged = errors.New("pagestore: sequence damaged")
)
