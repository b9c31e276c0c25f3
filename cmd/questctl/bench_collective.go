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

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/grpctransport"
)

// collectiveFlags maps the BenchConfig fields that BenchRangeError names to
// their flags.
var collectiveFlags = map[string]string{
	"Shards": "shards", "Batches": "batch", "Steps": "steps", "Warmup": "warmup",
	"KVHeads": "kv-heads", "QHeads": "q-heads", "HeadDim": "head-dim",
	"PageBudget": "k", "Pages": "pages",
}

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

Sizes must be at least 1 (--warmup 0 is allowed); at most %d shards,
%d to %d nodes, a batch of %d, %d KV or query heads, a head dimension of
%d, %d pages (--k at most --pages) and %d steps. A configuration whose
data do not fit --max-memory (all ranks together) is refused before it
runs.`,
		collective.MaxBenchShards, 2, maxBenchNodes, collective.MaxBenchBatch, collective.MaxBenchHeads,
		collective.MaxBenchHeadDim, collective.MaxBenchPages, collective.MaxBenchSteps))
	shards := fs.String("shards", "2,4,8,16", "comma-separated CP group sizes, all ranks goroutines of this process")
	nodes := fs.String("nodes", "", fmt.Sprintf("comma-separated CP group sizes, every grpc rank in its own process (2 to %d; instead of --shards)", maxBenchNodes))
	timeout := fs.Duration("timeout", defaultNodesTimeout, "with --nodes: the longest one configuration may take, from starting its processes to their reports")
	batches := fs.String("batch", "1,16", "comma-separated batch sizes")
	transports := fs.String("transport", c.Transport, "comma-separated transports: inproc, grpc")
	fs.IntVar(&c.Steps, "steps", c.Steps, "measured layer-steps per configuration")
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, "unmeasured layer-steps run first")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads (selection rows per sequence)")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads (merged states per sequence)")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.PageBudget, "k", c.PageBudget, "pages selected per row (K)")
	fs.IntVar(&c.Pages, "pages", c.Pages, "pages per sequence, striped over the shards")
	maxMem := maxMemoryFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON lines only on stdout (default also prints a table to stderr; progress goes to stderr either way)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		byNodes := flagSet(fs, "nodes")
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
				if n < 2 || n > maxBenchNodes {
					return usageError{fmt.Errorf("--nodes %d: want 2 to %d (one process per rank; --shards runs 1)", n, maxBenchNodes)}
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
		c.Transport, c.NewTransports = names[0], nil
		if c.Transport == "grpc" {
			c.NewTransports = grpcGroup(ctx)
		}
		if err := c.Validate(); err != nil {
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
		c.Progress = stderr
		emit := func(r collective.BenchResult) error {
			if err := bench.WriteJSONLine(stdout, r); err != nil {
				return err
			}
			if !*asJSON {
				how := ""
				if r.Processes > 1 {
					how = fmt.Sprintf(" (%d processes)", r.Processes)
				}
				fmt.Fprintf(stderr, "%-6s shards %2d batch %2d: select p50 %.1f p99 %.1f us, merge p50 %.1f p99 %.1f us, %d + %d bytes/step%s\n",
					r.Transport, r.Shards, r.Batch, r.SelectP50, r.SelectP99, r.MergeP50, r.MergeP99, r.SelectBytes, r.MergeBytes, how)
			}
			return nil
		}
		start := time.Now()
		for _, name := range names {
			c.Transport, c.NewTransports = name, nil
			if name == "grpc" && byNodes {
				err = benchNodes(ctx, c, *timeout, emit)
			} else {
				if name == "grpc" {
					c.NewTransports = grpcGroup(ctx)
				}
				err = collective.BenchCollective(ctx, c, emit)
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

// grpcGroup returns a NewTransports that builds an n-rank gRPC group on
// 127.0.0.1 (plaintext loopback streams, ephemeral ports).
func grpcGroup(ctx context.Context) func(n int) ([]collective.Transport, error) {
	return func(n int) ([]collective.Transport, error) {
		cfg := grpctransport.DefaultConfig()
		cfg.Plaintext = true
		g, err := grpctransport.NewLocalGroup(ctx, n, cfg)
		if err != nil {
			return nil, fmt.Errorf("grpc group of %d: %w", n, err)
		}
		trs := make([]collective.Transport, n)
		for i, t := range g {
			trs[i] = t
		}
		return trs, nil
	}
}
