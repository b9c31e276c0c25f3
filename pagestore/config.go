package pagestore

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/questrt/questrt/internal/memlimit"
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
	// accepted, a power of two is not required), and DType, of which this
	// CPU store supports only plan.Float32 (the zero value).
	plan.Geometry
	// Capacity is the pool size in physical pages (default 256). A page holds
	// PageSize tokens of every layer; see [Config.PoolBytes].
	Capacity int
	// MemoryLimit bounds the bytes [New] may allocate for the pools: a
	// byte count, 0 (the default: the memory available on the machine when
	// New runs) or -1 (no check). A configuration over it fails with an
	// error wrapping [memlimit.ErrTooLarge] before anything is allocated.
	MemoryLimit int64
}

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

// HostBytes returns the bytes [New] allocates in host memory for c: the K/V
// and summary pools plus 8 bytes of metadata per page.
func (c Config) HostBytes() (int64, error) {
	sz, err := c.sizes()
	if err != nil {
		return 0, err
	}
	return memlimit.Add(int64(sz.kvBytes), int64(sz.sumBytes), memlimit.Mul(int64(c.Capacity), 8)), nil
}

// Validate reports the first problem with c, or nil.
func (c Config) Validate() error {
	_, err := c.sizes()
	return err
}

// PoolBytes returns the bytes of K+V and of summaries that [New] allocates
// (both over all layers), or an error when c is invalid.
func (c Config) PoolBytes() (kv, summary int, err error) {
	sz, err := c.sizes()
	if err != nil {
		return 0, 0, err
	}
	return sz.kvBytes, sz.sumBytes, nil
}

type sizes struct {
	layerKV  int // floats of K (or V) per layer
	layerSum int // floats of summaries per layer
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
	case plan.Float32:
	case plan.Float16, plan.BFloat16:
		return sizes{}, fmt.Errorf("%w: dtype %v is reserved for the GPU backend; the CPU page store holds float32 only", ErrInvalidConfig, c.DType)
	default:
		return sizes{}, fmt.Errorf("%w: unknown dtype %v", ErrInvalidConfig, c.DType)
	}
	if c.Capacity > math.MaxInt32 {
		return sizes{}, fmt.Errorf("%w: Capacity = %d exceeds the int32 page id range", ErrInvalidConfig, c.Capacity)
	}
	var sz sizes
	var ok bool
	if sz.layerKV, ok = mulInt(c.Capacity, c.KVHeads, c.PageSize, c.HeadDim); !ok {
		return sizes{}, fmt.Errorf("%w: K/V pool of %d pages x %d heads x %d slots x %d dims overflows int", ErrInvalidConfig, c.Capacity, c.KVHeads, c.PageSize, c.HeadDim)
	}
	if sz.layerSum, ok = mulInt(c.Capacity, c.KVHeads, 2, c.HeadDim); !ok {
		return sizes{}, fmt.Errorf("%w: summary pool of %d pages x %d heads x 2 x %d dims overflows int", ErrInvalidConfig, c.Capacity, c.KVHeads, c.HeadDim)
	}
	if sz.kvBytes, ok = mulInt(sz.layerKV, c.Layers, 2, 4); !ok {
		return sizes{}, fmt.Errorf("%w: K/V pool bytes over %d layers overflow int", ErrInvalidConfig, c.Layers)
	}
	if sz.sumBytes, ok = mulInt(sz.layerSum, c.Layers, 4); !ok {
		return sizes{}, fmt.Errorf("%w: summary pool bytes over %d layers overflow int", ErrInvalidConfig, c.Layers)
	}
	return sz, nil
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
