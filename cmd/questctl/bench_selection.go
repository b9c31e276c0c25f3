package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/engine"
)

func runBenchSelection(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := bench.DefaultSelectionConfig()
	fs := newFlags("bench selection", `Usage: questctl bench selection [flags]

Compares the CP selection modes on the same data and queries: for each CP
degree and mode, one sparse layer of the in-process engine (CPU) is stepped
--steps times; prints one JSON line per (cp, selection) with the median
step time and its score / selection-exchange / merge phases on rank 0, the
pages read, the fraction of query heads whose pages equal exact selection's,
the fraction of exact's pages each mode attended, and the attention-mass
recall against dense attention. The shards share one CPU backend, whose
calls serialize: merge times include waiting for the other ranks' kernels.`)
	cps := fs.String("cp", "2,4,8", "comma-separated CP degrees")
	modes := fs.String("selection", "exact,union,replicated", "comma-separated modes (put exact first to compare against it)")
	fs.IntVar(&c.Context, "context", c.Context, "tokens of the sequence")
	fs.IntVar(&c.Budget, "budget", c.Budget, "token budget")
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, "tokens per page S")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.Steps, "steps", c.Steps, "timed steps per configuration")
	asJSON := fs.Bool("json", false, "print JSON lines only (default also prints a table to stderr)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	var err error
	if c.CP, err = intList(*cps); err != nil {
		return usageError{fmt.Errorf("--cp: %w", err)}
	}
	c.Modes = nil
	for _, m := range strings.Split(*modes, ",") {
		sel, err := engine.ParseSelection(strings.TrimSpace(m))
		if err != nil {
			return usageError{err}
		}
		c.Modes = append(c.Modes, sel)
	}
	if c.Context < 1 || c.Steps < 1 || c.Budget < c.PageSize || c.QHeads%c.KVHeads != 0 {
		return usageError{fmt.Errorf("context and steps must be positive, the budget at least one page, and q-heads a multiple of kv-heads")}
	}
	if !*asJSON {
		c.Progress = stderr
	}
	return bench.Selection(ctx, c, func(r bench.SelectionResult) error {
		if !*asJSON {
			fmt.Fprintf(stderr, "cp %d %-10s: step %.0f us (score %.0f, select %.0f, merge %.0f), %.0f pages read, same pages as exact %.3f, exact's pages recalled %.3f, mass recall %.4f\n",
				r.CP, r.Mode, r.StepUS, r.ScoreUS, r.SelectUS, r.MergeUS, r.PagesRead, r.SamePages, r.ExactRecall, r.MassRecall)
		}
		return bench.WriteJSONLine(stdout, r)
	})
}
