package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// offloadConfig is one run of 'questctl bench offload'.
type offloadConfig struct {
	contexts, budgets, devicePct, prefetch []int
	workloads                              []string
	pageSize, qHeads, kvHeads, headDim     int
	steps, warmup                          int
	eviction                               pagestore.Eviction
	tier, tierDir                          string
	hostBudget                             int // --tier host+disk: percent of the pages in host memory
	hostBudgetGiven                        bool
	backend, dtype                         string // cpu, or cuda storing dtype
	memoryLimit                            int64
	seed                                   uint64
}

// offloadResult is one JSON line: one (context, budget, workload, device
// budget, prefetch) configuration against the all-resident step on the
// same data and queries.
type offloadResult struct {
	Context  int    `json:"context"`
	Budget   int    `json:"budget"`
	Pages    int    `json:"pages"`
	KPages   int    `json:"k_pages"`
	PageSize int    `json:"page_size"`
	QHeads   int    `json:"q_heads"`
	KVHeads  int    `json:"kv_heads"`
	HeadDim  int    `json:"head_dim"`
	Tier     string `json:"tier"`
	Backend  string `json:"backend"`
	Eviction string `json:"eviction"`
	Workload string `json:"workload"`
	// DeviceBudgetPct is the share of the sequence's pages whose K/V stay
	// on the device (DevicePages pages; at least 2).
	DeviceBudgetPct int `json:"device_budget_pct"`
	DevicePages     int `json:"device_pages"`
	Prefetch        int `json:"prefetch"`
	Steps           int `json:"steps"`
	Warmup          int `json:"warmup"`
	// StepUS is the mean wall time of a timed step, StepP50US its median;
	// ResidentStepUS and ResidentP50US the same for the all-resident shard
	// (no offload: the served, fused step) over the same queries.
	StepUS         float64 `json:"step_us"`
	StepP50US      float64 `json:"step_p50_us"`
	ResidentStepUS float64 `json:"resident_step_us"`
	ResidentP50US  float64 `json:"resident_p50_us"`
	Slowdown       float64 `json:"slowdown"`
	// StallUS is the mean time per step inside its recalls: tier reads,
	// write-backs, and waits for prefetch reads in flight.
	StallUS float64 `json:"stall_us"`
	// HitRate is the share of the pages the steps' recalls wanted that
	// were resident (prefetched ones included).
	HitRate       float64 `json:"hit_rate"`
	MissesPerStep float64 `json:"misses_per_step"`
	// H2DBytesPerStep is the payload read from the tier into device slots
	// per step, by the steps and the prefetcher; D2HBytesPerStep what
	// write-backs wrote to the tier.
	H2DBytesPerStep float64 `json:"h2d_bytes_per_step"`
	D2HBytesPerStep float64 `json:"d2h_bytes_per_step"`
	PassesPerStep   float64 `json:"passes_per_step"`
	MultiPassSteps  int64   `json:"multi_pass_steps"`
	// Prefetch counters per step: pages reserved, pages a step found
	// resident only because of a prefetch, prefetched pages that left
	// unused, and the time steps waited for reads in flight.
	PrefetchIssuedPerStep float64 `json:"prefetch_issued_per_step"`
	PrefetchHitsPerStep   float64 `json:"prefetch_hits_per_step"`
	PrefetchWastedPerStep float64 `json:"prefetch_wasted_per_step"`
	PrefetchWaitUS        float64 `json:"prefetch_wait_us"`
	PrefetchPlanUS        float64 `json:"prefetch_plan_us"`
	// MaxAbsDiff is the largest |o - o_resident| over the timed steps'
	// outputs: 0 when every step attended in one pass (recall is exact).
	MaxAbsDiff   float64 `json:"max_abs_diff"`
	BitIdentical bool    `json:"bit_identical"`
	// The fields of offloadSpillResult, with --tier host+disk only.
	*offloadSpillResult
}

// offloadSpillResult is what --tier host+disk adds to a JSON line: the
// host budget of the tier.Spill and its counters.
type offloadSpillResult struct {
	// HostBudgetPct is the share of the sequence's pages whose payloads
	// the host tier may hold (HostPages pages, at least 1); the others
	// spill to the disk tier.
	HostBudgetPct int `json:"host_budget_pct"`
	HostPages     int `json:"host_pages"`
	// HostSlots and DiskSlots are the payloads held by each tier after
	// the timed steps.
	HostSlots int `json:"host_slots"`
	DiskSlots int `json:"disk_slots"`
	// Spills and SpilledBytes count the payloads moved from host to disk
	// over the whole run (fill and warm-up included), SpillErrors the
	// spills that failed; SpillsPerStep those of the timed steps.
	Spills        int64   `json:"spills"`
	SpilledBytes  int64   `json:"spilled_bytes"`
	SpillErrors   int64   `json:"spill_errors"`
	SpillsPerStep float64 `json:"spills_per_step"`
	// HostReadsPerStep and DiskReadsPerStep are the tier reads of a timed
	// step (recalls and prefetches) served by each tier.
	HostReadsPerStep float64 `json:"host_reads_per_step"`
	DiskReadsPerStep float64 `json:"disk_reads_per_step"`
}

func runBenchOffload(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, benchOffloadCommand, args, stdout, stderr)
}

// benchOffloadCommand builds the flags and the action of
// 'questctl bench offload' without running it (see [runCommand]).
func benchOffloadCommand() (*flag.FlagSet, action) {
	a := bench.DefaultAttentionConfig()
	c := offloadConfig{pageSize: a.PageSize, qHeads: a.QHeads, kvHeads: a.KVHeads, headDim: a.HeadDim, seed: 1}
	fs := newFlags("bench offload", `Usage: questctl bench offload [flags]

Offload on the CPU backend, or with --backend cuda on GPU 0 (device-
resident pools: summaries of every page and the K/V of the device budget
on the GPU, the other pages in pinned host memory the GPU maps, moved by
one copy kernel per recall over PCIe): one sequence of --context tokens, one layer,
one Quest step per query (batch 1, no appends), first on a shard holding
every page (the all-resident step), then, for each device budget (the
share of the sequence's pages whose K/V stay in the device pool, the
others in the tier) and each prefetch setting, on an offloading shard
holding the same data, stepped with the same queries: --warmup steps,
then --steps timed ones. Workloads: "slow", a query that drifts slowly
(each a 0.1 rad rotation of the previous one: a slowly changing
selection, as in the demo), and "random", an independent query each step
(a new selection every step). Prints one JSON line per configuration as
soon as it is measured, with step_us (mean) and step_p50_us,
resident_step_us, stall_us (time in recalls per step), hit_rate,
h2d_bytes_per_step (tier -> device, prefetch included),
d2h_bytes_per_step, passes_per_step, the prefetch counters, and
max_abs_diff against the all-resident outputs (0 when recall is exact:
steps whose pages do not fit the budget attend in passes merged by
their partial states). On the CPU "device" and "host" are the same RAM:
bytes moved cost a memory copy, not a PCIe transfer; on the GPU they
cross PCIe, and the step is timed as a caller sees it (outputs on the
host). Progress goes to stderr.

Tiers (--tier): memory (host memory holds every offloaded page), disk
(slab files hold them), or host+disk (a tier.Spill: host memory holds at
most --host-budget percent of the sequence's pages, the least recently
written or read ones spill to slab files; JSON lines then add
host_budget_pct, host_pages, host_slots, disk_slots, spills,
spilled_bytes, spill_errors, spills_per_step, host_reads_per_step and
disk_reads_per_step).

Every size is checked before anything is allocated: the all-resident
shard, the largest offloading one and, with --tier memory, its tier
(with --tier host+disk, the tier's host share) must fit --max-memory
together.`)
	contexts := fs.String("context", "65536", fmt.Sprintf("comma-separated context lengths in tokens (1..%d)", bench.MaxContext))
	budgets := fs.String("budget", "2048", fmt.Sprintf("comma-separated token budgets (--page-size..%d)", bench.MaxContext))
	devBudget := fs.String("device-budget", "100,50,20,10,5", "comma-separated device budgets, percent of the sequence's pages (1..100)")
	workloads := fs.String("workload", "slow,random", "comma-separated workloads: slow (a slowly drifting query), random (an independent query every step)")
	prefetch := fs.String("prefetch", "0,32", "comma-separated prefetch settings, pages per selection row below the top-K (0: off; at most the context's pages)")
	fs.IntVar(&c.pageSize, "page-size", c.pageSize, fmt.Sprintf("tokens per page S (1..%d)", bench.MaxPageSize))
	fs.IntVar(&c.qHeads, "q-heads", c.qHeads, fmt.Sprintf("query heads (1..%d, a multiple of --kv-heads)", bench.MaxHeads))
	fs.IntVar(&c.kvHeads, "kv-heads", c.kvHeads, fmt.Sprintf("KV heads (1..%d)", bench.MaxHeads))
	fs.IntVar(&c.headDim, "head-dim", c.headDim, fmt.Sprintf("head dimension D (1..%d)", bench.MaxHeadDim))
	fs.IntVar(&c.steps, "steps", 32, fmt.Sprintf("timed steps per configuration (1..%d)", bench.MaxIters))
	fs.IntVar(&c.warmup, "warmup", 16, fmt.Sprintf("untimed steps before them, which bring the device pool to its steady state (0..%d)", bench.MaxIters))
	eviction := fs.String("eviction", "lru", "eviction policy: lru or score")
	fs.StringVar(&c.tier, "tier", "memory", "where offloaded pages live: memory (a host memory tier), disk (pagestore/disktier slab files in a temporary directory, removed afterwards) or host+disk (host memory up to --host-budget, spilling to disk)")
	fs.StringVar(&c.tierDir, "tier-dir", "", "with --tier disk or host+disk: the directory in which the temporary tier directory is made (default: the system's temporary directory)")
	fs.IntVar(&c.hostBudget, "host-budget", 50, "with --tier host+disk: percent of the sequence's pages whose payloads host memory holds, the rest spilling to disk (1..100)")
	fs.StringVar(&c.backend, "backend", "cpu", "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host (device-resident pools; --tier memory only)")
	dtype := kvCacheDTypeFlag(fs, "")
	maxMem := maxMemoryFlag(fs)
	asJSON := fs.Bool("json", false, "no table on stderr: JSON lines on stdout, progress lines on stderr (default also prints a table to stderr)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		switch c.backend {
		case "cpu":
			if name := givenAs(fs, "kv-cache-dtype"); name != "" {
				return usageError{fmt.Errorf("%s needs --backend cuda (the CPU backend stores float32)", name)}
			}
		case "cuda":
			if c.tier != "memory" {
				return usageError{fmt.Errorf("--tier %s needs --backend cpu (the GPU's tier is pinned host memory it maps)", c.tier)}
			}
			c.dtype = *dtype
		default:
			return usageError{fmt.Errorf("--backend %q: want cpu or cuda", c.backend)}
		}
		if c.contexts, err = parseInts("--context", *contexts); err != nil {
			return err
		}
		if c.budgets, err = parseInts("--budget", *budgets); err != nil {
			return err
		}
		if c.devicePct, err = parseInts("--device-budget", *devBudget); err != nil {
			return err
		}
		if c.prefetch, err = parseInts("--prefetch", *prefetch); err != nil {
			return err
		}
		for _, w := range strings.Split(*workloads, ",") {
			switch w = strings.TrimSpace(w); w {
			case "slow", "random":
				c.workloads = append(c.workloads, w)
			default:
				return usageError{fmt.Errorf("--workload %q: unknown workload %q (want a comma-separated list of slow, random)", *workloads, w)}
			}
		}
		if c.eviction, err = pagestore.ParseEviction(*eviction); err != nil {
			return usageError{fmt.Errorf("--eviction: %w", err)}
		}
		c.memoryLimit = *maxMem
		c.hostBudgetGiven = givenAs(fs, "host-budget") != ""
		if err := c.validate(); err != nil {
			return usageError{err}
		}
		if err := c.preflight(); err != nil {
			return memoryError(err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var rows []offloadResult
		start := time.Now()
		err = benchOffload(ctx, c, stderr, func(r offloadResult) error {
			rows = append(rows, r)
			return bench.WriteJSONLine(stdout, r)
		})
		if err != nil {
			return err
		}
		if !*asJSON {
			writeOffloadTable(stderr, rows)
			fmt.Fprintf(stderr, "done in %.1fs\n", time.Since(start).Seconds())
		}
		return nil
	}
}

// validate reports the first setting outside its range, naming its flag.
func (c offloadConfig) validate() error {
	for _, f := range []struct {
		flag  string
		v, hi int
	}{
		{"--page-size", c.pageSize, bench.MaxPageSize}, {"--q-heads", c.qHeads, bench.MaxHeads},
		{"--kv-heads", c.kvHeads, bench.MaxHeads}, {"--head-dim", c.headDim, bench.MaxHeadDim},
		{"--steps", c.steps, bench.MaxIters},
	} {
		if f.v < 1 || f.v > f.hi {
			return fmt.Errorf("%s %d: want 1..%d", f.flag, f.v, f.hi)
		}
	}
	if c.qHeads%c.kvHeads != 0 {
		return fmt.Errorf("--q-heads %d is not a multiple of --kv-heads %d", c.qHeads, c.kvHeads)
	}
	if c.warmup < 0 || c.warmup > bench.MaxIters {
		return fmt.Errorf("--warmup %d: want 0..%d", c.warmup, bench.MaxIters)
	}
	minPages := math.MaxInt
	for _, n := range c.contexts {
		if n < 1 || n > bench.MaxContext {
			return fmt.Errorf("--context %d: want 1..%d tokens", n, bench.MaxContext)
		}
		minPages = min(minPages, (n+c.pageSize-1)/c.pageSize)
	}
	for _, b := range c.budgets {
		if b < c.pageSize || b > bench.MaxContext {
			return fmt.Errorf("--budget %d: want --page-size (%d)..%d tokens", b, c.pageSize, bench.MaxContext)
		}
	}
	for _, p := range c.devicePct {
		if p < 1 || p > 100 {
			return fmt.Errorf("--device-budget %d: want 1..100 percent of the sequence's pages", p)
		}
	}
	for _, p := range c.prefetch {
		if p < 0 || p > minPages {
			return fmt.Errorf("--prefetch %d: want 0..%d pages (the shortest context's pages)", p, minPages)
		}
	}
	switch c.tier {
	case "memory", "disk", "host+disk":
	default:
		return fmt.Errorf("--tier %q: want memory, disk or host+disk", c.tier)
	}
	if c.tier == "host+disk" {
		if c.hostBudget < 1 || c.hostBudget > 100 {
			return fmt.Errorf("--host-budget %d: want 1..100 percent of the sequence's pages", c.hostBudget)
		}
	} else if c.hostBudgetGiven {
		return fmt.Errorf("--host-budget needs --tier host+disk (not --tier %s)", c.tier)
	}
	switch c.tier {
	case "memory":
		if c.tierDir != "" {
			return errors.New("--tier-dir needs --tier disk or host+disk")
		}
	case "disk", "host+disk":
		if c.tierDir != "" {
			if fi, err := os.Stat(c.tierDir); err != nil || !fi.IsDir() {
				return fmt.Errorf("--tier-dir %q: not a directory", c.tierDir)
			}
		}
	}
	if c.memoryLimit < memlimit.NoLimit {
		return fmt.Errorf("--max-memory %d: want a byte count, 0 (the memory available now) or -1 (no check)", c.memoryLimit)
	}
	return nil
}

// geometry is the shard's head geometry.
func (c offloadConfig) geometry() plan.Geometry {
	return plan.Geometry{QHeads: c.qHeads, KVHeads: c.kvHeads, HeadDim: c.headDim, PageSize: c.pageSize}
}

// storeConfig is the page store of a sequence of n tokens, with device
// budget pct percent of its pages (0: offload off).
func (c offloadConfig) storeConfig(n, pct int) pagestore.Config {
	pages := (n + c.pageSize - 1) / c.pageSize
	sc := pagestore.Config{Layers: 1, Geometry: c.geometry(), Capacity: pages, MemoryLimit: memlimit.NoLimit, Eviction: c.eviction}
	if pct > 0 {
		sc.DeviceBudget = min(pages, max(2, (pct*pages+50)/100))
	}
	return sc
}

// hostPages is the host budget of --tier host+disk for a sequence of
// pages pages: c.hostBudget percent of them, at least 1.
func (c offloadConfig) hostPages(pages int) int {
	return min(pages, max(1, (c.hostBudget*pages+50)/100))
}

// preflight checks that the largest context's all-resident shard, its
// largest offloading shard and (memory tier) that shard's tier fit the
// memory limit together, before anything is allocated.
//
// With --backend cuda the pools live on the GPU: only the largest
// offloading shard's host tier (pinned host memory) counts.
func (c offloadConfig) preflight() error {
	n := slices.Max(c.contexts)
	if c.backend == "cuda" {
		dt, err := plan.ParseDType(c.dtype)
		if err != nil {
			return usageError{err}
		}
		g := c.geometry()
		g.DType = dt
		sc := c.storeConfig(n, slices.Max(c.devicePct))
		need := memlimit.Mul(int64(sc.Capacity), int64(tier.PagePayloadBytes(1, g)))
		what := fmt.Sprintf("bench offload: the pinned host tier of %d tokens of %d KV heads x D %d (%v)", n, c.kvHeads, c.headDim, dt)
		return memlimit.Check(what, need, c.memoryLimit)
	}
	res, err := c.storeConfig(n, 0).HostBytes()
	if err != nil {
		return usageError{fmt.Errorf("--context %d: %w", n, err)}
	}
	oc := c.storeConfig(n, slices.Max(c.devicePct))
	off, err := oc.HostBytes() // with the store's own memory tier
	if err != nil {
		return usageError{fmt.Errorf("--context %d: %w", n, err)}
	}
	switch c.tier {
	case "disk": // the payloads live in files instead
		off -= int64(oc.Capacity) * int64(oc.PayloadBytes())
	case "host+disk": // files but for the host budget
		off -= int64(oc.Capacity-c.hostPages(oc.Capacity)) * int64(oc.PayloadBytes())
	}
	need := memlimit.Add(res, off)
	what := fmt.Sprintf("bench offload: %d tokens of %d KV heads x D %d, all resident and offloaded (--tier %s)", n, c.kvHeads, c.headDim, c.tier)
	return memlimit.Check(what, need, c.memoryLimit)
}

// benchOffload runs every configuration of c, calling emit with each
// result as soon as it is measured.
func benchOffload(ctx context.Context, c offloadConfig, progress io.Writer, emit func(offloadResult) error) error {
	var be kernels.Backend = kernels.NewCPU(kernels.CPUConfig{})
	if c.backend == "cuda" {
		var err error
		if be, err = newCUDABackend(c.dtype); err != nil {
			return err
		}
	}
	defer be.Close()
	for _, n := range c.contexts {
		for _, budget := range c.budgets {
			for _, w := range c.workloads {
				qs := offloadQueries(c.seed, w, c.warmup+c.steps, c.qHeads*c.headDim)
				fmt.Fprintf(progress, "bench offload: context %d budget %d %s: the all-resident step\n", n, budget, w)
				ref, err := offloadRun(ctx, c, be, n, budget, 0, 0, qs, nil)
				if err != nil {
					return err
				}
				for _, pct := range c.devicePct {
					for _, pf := range c.prefetch {
						fmt.Fprintf(progress, "bench offload: context %d budget %d %s: device budget %d%%, prefetch %d\n", n, budget, w, pct, pf)
						r, err := offloadRun(ctx, c, be, n, budget, pct, pf, qs, ref.outs)
						if err != nil {
							return err
						}
						sc := c.storeConfig(n, pct)
						out := r.result
						out.Context, out.Budget, out.Pages, out.KPages = n, budget, sc.Capacity, budget/c.pageSize
						out.PageSize, out.QHeads, out.KVHeads, out.HeadDim = c.pageSize, c.qHeads, c.kvHeads, c.headDim
						out.Tier, out.Eviction, out.Workload = c.tier, c.eviction.String(), w
						out.Backend = c.backend
						out.DeviceBudgetPct, out.DevicePages, out.Prefetch = pct, sc.DeviceBudget, pf
						out.Steps, out.Warmup = c.steps, c.warmup
						out.ResidentStepUS, out.ResidentP50US = ref.result.StepUS, ref.result.StepP50US
						out.Slowdown = out.StepUS / out.ResidentStepUS
						if err := emit(out); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

// offloadRunResult is one shard's measurement and, for the all-resident
// shard, its timed steps' outputs.
type offloadRunResult struct {
	result offloadResult
	outs   [][]float32
}

// offloadRun is one shard's run: fill a sequence of n tokens, step the
// queries, time the last c.steps. pct 0 is the all-resident shard, whose
// timed outputs it returns; otherwise the outputs are compared with ref.
func offloadRun(ctx context.Context, c offloadConfig, be kernels.Backend, n, budget, pct, pf int, qs [][]float32, ref [][]float32) (offloadRunResult, error) {
	var out offloadRunResult
	sc := c.storeConfig(n, pct)
	var spill *tier.Spill
	if pct > 0 && (c.tier == "disk" || c.tier == "host+disk") {
		dir, err := os.MkdirTemp(c.tierDir, "questctl-offload-")
		if err != nil {
			return out, fmt.Errorf("disk tier: %w", err)
		}
		defer os.RemoveAll(dir)
		dc := disktier.DefaultConfig()
		dc.Dir, dc.Slots, dc.PayloadBytes, dc.Durability = dir, sc.Capacity, sc.PayloadBytes(), disktier.SyncNone
		d, err := disktier.Open(dc)
		if err != nil {
			return out, fmt.Errorf("disk tier: %w", err)
		}
		defer d.Close()
		sc.Tier = d
		if c.tier == "host+disk" {
			host, err := tier.NewMemory(sc.Capacity, sc.PayloadBytes())
			if err != nil {
				return out, fmt.Errorf("host tier: %w", err)
			}
			// The spill tier owns (and closes) both; closing d again
			// above is harmless.
			spill, err = tier.NewSpill(host, d, tier.SpillConfig{Budget: c.hostPages(sc.Capacity)})
			if err != nil {
				return out, fmt.Errorf("host+disk tier: %w", err)
			}
			defer spill.Close()
			sc.Tier = spill
		}
	}
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = c.pageSize, budget, 0
	sh, err := shard.New(shard.Config{Store: sc, Policy: pol, PrefetchPages: pf, DeviceResident: c.backend == "cuda"}, be)
	if err != nil {
		return out, err
	}
	defer sh.Close()
	id := sh.Store().Create()
	if err := offloadFill(ctx, c, sh, id, n); err != nil {
		return out, err
	}
	// The previous configuration's pools are garbage: collect them now,
	// not during the timed steps.
	runtime.GC()
	var res shard.StepResult
	reqs := []shard.SeqStep{{Seq: id}}
	step := func(q []float32) (time.Duration, error) {
		reqs[0].Q = q
		t0 := time.Now()
		err := sh.Step(ctx, 0, reqs, shard.StepOptions{}, &res)
		return time.Since(t0), err
	}
	for _, q := range qs[:c.warmup] {
		if _, err := step(q); err != nil {
			return out, err
		}
	}
	before := sh.OffloadStats()
	var spillBefore tier.SpillStats
	if spill != nil {
		spillBefore = spill.Stats()
	}
	times := make([]float64, 0, c.steps)
	diff, total := 0.0, 0.0
	for i, q := range qs[c.warmup:] {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		d, err := step(q)
		if err != nil {
			return out, err
		}
		us := float64(d.Nanoseconds()) / 1e3
		times = append(times, us)
		total += us
		if ref == nil {
			out.outs = append(out.outs, slices.Clone(res.O))
			continue
		}
		for j, x := range res.O {
			diff = max(diff, math.Abs(float64(x)-float64(ref[i][j])))
		}
	}
	after := sh.OffloadStats()
	r := &out.result
	steps := float64(c.steps)
	slices.Sort(times)
	r.StepUS, r.StepP50US = total/steps, times[len(times)/2]
	r.MaxAbsDiff, r.BitIdentical = diff, diff == 0
	if pct == 0 {
		return out, nil
	}
	per := func(a, b int64) float64 { return float64(a-b) / steps }
	perUS := func(a, b time.Duration) float64 { return float64((a - b).Nanoseconds()) / 1e3 / steps }
	hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
	r.HitRate = 1
	if hits+misses > 0 {
		r.HitRate = float64(hits) / float64(hits+misses)
	}
	r.StallUS = perUS(after.Stall, before.Stall)
	r.MissesPerStep = per(after.Misses, before.Misses)
	r.H2DBytesPerStep = per(after.BytesIn+after.PrefetchBytes, before.BytesIn+before.PrefetchBytes)
	r.D2HBytesPerStep = per(after.BytesOut, before.BytesOut)
	r.PassesPerStep = per(after.Passes, before.Passes)
	r.MultiPassSteps = after.MultiPass - before.MultiPass
	r.PrefetchIssuedPerStep = per(after.PrefetchIssued, before.PrefetchIssued)
	r.PrefetchHitsPerStep = per(after.PrefetchHits, before.PrefetchHits)
	r.PrefetchWastedPerStep = per(after.PrefetchWasted, before.PrefetchWasted)
	r.PrefetchWaitUS = perUS(after.PrefetchWait, before.PrefetchWait)
	r.PrefetchPlanUS = perUS(after.PrefetchPlan, before.PrefetchPlan)
	if spill != nil {
		st := spill.Stats()
		r.offloadSpillResult = &offloadSpillResult{
			HostBudgetPct: c.hostBudget, HostPages: st.Budget,
			HostSlots: st.Upper, DiskSlots: st.Lower,
			Spills: st.Spills, SpilledBytes: st.SpilledBytes, SpillErrors: st.SpillErrors,
			SpillsPerStep:    per(st.Spills, spillBefore.Spills),
			HostReadsPerStep: per(st.UpperReads, spillBefore.UpperReads),
			DiskReadsPerStep: per(st.LowerReads, spillBefore.LowerReads),
		}
	}
	return out, nil
}

// offloadFill appends n tokens of pseudo-random keys and values in
// [-1, 1) (the same for every shard of a run: chunk i comes from seed and
// i) to layer 0.
func offloadFill(ctx context.Context, c offloadConfig, sh *shard.Shard, id pagestore.SeqID, n int) error {
	const chunk = 1024
	tok := c.kvHeads * c.headDim
	k, v := make([]float32, chunk*tok), make([]float32, chunk*tok)
	for at, i := 0, 0; at < n; at, i = at+chunk, i+1 {
		if err := ctx.Err(); err != nil {
			return err
		}
		m := min(chunk, n-at)
		// xorshift64, seeded from (seed, i): a million-token fill in a
		// second or two (math/rand/v2 takes tens of seconds), the same
		// data for every shard of a run.
		x := (c.seed+1)*0x9e3779b97f4a7c15 ^ (uint64(i)+1)*0xbf58476d1ce4e5b9
		for j := range k[:m*tok] {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			k[j] = float32(x>>40)/(1<<23) - 1
			v[j] = float32(x&0xffffff)/(1<<23) - 1
		}
		if err := sh.Append(id, 0, k[:m*tok], v[:m*tok]); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	return nil
}

// offloadQueries returns n queries of dim floats for workload w: random
// (independent), or slow (each a rotation by 0.1 rad of the previous one
// towards a fresh random direction).
func offloadQueries(seed uint64, w string, n, dim int) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 1<<40))
	vec := func() []float32 {
		q := make([]float32, dim)
		for j := range q {
			q[j] = float32(rng.NormFloat64() * 2)
		}
		return q
	}
	qs := make([][]float32, n)
	q := vec()
	cs, sn := float32(math.Cos(0.1)), float32(math.Sin(0.1))
	for i := range qs {
		if w == "random" {
			qs[i] = vec()
			continue
		}
		r := vec()
		next := make([]float32, dim)
		for j := range next {
			next[j] = cs*q[j] + sn*r[j]
		}
		q, qs[i] = next, next
	}
	return qs
}

// writeOffloadTable prints the results as a Markdown table.
func writeOffloadTable(w io.Writer, rows []offloadResult) {
	fmt.Fprintln(w, "| context | workload | device budget | prefetch | step us | resident us | stall us/step | hit rate | H2D bytes/step | prefetch hits/step | wasted/step | passes/step | max abs diff |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %d | %s | %d%% (%d pages) | %d | %.0f | %.0f | %.0f | %.3f | %.0f | %.1f | %.1f | %.2f | %.3g |\n",
			r.Context, r.Workload, r.DeviceBudgetPct, r.DevicePages, r.Prefetch, r.StepUS, r.ResidentStepUS, r.StallUS,
			r.HitRate, r.H2DBytesPerStep, r.PrefetchHitsPerStep, r.PrefetchWastedPerStep, r.PassesPerStep, r.MaxAbsDiff)
	}
}
