package pagestore

import (
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// Config describes one store. Every pool array is allocated by [New].
type Config struct {
	// Layers is the number of transformer layers (default 32).
	Layers int
	// Geometry is the geometry of the shard this store partitions: its
	// share of the heads (KVHeads is the KV heads held by this partition,
	// the model's KVHeads / TP; default 8, and QHeads the query heads the
	// shard serves, default 32, which the store itself does not use and
	// may be 0), HeadDim D (default 128), PageSize S, the number of token
	// slots of a page (default 16, the Quest default; any value >= 1 is
	// accepted, a power of two is not required), and DType: [New] holds
	// plan.Float32 (the zero value) or plan.FP8 (K and V as E4M3 codes
	// with a float32 scale per page, layer and KV head, summaries float32
	// over the dequantized keys; see the package doc, "FP8"), a device's
	// pools ([NewWithData], [NewWithSlots]) the 16-bit types too.
	plan.Geometry
	// Capacity is the pool size in physical pages (default 256). A page holds
	// PageSize tokens of every layer; see [Config.PoolBytes].
	Capacity int
	// MemoryLimit bounds the bytes [New] may allocate for the pools: a
	// byte count, 0 (the default: the memory available on the machine when
	// New runs) or -1 (no check). A configuration over it fails with an
	// error wrapping [memlimit.ErrTooLarge] before anything is allocated.
	MemoryLimit int64

	// DeviceBudget is the number of pages whose K and V the pool arrays
	// hold (the device pool), in [0, Capacity]. 0 (the default) turns
	// offload off: the pool arrays hold every page's K/V, indexed by
	// physical page id, as without this field. Above 0 the K/V pool
	// arrays have DeviceBudget slots and the K/V of the other pages live
	// in Tier; summaries always stay in the pool for every page (see the
	// package doc, "Offload").
	DeviceBudget int
	// Tier holds the K/V payloads of pages outside the device pool when
	// DeviceBudget > 0: page p in slot p, so it needs at least Capacity
	// slots of tier.PagePayloadBytes(Layers, Geometry) bytes. nil (the
	// default): a tier.Memory made by [New] and closed by [Store.Close].
	// The store never closes a Tier it is given.
	Tier tier.Tier
	// Eviction is the eviction policy of the device pool (default
	// EvictLRU).
	Eviction Eviction
	// ScoreDecay is the decay per step recall of EvictScore's use counts,
	// in (0, 1) (0: the default 0.9, a half-life of about 6.6 recalls).
	ScoreDecay float64
	// PinFirst and PinLast are the pages of every sequence that eviction
	// never takes: its first PinFirst and last PinLast pages (PinLast 0
	// means 1: the tail page, which appends write, is always pinned). A
	// shard sets them to its policy's sink and local pages.
	PinFirst, PinLast int

	// DataDir, when set, makes the store persistent: sealed pages' K/V
	// are written to slab slots of a disk tier in this directory, and the
	// sequence manifests, page -> slot map and checksums to a bbolt file
	// next to it; [New] recovers the sequences found there (see
	// [Store.Recovery] and the package doc, "Persistence"). One store per
	// directory: a second open fails with [ErrInUse]. "" (the default):
	// nothing is written to disk.
	DataDir string
	// Durability is when a persisting store's changes become durable
	// (default SyncOnWrite); unused without DataDir.
	Durability Durability
	// SyncInterval is the flush period of SyncPeriodic (0: the default
	// DefaultSyncInterval); unused otherwise.
	SyncInterval time.Duration
	// OnPersistError, when set, is called with every failed operation on
	// a file of DataDir (an *IOError: its Path and Err name the file,
	// for a log; its message does not), once per failure, including
	// those no caller sees: the periodic flusher's, a Close's (Closing
	// set) and the lengths file's (reported once until a write of it
	// succeeds again). It runs on the goroutine that met the failure,
	// possibly with the store's locks held: it must return quickly and
	// must not call the store. nil (the default): errors are only
	// returned.
	OnPersistError func(*IOError)
	// Verify is when a persisting store reads and checks the page
	// payloads it recovers: VerifyAtOpen (the default) in [New],
	// VerifyOnRead at each page's first use and by a background scrub
	// (New then reads metadata and the persisted summaries only). Unused
	// without DataDir.
	Verify Verify
	// ScrubRate bounds the bytes per second the background scrub of
	// VerifyOnRead reads (0: the default DefaultScrubRate; negative: no
	// scrub, pages are checked at first use only). Unused otherwise.
	ScrubRate int64

	// SubBoxes > 1 keeps, besides the page summary, SubBoxes contiguous
	// sub-box summaries per page, layer and KV head, each the min/max
	// box of PageSize/SubBoxes token slots (plan.Policy.SubBoxes, issue
	// 32): [LayerData.Sub]. It must divide PageSize, and only [New]'s
	// float32 host pools keep them: fp8 K/V, offload (DeviceBudget),
	// persistence (DataDir) and outside page data ([NewWithData],
	// [NewWithSlots]) refuse it. 0 (the default) and 1: off.
	SubBoxes int
}

// metaMmapBytes is the map of store.db opened for c: with VerifyOnRead
// room for a summary record (three bbolt pages per 8 KiB record) and a
// slot record for every one of the 2 x Capacity slots the slabs may
// hold, plus 1 MiB, at most 1 GiB, so that commits do not remap the
// file as it grows (measured: remaps took a fifth of a 1,024-page
// append and sync's CPU); 0 (bbolt's default) otherwise, the file
// staying small.
func (c Config) metaMmapBytes() int {
	if c.Verify != VerifyOnRead {
		return 0
	}
	sum := int64(c.Layers) * int64(c.KVHeads) * int64(c.HeadDim) * 2 * 4
	per := (sum+4095)/4096*4096 + 4096 + 128
	return int(min(2*int64(c.Capacity)*per+1<<20, 1<<30))
}

func (c Config) scrubRate() int64 {
	if c.ScrubRate == 0 {
		return DefaultScrubRate
	}
	return c.ScrubRate
}

func (c Config) syncInterval() time.Duration {
	if c.SyncInterval == 0 {
		return DefaultSyncInterval
	}
	return c.SyncInterval
}

// DefaultScoreDecay is the default [Config.ScoreDecay].
const DefaultScoreDecay = 0.9

// Offload reports whether c keeps some pages' K/V outside the pool
// arrays (DeviceBudget > 0).
func (c Config) Offload() bool { return c.DeviceBudget > 0 }

// slots is the number of K/V slots of the pool arrays.
func (c Config) slots() int {
	if c.Offload() {
		return c.DeviceBudget
	}
	return c.Capacity
}

// PayloadBytes returns the bytes of one page's K/V over all layers: what
// an offloaded page takes in its tier.
func (c Config) PayloadBytes() int {
	return tier.PagePayloadBytes(c.Layers, c.Geometry)
}

func (c Config) scoreDecay() float64 {
	if c.ScoreDecay == 0 {
		return DefaultScoreDecay
	}
	return c.ScoreDecay
}

func (c Config) pinLast() int { return max(c.PinLast, 1) }

// DefaultConfig returns a Llama-3.1-8B shaped store (32 layers, 8 KV heads,
// D = 128) with S = 16 and 256 pages (4096 tokens): 1 GiB of K/V plus
// 64 MiB of summaries (1/S of K+V).
func DefaultConfig() Config {
	return Config{
		Layers:   32,
		Geometry: plan.Geometry{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16, DType: plan.Float32},
		Capacity: 256,
	}
}

// residencyBytesPerPage bounds the residency metadata of an offloading
// store per page: page and slot maps, pins, marks, the evictor's lists
// and counts, and the prefetch state.
const residencyBytesPerPage = 56

// HostBytes returns the bytes [New] allocates in host memory for c: the K/V
// and summary pools plus 8 bytes of metadata per page. With offload on it
// adds the residency metadata (56 bytes per page) and, when Tier is nil,
// the largest the store's own memory tier can grow to (a payload for every
// page).
func (c Config) HostBytes() (int64, error) {
	sz, err := c.sizes()
	if err != nil {
		return 0, err
	}
	n := memlimit.Add(int64(sz.kvBytes), int64(sz.sumBytes), memlimit.Mul(int64(c.Capacity), 8))
	if c.Offload() {
		n = memlimit.Add(n, memlimit.Mul(int64(c.Capacity), residencyBytesPerPage))
		if c.Tier == nil {
			n = memlimit.Add(n, memlimit.Mul(int64(c.Capacity), int64(c.PayloadBytes())))
		}
	}
	return n, nil
}

// Validate reports the first problem with c, or nil.
func (c Config) Validate() error {
	_, err := c.sizes()
	return err
}

// PoolBytes returns the bytes of K+V and of summaries that [New] allocates
// (both over all layers), or an error when c is invalid. With offload on
// the K+V bytes are those of the DeviceBudget slots. For plan.FP8 the K+V
// bytes are 1 per element plus 4 per (page, layer, K or V, KV head)
// scale.
func (c Config) PoolBytes() (kv, summary int, err error) {
	sz, err := c.sizes()
	if err != nil {
		return 0, 0, err
	}
	return sz.kvBytes, sz.sumBytes, nil
}

type sizes struct {
	layerKV  int // elements of K (or V) per layer
	layerRec int // fp8 only: (page, KV head) records (scales) of K (or V) per layer
	layerSum int // floats of summaries per layer
	layerSub int // floats of sub-box summaries per layer (SubBoxes > 1), else 0
	kvBytes  int // K+V bytes over all layers
	sumBytes int // summary bytes over all layers
}

func (c Config) sizes() (sizes, error) {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"Layers", c.Layers}, {"KVHeads", c.KVHeads}, {"HeadDim", c.HeadDim},
		{"PageSize", c.PageSize}, {"Capacity", c.Capacity},
	} {
		if f.v < 1 {
			return sizes{}, fmt.Errorf("%w: %s = %d, must be >= 1", ErrInvalidConfig, f.name, f.v)
		}
	}
	if c.MemoryLimit < memlimit.NoLimit {
		return sizes{}, fmt.Errorf("%w: MemoryLimit = %d, want a byte count, 0 (available memory) or -1 (no check)", ErrInvalidConfig, c.MemoryLimit)
	}
	switch c.DType {
	case plan.Float32, plan.Float16, plan.BFloat16:
		// New holds float32 (or FP8); a device's pools (NewWithData,
		// NewWithSlots) may hold the 16-bit types.
	case plan.FP8:
		// Offload moves the records as stored (residency.pack).
	default:
		return sizes{}, fmt.Errorf("%w: unknown dtype %v", ErrInvalidConfig, c.DType)
	}
	if c.SubBoxes < 0 || c.SubBoxes > c.PageSize || (c.SubBoxes > 1 && c.PageSize%c.SubBoxes != 0) {
		return sizes{}, fmt.Errorf("%w: SubBoxes = %d: want 0 or 1 (off) or a divisor of PageSize %d", ErrInvalidConfig, c.SubBoxes, c.PageSize)
	}
	if c.SubBoxes > 1 && (c.DType != plan.Float32 || c.Offload() || c.DataDir != "") {
		return sizes{}, fmt.Errorf("%w: SubBoxes = %d with dtype %v, DeviceBudget %d, DataDir %q: sub-box summaries are kept by float32 host pools without offload or persistence only",
			ErrInvalidConfig, c.SubBoxes, c.DType, c.DeviceBudget, c.DataDir)
	}
	if c.Capacity > math.MaxInt32 {
		return sizes{}, fmt.Errorf("%w: Capacity = %d exceeds the int32 page id range", ErrInvalidConfig, c.Capacity)
	}
	if err := c.checkOffload(); err != nil {
		return sizes{}, err
	}
	switch {
	case c.Durability < SyncOnWrite || c.Durability > SyncPeriodic:
		return sizes{}, fmt.Errorf("%w: unknown Durability %d", ErrInvalidConfig, int(c.Durability))
	case c.Verify < VerifyAtOpen || c.Verify > VerifyOnRead:
		return sizes{}, fmt.Errorf("%w: unknown Verify %d", ErrInvalidConfig, int(c.Verify))
	case c.SyncInterval < 0:
		return sizes{}, fmt.Errorf("%w: SyncInterval = %v must not be negative", ErrInvalidConfig, c.SyncInterval)
	case c.DataDir != "" && (c.PayloadBytes() <= 0 || 2*int64(c.Capacity) > math.MaxInt32):
		return sizes{}, fmt.Errorf("%w: DataDir with a page payload of %d bytes and %d pages: out of the disk tier's range", ErrInvalidConfig, c.PayloadBytes(), c.Capacity)
	}
	var sz sizes
	var ok bool
	if sz.layerKV, ok = mulInt(c.slots(), c.KVHeads, c.PageSize, c.HeadDim); !ok {
		return sizes{}, fmt.Errorf("%w: K/V pool of %d pages x %d heads x %d slots x %d dims overflows int", ErrInvalidConfig, c.Capacity, c.KVHeads, c.PageSize, c.HeadDim)
	}
	if sz.layerSum, ok = mulInt(c.Capacity, c.KVHeads, 2, c.HeadDim); !ok {
		return sizes{}, fmt.Errorf("%w: summary pool of %d pages x %d heads x 2 x %d dims overflows int", ErrInvalidConfig, c.Capacity, c.KVHeads, c.HeadDim)
	}
	if c.SubBoxes > 1 {
		if sz.layerSub, ok = mulInt(sz.layerSum, c.SubBoxes); !ok {
			return sizes{}, fmt.Errorf("%w: sub-box summary pool of %d boxes per page overflows int", ErrInvalidConfig, c.SubBoxes)
		}
	}
	elem := 4
	if c.DType == plan.FP8 {
		elem = 1 // plus the records' scales, below
		if sz.layerRec, ok = mulInt(c.slots(), c.KVHeads); !ok {
			return sizes{}, fmt.Errorf("%w: K/V scales of %d pages x %d heads overflow int", ErrInvalidConfig, c.Capacity, c.KVHeads)
		}
	}
	if sz.kvBytes, ok = mulInt(sz.layerKV, c.Layers, 2, elem); !ok {
		return sizes{}, fmt.Errorf("%w: K/V pool bytes over %d layers overflow int", ErrInvalidConfig, c.Layers)
	}
	if sz.layerRec > 0 {
		scales, ok := mulInt(sz.layerRec, c.Layers, 2, 4)
		if !ok || sz.kvBytes > math.MaxInt-scales {
			return sizes{}, fmt.Errorf("%w: K/V pool bytes over %d layers overflow int", ErrInvalidConfig, c.Layers)
		}
		sz.kvBytes += scales
	}
	if sz.sumBytes, ok = mulInt(sz.layerSum+sz.layerSub, c.Layers, 4); !ok {
		return sizes{}, fmt.Errorf("%w: summary pool bytes over %d layers overflow int", ErrInvalidConfig, c.Layers)
	}
	return sz, nil
}

// checkOffload validates the offload fields.
func (c Config) checkOffload() error {
	switch {
	case c.DeviceBudget < 0 || c.DeviceBudget > c.Capacity:
		return fmt.Errorf("%w: DeviceBudget = %d, want 0 (offload off) .. Capacity = %d", ErrInvalidConfig, c.DeviceBudget, c.Capacity)
	case c.PinFirst < 0 || c.PinLast < 0:
		return fmt.Errorf("%w: PinFirst = %d, PinLast = %d must not be negative", ErrInvalidConfig, c.PinFirst, c.PinLast)
	case c.Eviction < EvictLRU || c.Eviction > EvictScore:
		return fmt.Errorf("%w: unknown Eviction %d", ErrInvalidConfig, int(c.Eviction))
	case c.ScoreDecay != 0 && !(c.ScoreDecay > 0 && c.ScoreDecay < 1):
		return fmt.Errorf("%w: ScoreDecay = %v, want 0 (default %v) or a value in (0, 1)", ErrInvalidConfig, c.ScoreDecay, DefaultScoreDecay)
	}
	if !c.Offload() {
		if c.Tier != nil {
			return fmt.Errorf("%w: a Tier without a DeviceBudget (offload is off)", ErrInvalidConfig)
		}
		return nil
	}
	if _, ok := mulInt(c.Layers, 2, c.KVHeads, c.PageSize, c.HeadDim, 4); !ok || c.PayloadBytes() <= 0 {
		return fmt.Errorf("%w: the page payload of %d layers overflows", ErrInvalidConfig, c.Layers)
	}
	if c.Tier != nil {
		if c.Tier.Slots() < c.Capacity {
			return fmt.Errorf("%w: Tier has %d slots, the pool %d pages (page p lives in slot p)", ErrInvalidConfig, c.Tier.Slots(), c.Capacity)
		}
		if c.Tier.PayloadBytes() != c.PayloadBytes() {
			return fmt.Errorf("%w: Tier payloads are %d bytes, a page of %d layers is %d", ErrInvalidConfig, c.Tier.PayloadBytes(), c.Layers, c.PayloadBytes())
		}
	}
	return nil
}

// mulInt multiplies positive ints and reports whether the product fits in int.
func mulInt(xs ...int) (int, bool) {
	p := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(p, uint64(x))
		if hi != 0 || lo > math.MaxInt {
			return 0, false
		}
		p = lo
	}
	return int(p), true
}
