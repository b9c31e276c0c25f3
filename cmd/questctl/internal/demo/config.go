package demo

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/questrt/questrt/client"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// Config sizes the demo. DefaultConfig documents the defaults. Each field
// is the questctl demo flag of the same name (Context is --context,
// DenseLayers --dense-layers, MemoryLimit --max-memory, ...), and
// [Config.Validate]'s messages name the flags.
type Config struct {
	Context     int    // tokens of prefilled context (65536)
	Steps       int    // decode steps (24); the query turns from A to B halfway
	Layers      int    // layers (4)
	DenseLayers int    // leading dense layers (2; 0: none)
	QHeads      int    // query heads (32)
	KVHeads     int    // KV heads (8)
	HeadDim     int    // D (128)
	PageSize    int    // S (16)
	Budget      int    // token budget B per head (2048)
	Needles     int    // needle keys of entity B (4)
	Mentions    int    // keys of entity A (64)
	GQA         string // group_max or per_head
	Selector    string // quest, oracle, recent or dense
	Seed        uint64 // data seed (1; any value)
	Workers     int    // CPU kernel workers besides the caller (0: GOMAXPROCS-1)
	CP          int    // context-parallel shards (1)
	TP          int    // tensor-parallel shards (1); divides KVHeads
	Selection   string // CP selection: exact, union or replicated
	// MemoryLimit bounds the host memory the demo allocates (see
	// [Config.Memory]): bytes, memlimit.Auto (0, the default: the memory
	// available when Validate runs) or memlimit.NoLimit (-1: no check).
	MemoryLimit int64
	// Progress, when set, receives progress lines while the context is
	// built (the CLI passes stderr); results go to Run's writer.
	Progress io.Writer
	// Backend runs the kernels (nil: a CPU backend with Workers workers;
	// the caller keeps and closes a backend it gives).
	Backend kernels.Backend
	// DeviceResident keeps the pages and page tables in the backend's
	// device memory (engine.Config.DeviceResident).
	DeviceResident bool
	// SummaryWeight is the bytes of one (page, KV head) summary record
	// over the bytes of that page's K and V for the head, as the measured
	// rho counts them; 0 (the default) is 1/S, a record of the K/V type
	// (2D values against 2SD). fp8 summaries over float32 K/V weigh
	// (2D+4) / (8SD).
	SummaryWeight float64
	// Cluster, when set, runs the demo through a questd cluster (its
	// geometry and policy must be the demo's; Backend is then unused).
	// The coordinator's diagnostics read the keys back from the nodes.
	Cluster *client.Client
}

// Ranges of the flags that no other flag bounds. Beyond them the demo
// would run for hours or overflow its size arithmetic; the memory check
// refuses most large geometries well before.
const (
	MaxContext = 1 << 30 // tokens
	MaxSteps   = 100_000
	MaxLayers  = 1024
	MaxHeads   = 1024 // query heads (KV heads divide them)
	MaxHeadDim = 4096
	MaxWorkers = 256
	MaxCP      = 256
)

// prefillChunk is the tokens the prefill appends per call.
const prefillChunk = 4096

// DefaultConfig returns the defaults listed on Config.
func DefaultConfig() Config {
	return Config{Context: 65536, Steps: 24, Layers: 4, DenseLayers: 2, QHeads: 32, KVHeads: 8, HeadDim: 128,
		PageSize: 16, Budget: 2048, Needles: 4, Mentions: 64, GQA: "group_max", Selector: "quest", Seed: 1,
		CP: 1, TP: 1, Selection: "exact"}
}

// Validate reports whether the demo can run and measure something: every
// flag in its range, the needles and mentions inside the context, at
// least one sparse layer whose budget leaves pages out, and the memory
// [Config.Memory] computes within MemoryLimit. It allocates nothing. The
// error is one line that names the flag and what is allowed.
func (c Config) Validate() error {
	for _, f := range []struct {
		name   string
		v      int
		lo, hi int
		note   string
	}{
		{"context", c.Context, 1, MaxContext, " tokens"},
		{"steps", c.Steps, 1, MaxSteps, ""},
		{"layers", c.Layers, 1, MaxLayers, ""},
		{"q-heads", c.QHeads, 1, MaxHeads, ""},
		{"kv-heads", c.KVHeads, 1, MaxHeads, ""},
		{"head-dim", c.HeadDim, 1, MaxHeadDim, ""},
		{"page-size", c.PageSize, 1, MaxContext, " tokens"},
		{"budget", c.Budget, 1, MaxContext, " tokens"},
		{"needles", c.Needles, 1, MaxContext, ""},
		{"mentions", c.Mentions, 1, MaxContext, ""},
		{"workers", c.Workers, 0, MaxWorkers, " (0: GOMAXPROCS-1)"},
		{"cp", c.CP, 1, MaxCP, ""},
		{"tp", c.TP, 1, MaxHeads, ""},
	} {
		if f.v < f.lo || f.v > f.hi {
			return fmt.Errorf("--%s %d: want %d..%d%s", f.name, f.v, f.lo, f.hi, f.note)
		}
	}
	if _, err := plan.ParseGQAMode(c.GQA); err != nil {
		return fmt.Errorf("--gqa: %w", err)
	}
	sel, err := plan.ParseSelector(c.Selector)
	if err != nil {
		return fmt.Errorf("--selector: %w", err)
	}
	selection, err := engine.ParseSelection(c.Selection)
	if err != nil {
		return fmt.Errorf("--selection: %w", err)
	}
	if selection == engine.Replicated && sel != plan.Quest && sel != plan.Dense {
		return fmt.Errorf("--selection replicated needs --selector quest or dense, not %s", sel)
	}
	if c.QHeads%c.KVHeads != 0 {
		return fmt.Errorf("--q-heads %d: want a multiple of --kv-heads %d", c.QHeads, c.KVHeads)
	}
	if c.KVHeads%c.TP != 0 {
		return fmt.Errorf("--tp %d: want a divisor of --kv-heads %d (each tensor-parallel shard holds whole KV heads)", c.TP, c.KVHeads)
	}
	if c.DenseLayers < 0 || c.DenseLayers >= c.Layers {
		return fmt.Errorf("--dense-layers %d: want 0..%d (0: none; at least one of the --layers %d must be sparse to measure Quest)",
			c.DenseLayers, c.Layers-1, c.Layers)
	}
	if err := c.fits(); err != nil {
		return err
	}
	if pages := (c.Context + c.PageSize - 1) / c.PageSize; c.CP > pages {
		return fmt.Errorf("--cp %d: want 1..%d (at most one shard per page of the %d-page context)", c.CP, min(pages, MaxCP), pages)
	}
	if c.MemoryLimit < memlimit.NoLimit {
		return fmt.Errorf("--max-memory %d: want bytes, 0 (the memory available) or -1 (no check)", c.MemoryLimit)
	}
	m, err := c.Memory()
	if err != nil {
		return err
	}
	what := fmt.Sprintf("pools %s, synthetic data %s and scratch %s for a %d-token context over %d layers",
		memlimit.Bytes(m.Pools), memlimit.Bytes(m.Data), memlimit.Bytes(m.Scratch), c.Context, c.Layers)
	if err := memlimit.Check(what, m.Total(), c.MemoryLimit); err != nil {
		if errors.Is(err, memlimit.ErrTooLarge) {
			return fmt.Errorf("%w (see --max-memory)", err)
		}
		return err
	}
	return nil
}

// fits checks that the synthetic context holds the needles and mentions
// and that the budget leaves pages out (the constraints between --context,
// --page-size, --budget, --needles and --mentions).
func (c Config) fits() error {
	ctx, s := int64(c.Context), int64(c.PageSize)
	// Each needle takes its own page in the first quarter, and one page
	// of the quarter stays free: context >= 4 (needles+1) S.
	if need := memlimit.Mul(4, int64(c.Needles)+1, s); need < 0 || need > ctx {
		var want []string
		if n := ctx/4/s - 1; n >= 1 {
			want = append(want, fmt.Sprintf("--needles 1..%d", n))
		}
		if ps := ctx / (4 * (int64(c.Needles) + 1)); ps >= 1 {
			want = append(want, fmt.Sprintf("--page-size 1..%d", ps))
		}
		if need > 0 && need <= MaxContext {
			want = append(want, fmt.Sprintf("--context %d..%d", need, MaxContext))
		}
		if len(want) == 0 {
			want = append(want, "fewer --needles or a smaller --page-size")
		}
		return fmt.Errorf("--needles %d at --page-size %d do not fit the --context %d: each needle takes its own page in the first quarter of the context (context >= 4 x (needles+1) x page size); want %s",
			c.Needles, c.PageSize, c.Context, strings.Join(want, ", or "))
	}
	// At most one mention of A per page.
	if maxM := ctx / s; int64(c.Mentions) > maxM {
		return fmt.Errorf("--mentions %d: want 1..%d (at most one per --page-size %d page of the --context %d)", c.Mentions, maxM, c.PageSize, c.Context)
	}
	// A budget of at least one page and below the context: K < P at every
	// step, so every sparse layer leaves pages out.
	if c.Budget < c.PageSize || c.Budget >= c.Context {
		return fmt.Errorf("--budget %d: want %d..%d tokens (at least one --page-size %d page, and below the --context %d: a budget covering the context makes every layer dense)",
			c.Budget, c.PageSize, c.Context-1, c.PageSize, c.Context)
	}
	return nil
}

// Memory is the host memory the demo allocates, by part.
type Memory struct {
	// Pools: the page pools of every CP x TP shard (K, V, summaries and
	// page metadata; only the metadata with DeviceResident), and the
	// summary mirrors of replicated selection.
	Pools int64
	// Data: the synthetic data (prefill chunks and the engine's per-shard
	// copies of them, entity directions, queries and new tokens).
	Data int64
	// Scratch: one step's diagnostics and step buffers (selected pages
	// and scores per query head, page tables, dense reference outputs,
	// and the key chunks read back from DeviceResident shards).
	Scratch int64
}

// Total is the sum of the parts, or -1 when it overflows.
func (m Memory) Total() int64 { return memlimit.Add(m.Pools, m.Data, m.Scratch) }

func (m Memory) String() string {
	return fmt.Sprintf("pools %s, synthetic data %s, step and diagnostics scratch %s",
		memlimit.Bytes(m.Pools), memlimit.Bytes(m.Data), memlimit.Bytes(m.Scratch))
}

// capacityPages is the page pool of every shard: the whole sequence
// (context and decoded tokens, plus one page of slack) over CP ranks.
func (c Config) capacityPages() int {
	pages := (c.Context+c.Steps+c.PageSize-1)/c.PageSize + 1
	return (pages+c.CP-1)/c.CP + 2
}

// Memory computes the host bytes Run allocates for c from its geometry
// alone (nothing is allocated). The pools are the engine's own count
// (engine.New's preflight); Data and Scratch are upper bounds. A size
// that overflows is -1, which memlimit.Check refuses.
func (c Config) Memory() (Memory, error) {
	var m Memory
	selection, err := engine.ParseSelection(c.Selection)
	if err != nil {
		return m, err
	}
	capPages := int64(c.capacityPages())
	rank := c.geometry().Split(max(c.TP, 1))
	kvT := int64(rank.KVHeads)
	st := pagestore.Config{Layers: c.Layers, Geometry: rank, Capacity: int(capPages)}
	per, err := st.HostBytes()
	if err != nil {
		return m, fmt.Errorf("demo: %w", err)
	}
	if c.DeviceResident {
		per = memlimit.Mul(capPages, 8) // page metadata only
	}
	shards := int64(c.CP) * int64(c.TP)
	m.Pools = memlimit.Mul(per, shards)
	if selection == engine.Replicated {
		mirror := memlimit.Mul(int64(c.Layers), kvT, 2, int64(c.HeadDim), 4, capPages, int64(c.CP))
		m.Pools = memlimit.Add(m.Pools, memlimit.Mul(mirror, shards))
	}
	tok := memlimit.Mul(int64(c.KVHeads), int64(c.HeadDim)) // floats of one token's K (or V)
	chunk := int64(min(prefillChunk, c.Context))
	m.Data = memlimit.Add(
		memlimit.Mul(2, chunk, tok, 4),                       // the prefill's K and V chunk
		memlimit.Mul(2, chunk, tok, 4),                       // the engine's per-shard copy of a chunk
		memlimit.Mul(2, int64(c.Layers), tok, 4),             // entity directions A and B
		memlimit.Mul(int64(c.Needles)+int64(c.Mentions), 64), // entity positions
		memlimit.Mul(int64(c.QHeads), int64(c.HeadDim), 4),   // a query
		memlimit.Mul(2, tok, 4),                              // a new token
	)
	// Per step: Selected and Scores for every query head over all pages
	// (an upper bound: sparse layers select K pages), each shard's page
	// table and score rows, three results, and the dense reference.
	pages := capPages * int64(c.CP)
	m.Scratch = memlimit.Add(
		memlimit.Mul(int64(c.QHeads), pages, 4+4),
		memlimit.Mul(pages, 4+4+1, int64(c.TP)),
		memlimit.Mul(int64(c.QHeads), pages, 4), // score rows (per_head: one per query head)
		memlimit.Mul(4, int64(c.QHeads), int64(c.HeadDim)+1, 4),
	)
	if c.DeviceResident {
		// Every shard's key reader holds one chunk, read back with its
		// values and summaries.
		m.Scratch = memlimit.Add(m.Scratch, memlimit.Mul(shards, 2*shard.KeyChunkBytes+shard.KeyChunkBytes/4))
	}
	return m, nil
}

// geometry is the demo's attention geometry (float32 storage).
func (c Config) geometry() plan.Geometry {
	return plan.Geometry{QHeads: c.QHeads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize, DType: plan.Float32}
}

// engineConfig is the engine Run builds for c (c valid).
// Engine is the engine configuration the demo runs (no backend: the
// caller's or a CPU one), for a cluster's nodes to match.
func (c Config) Engine() engine.Config { return c.engineConfig(nil) }

func (c Config) engineConfig(be kernels.Backend) engine.Config {
	mode, _ := plan.ParseGQAMode(c.GQA)
	sel, _ := plan.ParseSelector(c.Selector)
	selection, _ := engine.ParseSelection(c.Selection)
	ec := engine.DefaultConfig()
	ec.Layers, ec.Geometry = c.Layers, c.geometry()
	ec.CP, ec.TP, ec.Selection, ec.Backend = c.CP, c.TP, selection, be
	ec.CapacityPages = c.capacityPages()
	ec.Policy.PageSize, ec.Policy.BudgetTokens, ec.Policy.DenseLayers, ec.Policy.GQA, ec.Policy.Selector = c.PageSize, c.Budget, c.DenseLayers, mode, sel
	ec.DeviceResident = c.DeviceResident
	// Validate checked the pools together with the demo's other memory.
	ec.MemoryLimit = memlimit.NoLimit
	return ec
}
