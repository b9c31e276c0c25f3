package disktier

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// Sentinel errors of the disk tier (besides those of package tier).
var (
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("disktier: invalid config")
	// ErrInUse: the directory is open in another Tier, in this process or
	// another one (its index is locked).
	ErrInUse = errors.New("disktier: directory in use")
	// ErrMismatch: the directory was created with another payload size,
	// slot alignment or slots per file, or holds slots beyond
	// Config.Slots.
	ErrMismatch = errors.New("disktier: directory does not match config")
)

// Durability says when Writes and Frees become durable; see the package
// documentation for what a crash loses in each mode.
type Durability int

const (
	// SyncOnWrite makes every Write and Free durable before it returns
	// (the zero value and the default).
	SyncOnWrite Durability = iota
	// SyncPeriodic makes them durable at the next flush, every
	// Config.SyncInterval, or at Sync or Close.
	SyncPeriodic
	// SyncNone makes them durable at Sync or Close only.
	SyncNone
)

// String returns "sync-on-write", "periodic" or "none".
func (d Durability) String() string {
	switch d {
	case SyncOnWrite:
		return "sync-on-write"
	case SyncPeriodic:
		return "periodic"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("Durability(%d)", int(d))
}

// Config describes one disk tier.
type Config struct {
	// Dir is the tier's directory, created (0700) if absent. Required.
	Dir string
	// Slots is the number of slots (default 4096: 8 GiB of 2 MiB pages).
	// A directory may be reopened with another count, as long as every
	// slot it holds is below it.
	Slots int
	// PayloadBytes is the size of a payload, fixed for the directory's
	// life (default 2 MiB: a Llama-3.1-8B page, see
	// tier.PagePayloadBytes). At most 1<<31-1.
	PayloadBytes int
	// SlotsPerFile is the number of slots of one slab file, fixed for the
	// directory's life (default 512: 1 GiB files at 2 MiB).
	SlotsPerFile int
	// SlotAlign rounds each slot's size up to a multiple of it, fixed for
	// the directory's life (default 4096, the usual file system block; 1
	// packs slots back to back). A power of two up to 1 MiB.
	SlotAlign int
	// Durability is when Writes and Frees become durable (default
	// SyncOnWrite).
	Durability Durability
	// SyncInterval is the flush period of SyncPeriodic (default 1 s;
	// unused by the other modes).
	SyncInterval time.Duration
	// Preallocate reserves each slab file's blocks (fallocate on Linux)
	// when it is created, so a full disk fails the Write that creates the
	// file rather than a later one. Without it slab files are sparse.
	// Elsewhere than Linux the file is only extended.
	Preallocate bool
	// LockTimeout is how long Open waits for the directory's lock before
	// it fails with ErrInUse (default 100 ms; must be positive: a tier
	// never waits indefinitely for another owner).
	LockTimeout time.Duration
}

// DefaultConfig returns the defaults above; set Dir before use.
func DefaultConfig() Config {
	return Config{
		Slots: 4096,
		PayloadBytes: tier.PagePayloadBytes(32, plan.Geometry{
			QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16, DType: plan.BFloat16}),
		SlotsPerFile: 512,
		SlotAlign:    4096,
		Durability:   SyncOnWrite,
		SyncInterval: time.Second,
		LockTimeout:  100 * time.Millisecond,
	}
}

// SlotBytes returns the bytes a slot takes in its slab file: PayloadBytes
// rounded up to SlotAlign.
func (c Config) SlotBytes() int64 {
	a := int64(max(c.SlotAlign, 1))
	return (int64(c.PayloadBytes) + a - 1) / a * a
}

// Validate reports the first problem with c, or nil; the error wraps
// ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("disktier: config (dir %q): %s: %w", c.Dir, fmt.Sprintf(format, args...), ErrInvalidConfig)
	}
	switch {
	case c.Dir == "":
		return bad("Dir is empty")
	case c.Slots < 1 || c.Slots > math.MaxInt32:
		return bad("Slots %d not in [1, %d]", c.Slots, math.MaxInt32)
	case c.PayloadBytes < 1 || c.PayloadBytes > math.MaxInt32:
		return bad("PayloadBytes %d not in [1, %d]", c.PayloadBytes, math.MaxInt32)
	case c.SlotsPerFile < 1 || c.SlotsPerFile > math.MaxInt32:
		return bad("SlotsPerFile %d not in [1, %d]", c.SlotsPerFile, math.MaxInt32)
	case c.SlotAlign < 1 || c.SlotAlign > 1<<20 || c.SlotAlign&(c.SlotAlign-1) != 0:
		return bad("SlotAlign %d is not a power of two in [1, 1 MiB]", c.SlotAlign)
	case c.Durability < SyncOnWrite || c.Durability > SyncNone:
		return bad("unknown Durability %d", int(c.Durability))
	case c.Durability == SyncPeriodic && c.SyncInterval <= 0:
		return bad("SyncInterval %v must be positive with SyncPeriodic", c.SyncInterval)
	case c.LockTimeout <= 0:
		return bad("LockTimeout %v must be positive", c.LockTimeout)
	}
	return nil
}
