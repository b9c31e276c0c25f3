package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/engine"
)

func runBenchSelection(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, benchSelectionCommand, args, stdout, stderr)
}

// benchSelectionCommand builds the flags and the action of
// 'questctl bench selection' without running it (see [runCommand]).
func benchSelectionCommand() (*flag.FlagSet, action) {
	c := bench.DefaultSelectionConfig()
	fs := newFlags("bench selection", `Usage: questctl bench selection [flags]

Compares the CP selection modes on the same data and queries: for each CP
degree and mode, one sparse layer of the in-process engine (CPU) is stepped
--steps times; prints one JSON line per (cp, selection) as soon as it is
measured, with the median step time and its score / selection-exchange /
merge phases on rank 0, the pages read, the fraction of query heads whose
pages equal exact selection's, the fraction of exact's pages each mode
attended, and the attention-mass recall against dense attention. The
shards share one CPU backend, whose calls serialize: merge times include
waiting for the other ranks' kernels. Progress goes to stderr.

Every size is checked before anything is allocated: the run's memory (the
K/V, one engine's pools, diagnostics) must fit --max-memory.`)
	cps := fs.String("cp", "2,4,8", fmt.Sprintf("comma-separated CP degrees (1..%d)", bench.MaxCP))
	modes := fs.String("selection", "exact,union,replicated", "comma-separated modes (put exact first to compare against it)")
	fs.IntVar(&c.Context, "context", c.Context, fmt.Sprintf("tokens of the sequence (1..%d)", bench.MaxContext))
	fs.IntVar(&c.Budget, "budget", c.Budget, fmt.Sprintf("token budget (--page-size..%d)", bench.MaxContext))
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, fmt.Sprintf("tokens per page S (1..%d)", bench.MaxPageSize))
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, fmt.Sprintf("query heads (1..%d, a multiple of --kv-heads)", bench.MaxHeads))
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, fmt.Sprintf("KV heads (1..%d)", bench.MaxHeads))
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, fmt.Sprintf("head dimension D (1..%d)", bench.MaxHeadDim))
	fs.IntVar(&c.Steps, "steps", c.Steps, fmt.Sprintf("timed steps per configuration (1..%d)", bench.MaxIters))
	maxMem := maxMemoryFlag(fs)
	asJSON := fs.Bool("json", false, "no table on stderr: JSON lines on stdout, progress lines on stderr (default also prints a table to stderr)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		if c.CP, err = parseInts("--cp", *cps); err != nil {
			return err
		}
		c.Modes = nil
		for _, m := range strings.Split(*modes, ",") {
			if strings.TrimSpace(m) == "" {
				return usageError{fmt.Errorf("--selection %q: empty entry (want a comma-separated list of exact, union, replicated)", *modes)}
			}
			sel, err := engine.ParseSelection(strings.TrimSpace(m))
			if err != nil {
				return usageError{fmt.Errorf("--selection: %w", err)}
			}
			c.Modes = append(c.Modes, sel)
		}
		c.MemoryLimit = *maxMem
		if err := c.Validate(); err != nil {
			return usageError{err}
		}
		if err := c.Preflight(); err != nil {
			return memoryError(err)
		}
		c.Progress = stderr
		err = bench.Selection(ctx, c, func(r bench.SelectionResult) error {
			if !*asJSON {
				fmt.Fprintf(stderr, "cp %d %-10s: step %.0f us (score %.0f, select %.0f, merge %.0f), %.0f pages read, same pages as exact %.3f, exact's pages recalled %.3f, mass recall %.4f\n",
					r.CP, r.Mode, r.StepUS, r.ScoreUS, r.SelectUS, r.MergeUS, r.PagesRead, r.SamePages, r.ExactRecall, r.MassRecall)
			}
			return bench.WriteJSONLine(stdout, r)
		})
		return memoryError(err)
	}
}
