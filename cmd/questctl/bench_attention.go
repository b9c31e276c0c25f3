package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/questrt/questrt/bench"
)

func runBenchAttention(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := bench.DefaultAttentionConfig()
	fs := newFlags("bench attention", `Usage: questctl bench attention [flags]

One layer, one or more sequences of the full context: a Quest step (score +
top-K + sparse attention) and a dense step on the same data, alternated,
median of --iters. Prints one JSON line per (context, budget) with
dense_us, quest_us, score_us, topk_us, attend_us, bytes_read, bytes_dense,
rho_formula (1/S + K/P) and the machine's copy bandwidth measured in the
same run.

With --backend cuda the data live on the GPU, each phase is timed with CUDA
events from a cold L2 (a 256 MiB write before every call, launches queued
ahead), and the lines add per-phase GB/s, roofline times (bytes over the
copy bandwidth), quest_latency_us (one step launched alone on an idle GPU)
and topk_step_us (the top-K right after the score kernel, as inside a
step).`)
	backend := fs.String("backend", "cpu", "kernel backend: cpu, or cuda in a -tags cuda build on a GPU host")
	contexts := fs.String("context", "32768,131072", "comma-separated context lengths in tokens")
	budgets := fs.String("budget", "2048", "comma-separated token budgets")
	batches := fs.String("batch", "1", "comma-separated batch sizes (sequences per step)")
	dtype := fs.String("dtype", "bf16", "cuda storage type: f32, f16 or bf16 (the CPU backend is f32)")
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, "tokens per page S")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.Iters, "iters", c.Iters, "timed steps per configuration")
	asJSON := fs.Bool("json", false, "print JSON lines only (default also prints a table to stderr)")
	cudaKernels := fs.String("cuda-kernels", "", "cuda: tuning overrides, comma-separated: attend=NAME and score=NAME (tensor-core kernel variants of kernels/cuda/mma.cu), score-chunk=N and attend-chunk=N (pages per block / work item)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	var err error
	if c.Contexts, err = intList(*contexts); err != nil {
		return usageError{fmt.Errorf("--context: %w", err)}
	}
	if c.Budgets, err = intList(*budgets); err != nil {
		return usageError{fmt.Errorf("--budget: %w", err)}
	}
	batchList, err := intList(*batches)
	if err != nil {
		return usageError{fmt.Errorf("--batch: %w", err)}
	}
	switch *backend {
	case "cpu":
	case "cuda":
		return benchCUDA(ctx, c, batchList, *dtype, *cudaKernels, *asJSON, stdout, stderr)
	default:
		return usageError{fmt.Errorf("unknown backend %q (want cpu or cuda)", *backend)}
	}
	c.Progress = stderr
	start := time.Now()
	for _, b := range batchList {
		c.Batch = b
		err = bench.Attention(ctx, c, func(r bench.AttentionResult) error {
			if !*asJSON {
				fmt.Fprintf(stderr, "context %d batch %d budget %d: dense %.0f us, quest %.0f us (score %.0f, top-K %.0f, attend %.0f), %.1fx; rho %.4f (formula %.4f); dense %.1f GB/s, copy %.1f GB/s\n",
					r.Context, r.Batch, r.Budget, r.DenseUS, r.QuestUS, r.ScoreUS, r.TopKUS, r.AttendUS, r.Speedup, r.RhoBytes, r.RhoFormula, r.DenseGBps, r.CopyGBps)
			}
			return bench.WriteJSONLine(stdout, r)
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
