package main

import (
	"context"
	"errors"
	"fmt"
	"io"
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

Sizes must be at least 1 (--warmup 0 is allowed); at most %d shards, a
batch of %d, %d KV or query heads, a head dimension of %d, %d pages
(--k at most --pages) and %d steps. A configuration whose data do not fit
--max-memory is refused before it runs.`,
		collective.MaxBenchShards, collective.MaxBenchBatch, collective.MaxBenchHeads,
		collective.MaxBenchHeadDim, collective.MaxBenchPages, collective.MaxBenchSteps))
	shards := fs.String("shards", "2,4,8,16", "comma-separated CP group sizes")
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
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	var err error
	if c.Shards, err = sizeList("shards", *shards); err != nil {
		return usageError{err}
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
	c.Transport = names[0]
	if err := c.Validate(); err != nil {
		var re *collective.BenchRangeError
		if errors.As(err, &re) {
			limit := ""
			if re.Limit != "" {
				limit = fmt.Sprintf(" (--%s)", collectiveFlags[re.Limit])
			}
			return usageError{fmt.Errorf("--%s %d: want %d to %d%s", collectiveFlags[re.Field], re.Value, re.Min, re.Max, limit)}
		}
		return usageError{err}
	}
	c.Progress = stderr
	start := time.Now()
	for _, name := range names {
		c.Transport, c.NewTransports = name, nil
		if name == "grpc" {
			c.NewTransports = grpcGroup(ctx)
		}
		err = collective.BenchCollective(ctx, c, func(r collective.BenchResult) error {
			if err := bench.WriteJSONLine(stdout, r); err != nil {
				return err
			}
			if !*asJSON {
				fmt.Fprintf(stderr, "%-6s shards %2d batch %2d: select p50 %.1f p99 %.1f us, merge p50 %.1f p99 %.1f us, %d + %d bytes/step\n",
					r.Transport, r.Shards, r.Batch, r.SelectP50, r.SelectP99, r.MergeP50, r.MergeP99, r.SelectBytes, r.MergeBytes)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if !*asJSON {
		fmt.Fprintf(stderr, "done in %.1fs\n", time.Since(start).Seconds())
	}
	return nil
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
