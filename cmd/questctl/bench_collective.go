package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/bench/localgroup"
	"github.com/questrt/questrt/bench/rankproc"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/worker/remote"
)

// collectiveFlags maps the BenchConfig fields that BenchRangeError names to
// their flags.
var collectiveFlags = map[string]string{
	"Shards": "shards", "Batches": "batch", "Steps": "steps", "Warmup": "warmup",
	"KVHeads": "kv-heads", "QHeads": "q-heads", "HeadDim": "head-dim",
	"PageBudget": "k", "Pages": "pages",
	"MinBytes": "min-bytes", "MaxBytes": "max-bytes", "Factor": "factor",
}

// sweepOnly are the flags of the selection and merge configurations, which
// a sweep (--min-bytes, --max-bytes, --factor) does not take.
var sweepOnly = []string{"batch", "kv-heads", "q-heads", "head-dim", "k", "pages"}

// Defaults of --steps and --warmup in a sweep (nccl-tests runs 20 and 5).
const (
	sweepSteps  = 100
	sweepWarmup = 5
)

func runBenchCollective(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == rankCommand {
		return runBenchRank(ctx, args[1:], os.Stdin, stdout, stderr)
	}
	return runCommand(ctx, benchCollectiveCommand, args, stdout, stderr)
}

// benchCollectiveCommand builds the flags and the action of
// 'questctl bench collective' without running it (see [runCommand]).
func benchCollectiveCommand() (*flag.FlagSet, action) {
	c := collective.DefaultBenchConfig()
	fs := newFlags("bench collective", fmt.Sprintf(`Usage: questctl bench collective [flags]

Per layer-step latency of the collectives of a CP group: the exact
selection exchange (all-gather of each rank's local top-K candidates, every
rank derives the same global top-K) and the merge of partial states to
rank 0, on N goroutines over the chosen transports: inproc (channels in
one process) and grpc (one long-lived gRPC stream per pair of ranks over
127.0.0.1, plaintext: the cost of the network path without a network).
Prints one JSON line per (transport, shards, batch) on stdout as soon as
that configuration finishes, with p50/p95/p99 latencies in microseconds
and bytes sent, so the transports compare line by line; progress and a
table go to stderr (the table not with --json).

Every step also measures a baseline on the same ranks and transports:
an all-gather of opaque bytes in which every rank sends each other rank a
message as long as its selection frame (the exchange's bytes and
messages, without encoding, checks or the top-K merge), the same for the
merge (every rank sends rank 0 a message as long as its state frame), and
a ping-pong of ranks 0 and 1 over their stream. Lines carry
baseline_p50_us, baseline_p99_us and overhead_vs_baseline (select p50 /
baseline p50), merge_baseline_* and merge_overhead_vs_baseline,
pingpong_p50_us and pingpong_p99_us, and the baseline's bytes, equal to
the operations'. start_skew_p50_us and baseline_start_skew_p50_us are the
median spread of the ranks' start times (last minus first) of the
selection and of its baseline: part of their latencies. Every line also carries "kind", the host (CPU model,
cores, load average, kernel), go_version, questrt_version, commit (from
the binary's VCS stamp, "unknown" without one), commit_modified and tls.

--min-bytes, --max-bytes and --factor (any of them) run, instead of the
selection and merge, a message-size sweep of that plain all-gather as
nccl-tests' all_gather_perf -b -e -f does: sizes from --min-bytes,
multiplied by --factor up to --max-bytes (bytes, or 4K, 128M), where a
size is the all-gather's total as in nccl-tests (each of N ranks sends
size/N bytes to every other rank, at least 1). One line per (transport,
N, size) with "kind": "allgather_sweep": time_us (the mean group
latency), p50_us, p99_us, algbw_gbps = bytes / time and busbw_gbps =
algbw * (N-1)/N (GB/s, 1e9 bytes/s), and the bytes sent. A sweep takes
--shards or --nodes, --transport, --steps (default %d there), --warmup
(default %d there) and --max-memory. A factor below 2 (or above %d),
a size outside 1 to %d (1G) and --min-bytes above --max-bytes
are refused before anything runs.

--nodes N,... instead of --shards runs the grpc ranks in processes: for
each N, N child questctl processes on this host, one rank each, that
listen on 127.0.0.1, learn each other's addresses from this process, run
the same measured loop and hand back their step times, combined here as
for goroutines; the lines are the same but for "processes": N (1 for
goroutines). Ranks meet at a barrier over gRPC before each operation
instead of an in-process one. With --nodes, --transport must include grpc;
inproc, if listed too, still runs the same sizes on goroutines. A rank
that has not reported within --timeout of its configuration's start fails
the run; the children are killed and reaped, and die with this process.

--addr HOST:PORT runs the ranks on the nodes of a running cluster
instead: the questd at HOST:PORT places one rank on each of N nodes up
(--nodes N,...; default every node up), itself rank 0 and the others by
name, runs the same measured loop (selection, merge and their baselines,
or a sweep) over the cluster's own collective streams, TLS and token as
the cluster is configured, and returns every rank's step times, combined
here into the same lines with "transport": "cluster", "processes": N,
"addr" and "nodes" (the nodes by rank), and tls as the nodes' streams
were. --timeout bounds each configuration's run on the nodes (default
%v there, at most %v). The connection to the node takes --plaintext,
--tls-dir, --ca, --tls-cert, --tls-key and --token-file as 'questctl
status' does. Ranks on different hosts are timed by their own clocks
(step latency is the latest end minus the earliest start over the
ranks), so lines across hosts are only as good as their clocks agree. A
node lost or failing mid-run fails the command with the node named; the
run ends on the others. Not with --shards, --transport or --max-memory
(each node checks its own memory limit); more ranks than nodes up are
refused before anything runs.

Sizes must be at least 1 (--warmup 0 is allowed); at most %d shards,
%d to %d nodes, a batch of %d, %d KV or query heads, a head dimension of
%d, %d pages (--k at most --pages) and %d steps. A configuration whose
data do not fit --max-memory (all ranks together) is refused before it
runs.`,
		sweepSteps, sweepWarmup, collective.MaxSweepFactor, collective.MaxSweepBytes,
		remote.DefaultBenchTimeout, remote.MaxBenchTimeout,
		collective.MaxBenchShards, 2, rankproc.MaxNodes, collective.MaxBenchBatch, collective.MaxBenchHeads,
		collective.MaxBenchHeadDim, collective.MaxBenchPages, collective.MaxBenchSteps))
	shards := fs.String("shards", "2,4,8,16", fmt.Sprintf("comma-separated CP group sizes, all ranks goroutines of this process (1 to %d)", collective.MaxBenchShards))
	nodes := fs.String("nodes", "", fmt.Sprintf("comma-separated CP group sizes, every grpc rank in its own process (2 to %d; instead of --shards)", rankproc.MaxNodes))
	timeout := fs.Duration("timeout", rankproc.DefaultTimeout, "with --nodes: the longest one configuration may take, from starting its processes to their reports; with --addr: the longest one configuration may run on the nodes (default there 1m0s)")
	batches := fs.String("batch", "1,16", fmt.Sprintf("comma-separated batch sizes (1 to %d)", collective.MaxBenchBatch))
	transports := fs.String("transport", c.Transport, "comma-separated transports: inproc, grpc")
	fs.IntVar(&c.Steps, "steps", c.Steps, fmt.Sprintf("measured layer-steps per configuration (1 to %d)", collective.MaxBenchSteps))
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, fmt.Sprintf("unmeasured layer-steps run first (0 to %d)", collective.MaxBenchSteps))
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, fmt.Sprintf("KV heads (selection rows per sequence; 1 to %d)", collective.MaxBenchHeads))
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, fmt.Sprintf("query heads (merged states per sequence; 1 to %d)", collective.MaxBenchHeads))
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, fmt.Sprintf("head dimension D (1 to %d)", collective.MaxBenchHeadDim))
	fs.IntVar(&c.PageBudget, "k", c.PageBudget, "pages selected per row (K; 1 to --pages)")
	fs.IntVar(&c.Pages, "pages", c.Pages, fmt.Sprintf("pages per sequence, striped over the shards (1 to %d)", collective.MaxBenchPages))
	sw := collective.DefaultSweepConfig()
	sizeFlag(fs, &sw.MinBytes, "min-bytes", fmt.Sprintf("a sweep's smallest all-gather, in bytes (all ranks' parts together, as nccl-tests' -b; 1 to %d)", collective.MaxSweepBytes))
	sizeFlag(fs, &sw.MaxBytes, "max-bytes", fmt.Sprintf("a sweep's largest all-gather, in bytes (as nccl-tests' -e; 1 to %d)", collective.MaxSweepBytes))
	fs.IntVar(&sw.Factor, "factor", sw.Factor, fmt.Sprintf("a sweep's multiplication factor between sizes, 2 to %d (as nccl-tests' -f)", collective.MaxSweepFactor))
	maxMem := maxMemoryFlag(fs)
	addr := fs.String("addr", "", "run the ranks on the nodes of the cluster of the questd at HOST:PORT, one per node (see above)")
	conn := addConnFlags(fs)
	tokenFile := tokenFileFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON lines only on stdout (default also prints a table to stderr; progress goes to stderr either way)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		byNodes := flagSet(fs, "nodes")
		sweep := flagSet(fs, "min-bytes") || flagSet(fs, "max-bytes") || flagSet(fs, "factor")
		if sweep {
			for _, f := range sweepOnly {
				if flagSet(fs, f) {
					return usageError{fmt.Errorf("--%s: not with a sweep (--min-bytes, --max-bytes, --factor run the plain all-gather only)", f)}
				}
			}
		}
		if flagSet(fs, "addr") {
			return benchCollectiveAddr(ctx, fs, addrFlags{addr: *addr, conn: conn, tokenFile: *tokenFile, nodes: *nodes, batches: *batches,
				timeout: *timeout, asJSON: *asJSON}, c, sw, sweep, stdout, stderr)
		}
		switch {
		case byNodes && flagSet(fs, "shards"):
			return usageError{errors.New("--nodes and --shards: give one (--nodes runs every grpc rank in its own process)")}
		case flagSet(fs, "timeout") && !byNodes:
			return usageError{errors.New("--timeout: only with --nodes")}
		case byNodes && *timeout <= 0:
			return usageError{fmt.Errorf("--timeout %v: want a positive duration", *timeout)}
		}
		sizes, sizesFlag := *shards, "shards"
		if byNodes {
			sizes, sizesFlag = *nodes, "nodes"
		}
		if c.Shards, err = sizeList(sizesFlag, sizes); err != nil {
			return usageError{err}
		}
		if byNodes {
			for _, n := range c.Shards {
				if n < 2 || n > rankproc.MaxNodes {
					return usageError{fmt.Errorf("--nodes %d: want 2 to %d (one process per rank; --shards runs 1)", n, rankproc.MaxNodes)}
				}
				if c.Pages >= 1 && n > c.Pages {
					return usageError{fmt.Errorf("--nodes %d: more ranks than the %d pages of a sequence (--pages)", n, c.Pages)}
				}
			}
		}
		if c.Batches, err = sizeList("batch", *batches); err != nil {
			return usageError{err}
		}
		c.MaxMemory = *maxMem
		if sweep {
			sw.Shards, sw.MaxMemory = c.Shards, *maxMem
			sw.Steps, sw.Warmup = sweepSteps, sweepWarmup
			if flagSet(fs, "steps") {
				sw.Steps = c.Steps
			}
			if flagSet(fs, "warmup") {
				sw.Warmup = c.Warmup
			}
		}
		var names []string
		for _, name := range strings.Split(*transports, ",") {
			name = strings.TrimSpace(name)
			if name != "inproc" && name != "grpc" {
				return usageError{fmt.Errorf("--transport %q: want inproc or grpc (comma-separated)", name)}
			}
			names = append(names, name)
		}
		if byNodes && !slices.Contains(names, "grpc") {
			return usageError{fmt.Errorf("--nodes with --transport %s: the processes talk grpc; add it (--transport grpc, or inproc,grpc for goroutine lines too)", *transports)}
		}
		c.Transport, c.NewTransports = names[0], localgroup.NewTransports(ctx, names[0], 0)
		sw.Transport, sw.NewTransports = names[0], localgroup.NewTransports(ctx, names[0], 0)
		if sweep {
			err = sw.Validate()
		} else {
			err = c.Validate()
		}
		if err != nil {
			var re *collective.BenchRangeError
			if errors.As(err, &re) {
				limit := ""
				if re.Limit != "" {
					limit = fmt.Sprintf(" (--%s)", collectiveFlags[re.Limit])
				}
				field := collectiveFlags[re.Field]
				if re.Field == "Shards" {
					field = sizesFlag
				}
				return usageError{fmt.Errorf("--%s %d: want %d to %d%s", field, re.Value, re.Min, re.Max, limit)}
			}
			return usageError{err}
		}
		c.Progress, sw.Progress = stderr, stderr
		lw := newLineWriter(stdout, stderr, *asJSON)
		emit := func(r collective.BenchResult) error { return lw.collective(r, false, nil) }
		emitSweep := func(r collective.SweepResult) error { return lw.sweep(r, false, nil) }
		start := time.Now()
		for _, name := range names {
			c.Transport, c.NewTransports = name, nil
			sw.Transport, sw.NewTransports = name, nil
			switch {
			case sweep && name == "grpc" && byNodes:
				err = sweepNodes(ctx, sw, *timeout, emitSweep)
			case sweep:
				err = localgroup.Sweep(ctx, sw, emitSweep)
			case name == "grpc" && byNodes:
				err = benchNodes(ctx, c, *timeout, emit)
			default:
				err = localgroup.Bench(ctx, c, emit)
			}
			if err != nil {
				return err
			}
		}
		if !*asJSON {
			fmt.Fprintf(stderr, "done in %.1fs\n", time.Since(start).Seconds())
		}
		return nil
	}
}

// sizeList parses a comma-separated list of integers for --name. Ranges
// are BenchConfig.Validate's to check.
func sizeList(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("--%s %q: %q is not an integer (want a comma-separated list)", name, s, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// sizeFlag defines --name, a byte size (8, 4K, 128M: binary units, as
// nccl-tests reads them) stored in p. Ranges are SweepConfig.Validate's to
// check (-1 and 0 parse, and are refused there).
func sizeFlag(fs *flag.FlagSet, p *int64, name, usage string) {
	fs.Func(name, fmt.Sprintf("%s (default %d)", usage, *p), func(s string) error {
		v, err := memlimit.ParseBytes(s)
		if err != nil {
			return fmt.Errorf("%q is not a size (want bytes like 8, 64K or 128M)", s)
		}
		*p = v
		return nil
	})
}
