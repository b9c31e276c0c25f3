package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/bench/offload"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
)

func runBenchOffload(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, benchOffloadCommand, args, stdout, stderr)
}

// benchOffloadCommand builds the flags and the action of
// 'questctl bench offload' without running it (see [runCommand]).
func benchOffloadCommand() (*flag.FlagSet, action) {
	c := offload.DefaultConfig()
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
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, fmt.Sprintf("tokens per page S (1..%d)", bench.MaxPageSize))
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, fmt.Sprintf("query heads (1..%d, a multiple of --kv-heads)", bench.MaxHeads))
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, fmt.Sprintf("KV heads (1..%d)", bench.MaxHeads))
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, fmt.Sprintf("head dimension D (1..%d)", bench.MaxHeadDim))
	fs.IntVar(&c.Steps, "steps", c.Steps, fmt.Sprintf("timed steps per configuration (1..%d)", bench.MaxIters))
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, fmt.Sprintf("untimed steps before them, which bring the device pool to its steady state (0..%d)", bench.MaxIters))
	eviction := fs.String("eviction", "lru", "eviction policy: lru or score")
	fs.StringVar(&c.Tier, "tier", c.Tier, "where offloaded pages live: memory (a host memory tier), disk (pagestore/disktier slab files in a temporary directory, removed afterwards) or host+disk (host memory up to --host-budget, spilling to disk)")
	fs.StringVar(&c.TierDir, "tier-dir", "", "with --tier disk or host+disk: the directory in which the temporary tier directory is made (default: the system's temporary directory)")
	fs.IntVar(&c.HostBudget, "host-budget", c.HostBudget, "with --tier host+disk: percent of the sequence's pages whose payloads host memory holds, the rest spilling to disk (1..100)")
	fs.StringVar(&c.Backend, "backend", c.Backend, "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host (device-resident pools; --tier memory only)")
	dtype := kvCacheDTypeFlag(fs, "")
	maxMem := maxMemoryFlag(fs)
	asJSON := fs.Bool("json", false, "no table on stderr: JSON lines on stdout, progress lines on stderr (default also prints a table to stderr)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		switch c.Backend {
		case "cpu":
			if name := givenAs(fs, "kv-cache-dtype"); name != "" {
				return usageError{fmt.Errorf("%s needs --backend cuda (the CPU backend stores float32)", name)}
			}
		case "cuda":
			if c.Tier != "memory" {
				return usageError{fmt.Errorf("--tier %s needs --backend cpu (the GPU's tier is pinned host memory it maps)", c.Tier)}
			}
			c.DType = *dtype
		default:
			return usageError{fmt.Errorf("--backend %q: want cpu or cuda", c.Backend)}
		}
		if c.Contexts, err = parseInts("--context", *contexts); err != nil {
			return err
		}
		if c.Budgets, err = parseInts("--budget", *budgets); err != nil {
			return err
		}
		if c.DevicePct, err = parseInts("--device-budget", *devBudget); err != nil {
			return err
		}
		if c.Prefetch, err = parseInts("--prefetch", *prefetch); err != nil {
			return err
		}
		c.Workloads = nil
		for _, w := range strings.Split(*workloads, ",") {
			switch w = strings.TrimSpace(w); w {
			case "slow", "random":
				c.Workloads = append(c.Workloads, w)
			default:
				return usageError{fmt.Errorf("--workload %q: unknown workload %q (want a comma-separated list of slow, random)", *workloads, w)}
			}
		}
		if c.Eviction, err = pagestore.ParseEviction(*eviction); err != nil {
			return usageError{fmt.Errorf("--eviction: %w", err)}
		}
		c.MemoryLimit = *maxMem
		c.HostBudgetSet = givenAs(fs, "host-budget") != ""
		if err := c.Validate(); err != nil {
			return usageError{err}
		}
		if err := c.Preflight(); err != nil {
			return memoryError(err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var be kernels.Backend = kernels.NewCPU(kernels.CPUConfig{})
		if c.Backend == "cuda" {
			if be, err = newCUDABackend(c.DType); err != nil {
				return err
			}
		}
		defer be.Close()
		var rows []offload.Result
		start := time.Now()
		err = offload.Run(ctx, c, be, stderr, func(r offload.Result) error {
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

// writeOffloadTable prints the results as a Markdown table.
func writeOffloadTable(w io.Writer, rows []offload.Result) {
	fmt.Fprintln(w, "| context | workload | device budget | prefetch | step us | resident us | stall us/step | hit rate | H2D bytes/step | prefetch hits/step | wasted/step | passes/step | max abs diff |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %d | %s | %d%% (%d pages) | %d | %.0f | %.0f | %.0f | %.3f | %.0f | %.1f | %.1f | %.2f | %.3g |\n",
			r.Context, r.Workload, r.DeviceBudgetPct, r.DevicePages, r.Prefetch, r.StepUS, r.ResidentStepUS, r.StallUS,
			r.HitRate, r.H2DBytesPerStep, r.PrefetchHitsPerStep, r.PrefetchWastedPerStep, r.PassesPerStep, r.MaxAbsDiff)
	}
}
