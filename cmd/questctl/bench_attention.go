package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

func runBenchAttention(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, benchAttentionCommand, args, stdout, stderr)
}

// benchAttentionCommand builds the flags and the action of
// 'questctl bench attention' without running it (see [runCommand]).
func benchAttentionCommand() (*flag.FlagSet, action) {
	c := bench.DefaultAttentionConfig()
	fs := newFlags("bench attention", `Usage: questctl bench attention [flags]

One layer, one or more sequences of the full context: a Quest step (score +
top-K + sparse attention) as a server runs it (on the CPU one fused backend
call), a dense step, and the Quest step again as three separate backend
calls, on the same data, alternated, median of --iters. Prints one JSON
line per (batch, context, budget) as soon as it is measured, with dense_us,
quest_us (the served step), phased_us (the three-call step) and its phases
score_us, topk_us and attend_us, bytes_read, bytes_dense, pages (P),
k_pages (K = budget/S), rho_formula (1/S + K/P) and the machine's copy
bandwidth measured in the same run. A budget of at least the whole context
runs with K capped at P (budget_capped: every step reads every page, and
rho_formula is 1 + 1/S). Progress goes to stderr.

Every size is checked before anything is allocated: each configuration's
memory (K/V pool, buffers, scratch) must fit --max-memory, and so must
the two 256 MiB buffers of the copy-bandwidth measurement (so the CPU
benchmark needs --max-memory of at least 512 MiB).

With --backend cuda the data live on the GPU, each phase is timed with CUDA
events from a cold L2 (a 256 MiB write before every call, launches queued
ahead), and the lines add per-phase GB/s, roofline times (bytes over the
copy bandwidth), quest_latency_us (one step launched alone on an idle GPU),
topk_step_us (the top-K right after the score kernel, as inside a step),
served_us (the step through the backend's Step call as a server makes it,
wall time: uploads, device page tables, kernels, outputs back; cold L2)
and served_queued_us (32 queued steps and one synchronisation, wall time
per step: the stream-ordered path of a caller running many layers; warm
L2 where one layer's summaries fit in it).`)
	backend := fs.String("backend", "cpu", "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host")
	contexts := fs.String("context", "32768,131072", fmt.Sprintf("comma-separated context lengths in tokens (1..%d)", bench.MaxContext))
	budgets := fs.String("budget", "2048", fmt.Sprintf("comma-separated token budgets (--page-size..%d; K is capped at the context's pages)", bench.MaxContext))
	batches := fs.String("batch", "1", fmt.Sprintf("comma-separated batch sizes, sequences per step (1..%d)", bench.MaxBatch))
	dtype := kvCacheDTypeFlag(fs, "")
	summary := summaryDTypeFlag(fs, "; fp8 needs --backend cuda here")
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, fmt.Sprintf("tokens per page S (1..%d)", bench.MaxPageSize))
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, fmt.Sprintf("query heads (1..%d, a multiple of --kv-heads)", bench.MaxHeads))
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, fmt.Sprintf("KV heads (1..%d)", bench.MaxHeads))
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, fmt.Sprintf("head dimension D (1..%d)", bench.MaxHeadDim))
	fs.IntVar(&c.Iters, "iters", c.Iters, fmt.Sprintf("timed steps per configuration (1..%d)", bench.MaxIters))
	maxMem := maxMemoryFlag(fs)
	asJSON := fs.Bool("json", false, "no table on stderr: JSON lines on stdout, progress lines on stderr (default also prints a table to stderr)")
	cudaKernels := fs.String("cuda-kernels", "", "cuda: tuning overrides, comma-separated: attend=NAME and score=NAME (tensor-core kernel variants of kernels/cuda/mma.cu; score=quest_score8 scores fp8 summaries on the CUDA cores), topk=thr|twostage|radix|onestage (force a top-K kernel), score-chunk=N and attend-chunk=N (pages per block / work item), uploads=always (copy a call's inputs even when the device holds the same bytes)")
	plotOut := fs.String("plot", "", "after the run, draw time per step vs context (log-log) from its JSON lines to this PNG file (as 'questctl plot')")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		if c.Contexts, err = parseInts("--context", *contexts); err != nil {
			return err
		}
		if c.Budgets, err = parseInts("--budget", *budgets); err != nil {
			return err
		}
		batchList, err := parseInts("--batch", *batches)
		if err != nil {
			return err
		}
		c.MemoryLimit = *maxMem
		// --plot keeps a copy of the JSON lines for the figure.
		var plotLines bytes.Buffer
		if *plotOut != "" {
			if err := checkPlotOut("--plot", *plotOut); err != nil {
				return err
			}
			stdout = io.MultiWriter(stdout, &plotLines)
		}
		// Every configuration is checked before the first one runs.
		for _, b := range batchList {
			c.Batch = b
			if err := c.Validate(); err != nil {
				return usageError{err}
			}
		}
		switch *backend {
		case "cpu":
			if name := givenAs(fs, "kv-cache-dtype"); name != "" {
				return usageError{fmt.Errorf("%s needs --backend cuda (the CPU backend stores float32)", name)}
			}
			if flagSet(fs, "cuda-kernels") {
				return usageError{errors.New("--cuda-kernels needs --backend cuda")}
			}
			if summary.types[0] != plan.SummaryKV {
				return usageError{errors.New("--summary-dtype fp8 needs --backend cuda (the CPU benchmark times float32 summaries)")}
			}
		case "cuda":
			if flagSet(fs, "max-memory") {
				return usageError{errors.New("--max-memory needs --backend cpu (the CUDA benchmark's data live in GPU memory; it skips configurations over 64 GiB of K/V)")}
			}
			return plotAttention(*plotOut, &plotLines, benchCUDA(ctx, c, batchList, *dtype, summary.types[0], *cudaKernels, *asJSON, stdout, stderr))
		default:
			return usageError{fmt.Errorf("unknown backend %q (want cpu or cuda)", *backend)}
		}
		for _, b := range batchList {
			c.Batch = b
			if err := c.Preflight(); err != nil {
				return memoryError(err)
			}
		}
		c.Progress = stderr
		start := time.Now()
		for _, b := range batchList {
			c.Batch = b
			err = bench.Attention(ctx, c, func(r bench.AttentionResult) error {
				if !*asJSON {
					capped := ""
					if r.BudgetCapped {
						capped = fmt.Sprintf("; the budget covers the context: K capped at P = %d pages, every step reads every page", r.Pages)
					}
					fmt.Fprintf(stderr, "context %d batch %d budget %d: dense %.0f us, quest %.0f us (phased %.0f us: score %.0f, top-K %.0f, attend %.0f), %.1fx; rho %.4f (formula %.4f, K %d of P %d); dense %.1f GB/s, copy %.1f GB/s%s\n",
						r.Context, r.Batch, r.Budget, r.DenseUS, r.QuestUS, r.PhasedUS, r.ScoreUS, r.TopKUS, r.AttendUS, r.Speedup,
						r.RhoBytes, r.RhoFormula, r.KPages, r.Pages, r.DenseGBps, r.CopyGBps, capped)
				}
				return bench.WriteJSONLine(stdout, r)
			})
			if err != nil {
				return memoryError(err)
			}
		}
		if !*asJSON {
			fmt.Fprintf(stderr, "done in %.1fs\n", time.Since(start).Seconds())
		}
		return plotAttention(*plotOut, &plotLines, nil)
	}
}

// parseInts reads a comma-separated list of integers for flag. Ranges are
// the configs' Validate's business, so that its errors name them.
func parseInts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, usageError{fmt.Errorf("%s: %q is not an integer", flag, f)}
		}
		out = append(out, n)
	}
	return out, nil
}

// memoryError turns a configuration refused by the memory preflight into
// a usage error (exit 2): the command asked for more than it may have.
func memoryError(err error) error {
	if errors.Is(err, memlimit.ErrTooLarge) {
		return usageError{err}
	}
	return err
}
