package offload

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// Config is one run of the benchmark: every (context, budget, workload)
// against every (device budget, prefetch) setting. The fields' ranges are
// those of the flags of questctl bench offload that set them, which
// Validate's errors name.
type Config struct {
	// Contexts, Budgets: sequence lengths and token budgets in tokens.
	Contexts, Budgets []int
	// DevicePct: device budgets, percent of the sequence's pages (1..100).
	DevicePct []int
	// Prefetch: pages per selection row below the top-K (0: off).
	Prefetch []int
	// Workloads: "slow" (a slowly drifting query) or "random".
	Workloads                          []string
	PageSize, QHeads, KVHeads, HeadDim int
	// Steps timed after Warmup untimed ones, per configuration.
	Steps, Warmup int
	Eviction      pagestore.Eviction
	// Tier is where offloaded pages live: "memory", "disk" or
	// "host+disk"; TierDir the directory of the temporary tier directory
	// ("": the system's).
	Tier, TierDir string
	// HostBudget is, with Tier "host+disk", the percent of the pages in
	// host memory; HostBudgetSet says it was asked for (an error with
	// another tier).
	HostBudget    int
	HostBudgetSet bool
	// Backend is "cpu" or "cuda"; DType the storage type of the cuda one.
	Backend, DType string
	// MemoryLimit is the preflight's limit (memlimit: 0 the memory
	// available now, -1 none).
	MemoryLimit int64
	// Seed makes the keys, values and queries.
	Seed uint64
}

// DefaultConfig returns the settings of questctl bench offload without
// flags: the attention benchmark's head shape, 65,536 tokens, budget
// 2048, device budgets 100, 50, 20, 10 and 5 percent, prefetch 0 and 32,
// both workloads, 16 warm-up and 32 timed steps, LRU eviction and the
// memory tier on the CPU backend.
func DefaultConfig() Config {
	a := bench.DefaultAttentionConfig()
	return Config{
		Contexts: []int{65536}, Budgets: []int{2048}, DevicePct: []int{100, 50, 20, 10, 5}, Prefetch: []int{0, 32},
		Workloads: []string{"slow", "random"},
		PageSize:  a.PageSize, QHeads: a.QHeads, KVHeads: a.KVHeads, HeadDim: a.HeadDim,
		Steps: 32, Warmup: 16, Eviction: pagestore.EvictLRU, Tier: "memory", HostBudget: 50, Backend: "cpu", Seed: 1,
	}
}

// Validate reports the first setting outside its range, naming the flag
// of questctl bench offload that sets it, then a --kv-cache-dtype that
// does not parse (--backend cuda) or a largest context whose page store
// overflows (--backend cpu).
func (c Config) Validate() error {
	for _, l := range []struct {
		flag string
		n    int
	}{{"--context", len(c.Contexts)}, {"--budget", len(c.Budgets)}, {"--device-budget", len(c.DevicePct)}, {"--prefetch", len(c.Prefetch)}, {"--workload", len(c.Workloads)}} {
		if l.n == 0 {
			return fmt.Errorf("%s: no values", l.flag)
		}
	}
	for _, f := range []struct {
		flag  string
		v, hi int
	}{
		{"--page-size", c.PageSize, bench.MaxPageSize}, {"--q-heads", c.QHeads, bench.MaxHeads},
		{"--kv-heads", c.KVHeads, bench.MaxHeads}, {"--head-dim", c.HeadDim, bench.MaxHeadDim},
		{"--steps", c.Steps, bench.MaxIters},
	} {
		if f.v < 1 || f.v > f.hi {
			return fmt.Errorf("%s %d: want 1..%d", f.flag, f.v, f.hi)
		}
	}
	if c.QHeads%c.KVHeads != 0 {
		return fmt.Errorf("--q-heads %d is not a multiple of --kv-heads %d", c.QHeads, c.KVHeads)
	}
	if c.Warmup < 0 || c.Warmup > bench.MaxIters {
		return fmt.Errorf("--warmup %d: want 0..%d", c.Warmup, bench.MaxIters)
	}
	minPages := math.MaxInt
	for _, n := range c.Contexts {
		if n < 1 || n > bench.MaxContext {
			return fmt.Errorf("--context %d: want 1..%d tokens", n, bench.MaxContext)
		}
		minPages = min(minPages, (n+c.PageSize-1)/c.PageSize)
	}
	for _, b := range c.Budgets {
		if b < c.PageSize || b > bench.MaxContext {
			return fmt.Errorf("--budget %d: want --page-size (%d)..%d tokens", b, c.PageSize, bench.MaxContext)
		}
	}
	for _, p := range c.DevicePct {
		if p < 1 || p > 100 {
			return fmt.Errorf("--device-budget %d: want 1..100 percent of the sequence's pages", p)
		}
	}
	for _, p := range c.Prefetch {
		if p < 0 || p > minPages {
			return fmt.Errorf("--prefetch %d: want 0..%d pages (the shortest context's pages)", p, minPages)
		}
	}
	switch c.Tier {
	case "memory", "disk", "host+disk":
	default:
		return fmt.Errorf("--tier %q: want memory, disk or host+disk", c.Tier)
	}
	if c.Tier == "host+disk" {
		if c.HostBudget < 1 || c.HostBudget > 100 {
			return fmt.Errorf("--host-budget %d: want 1..100 percent of the sequence's pages", c.HostBudget)
		}
	} else if c.HostBudgetSet {
		return fmt.Errorf("--host-budget needs --tier host+disk (not --tier %s)", c.Tier)
	}
	switch c.Tier {
	case "memory":
		if c.TierDir != "" {
			return errors.New("--tier-dir needs --tier disk or host+disk")
		}
	case "disk", "host+disk":
		if c.TierDir != "" {
			if fi, err := os.Stat(c.TierDir); err != nil || !fi.IsDir() {
				return fmt.Errorf("--tier-dir %q: not a directory", c.TierDir)
			}
		}
	}
	if c.MemoryLimit < memlimit.NoLimit {
		return fmt.Errorf("--max-memory %d: want a byte count, 0 (the memory available now) or -1 (no check)", c.MemoryLimit)
	}
	for _, w := range c.Workloads {
		if w != "slow" && w != "random" {
			return fmt.Errorf("--workload: unknown workload %q (want slow or random)", w)
		}
	}
	if c.Backend != "cpu" && c.Backend != "cuda" {
		return fmt.Errorf("--backend %q: want cpu or cuda", c.Backend)
	}
	return c.checkSizes()
}

// geometry is the shard's head geometry.
func (c Config) geometry() plan.Geometry {
	return plan.Geometry{QHeads: c.QHeads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize}
}

// storeConfig is the page store of a sequence of n tokens, with device
// budget pct percent of its pages (0: offload off).
func (c Config) storeConfig(n, pct int) pagestore.Config {
	pages := (n + c.PageSize - 1) / c.PageSize
	sc := pagestore.Config{Layers: 1, Geometry: c.geometry(), Capacity: pages, MemoryLimit: memlimit.NoLimit, Eviction: c.Eviction}
	if pct > 0 {
		sc.DeviceBudget = min(pages, max(2, (pct*pages+50)/100))
	}
	return sc
}

// hostPages is the host budget of --tier host+disk for a sequence of
// pages pages: c.HostBudget percent of them, at least 1.
func (c Config) hostPages(pages int) int {
	return min(pages, max(1, (c.HostBudget*pages+50)/100))
}

// checkSizes is the end of Validate: the checks of the sizes Preflight
// needs.
func (c Config) checkSizes() error {
	n := slices.Max(c.Contexts)
	if c.Backend == "cuda" {
		_, err := plan.ParseDType(c.DType)
		return err
	}
	if _, err := c.storeConfig(n, 0).HostBytes(); err != nil {
		return fmt.Errorf("--context %d: %w", n, err)
	}
	if _, err := c.storeConfig(n, slices.Max(c.DevicePct)).HostBytes(); err != nil {
		return fmt.Errorf("--context %d: %w", n, err)
	}
	return nil
}

// Preflight checks that the largest context's all-resident shard, its
// largest offloading shard and (memory tier) that shard's tier fit the
// memory limit together, before anything is allocated. c must be valid.
// The errors wrap memlimit.ErrTooLarge when the sizes do not fit.
//
// With --backend cuda the pools live on the GPU: only the largest
// offloading shard's host tier (pinned host memory) counts.
func (c Config) Preflight() error {
	n := slices.Max(c.Contexts)
	if c.Backend == "cuda" {
		dt, err := plan.ParseDType(c.DType)
		if err != nil {
			return err
		}
		g := c.geometry()
		g.DType = dt
		sc := c.storeConfig(n, slices.Max(c.DevicePct))
		need := memlimit.Mul(int64(sc.Capacity), int64(tier.PagePayloadBytes(1, g)))
		what := fmt.Sprintf("bench offload: the pinned host tier of %d tokens of %d KV heads x D %d (%v)", n, c.KVHeads, c.HeadDim, dt)
		return memlimit.Check(what, need, c.MemoryLimit)
	}
	res, err := c.storeConfig(n, 0).HostBytes()
	if err != nil {
		return fmt.Errorf("--context %d: %w", n, err)
	}
	oc := c.storeConfig(n, slices.Max(c.DevicePct))
	off, err := oc.HostBytes() // with the store's own memory tier
	if err != nil {
		return fmt.Errorf("--context %d: %w", n, err)
	}
	switch c.Tier {
	case "disk": // the payloads live in files instead
		off -= int64(oc.Capacity) * int64(oc.PayloadBytes())
	case "host+disk": // files but for the host budget
		off -= int64(oc.Capacity-c.hostPages(oc.Capacity)) * int64(oc.PayloadBytes())
	}
	need := memlimit.Add(res, off)
	what := fmt.Sprintf("bench offload: %d tokens of %d KV heads x D %d, all resident and offloaded (--tier %s)", n, c.KVHeads, c.HeadDim, c.Tier)
	return memlimit.Check(what, need, c.MemoryLimit)
}
