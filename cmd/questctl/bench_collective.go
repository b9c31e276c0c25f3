package main

import (
	"context"
	"fmt"
	"io"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/collective"
)

func runBenchCollective(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := collective.DefaultBenchConfig()
	fs := newFlags("bench collective", `Usage: questctl bench collective [flags]

Per layer-step latency of the collectives of a CP group: the exact
selection exchange (all-gather of each rank's local top-K candidates, every
rank derives the same global top-K) and the merge of partial states to
rank 0, on N goroutines over the chosen transport. Prints one JSON line per
(shards, batch) with p50/p95/p99 latencies in microseconds and bytes sent.`)
	shards := fs.String("shards", "2,4,8,16", "comma-separated CP group sizes")
	batches := fs.String("batch", "1,16", "comma-separated batch sizes")
	fs.StringVar(&c.Transport, "transport", c.Transport, "transport: inproc")
	fs.IntVar(&c.Steps, "steps", c.Steps, "measured layer-steps per configuration")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads (selection rows per sequence)")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads (merged states per sequence)")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.PageBudget, "k", c.PageBudget, "pages selected per row (K)")
	asJSON := fs.Bool("json", false, "print JSON lines only (default also prints a table to stderr)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	var err error
	if c.Shards, err = intList(*shards); err != nil {
		return usageError{fmt.Errorf("--shards: %w", err)}
	}
	if c.Batches, err = intList(*batches); err != nil {
		return usageError{fmt.Errorf("--batch: %w", err)}
	}
	if err := c.Validate(); err != nil {
		return usageError{err}
	}
	res, err := collective.BenchCollective(ctx, c)
	for _, r := range res {
		if !*asJSON {
			fmt.Fprintf(stderr, "shards %2d batch %2d: select p50 %.1f p99 %.1f us, merge p50 %.1f p99 %.1f us, %d + %d bytes/step\n",
				r.Shards, r.Batch, r.SelectP50, r.SelectP99, r.MergeP50, r.MergeP99, r.SelectBytes, r.MergeBytes)
		}
		if werr := bench.WriteJSONLine(stdout, r); werr != nil {
			return werr
		}
	}
	return err
}
