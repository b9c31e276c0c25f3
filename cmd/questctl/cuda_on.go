//go:build cuda

package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/plan"
)

// newCUDABackend starts a CUDA backend on GPU 0 storing dtype.
func newCUDABackend(dtype string) (kernels.Backend, error) {
	return newCUDABackendSummary(dtype, plan.SummaryKV)
}

// newCUDABackendSummary is newCUDABackend with the summaries stored as
// summary (--summary-dtype).
func newCUDABackendSummary(dtype string, summary plan.SummaryDType) (kernels.Backend, error) {
	dt, err := plan.ParseDType(dtype)
	if err != nil {
		return nil, usageError{err}
	}
	return cuda.New(cuda.Config{DType: dt, SummaryDType: summary})
}

// benchCUDA runs the device-resident attention benchmark on GPU 0.
func benchCUDA(ctx context.Context, c bench.AttentionConfig, batches []int, dtype string, summary plan.SummaryDType, kernelSpec string, asJSON bool, stdout, stderr io.Writer) error {
	dt, err := plan.ParseDType(dtype)
	if err != nil {
		return usageError{err}
	}
	cfg := cuda.Config{DType: dt, SummaryDType: summary}
	if err := parseCUDAKernels(kernelSpec, &cfg); err != nil {
		return err
	}
	b, err := cuda.New(cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	bcfg := cuda.BenchConfig{Contexts: c.Contexts, Batches: batches, Budgets: c.Budgets, QHeads: c.QHeads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, PageSize: c.PageSize, DType: dt, Iters: c.Iters}
	return b.BenchAttention(ctx, bcfg, func(r cuda.BenchResult) error {
		if !asJSON {
			fmt.Fprintf(stderr, "%s ctx %7d batch %d budget %4d: dense %8.1f us (%5.0f GB/s, %.0f%% of copy), quest %7.1f us (score %6.1f = %.0f%% of copy, top-K %5.1f (in step %5.1f), attend %5.1f; alone %6.1f; served %6.1f, queued %6.1f) %5.1fx, rho %.4f\n",
				r.DType, r.Context, r.Batch, r.Budget, r.DenseUS, r.DenseGBps, 100*r.DenseOfCopy, r.QuestUS, r.ScoreUS, 100*r.ScoreGBps/r.CopyGBps, r.TopKUS, r.TopKStepUS, r.AttendUS, r.QuestLatencyUS, r.ServedUS, r.ServedQueuedUS, r.Speedup, r.RhoFormula)
		}
		return bench.WriteJSONLine(stdout, r)
	})
}

// parseCUDAKernels sets the tuning overrides of --cuda-kernels (attend=NAME,
// score=NAME, prefill=NAME, topk=PATH, score-chunk=N, attend-chunk=N, uploads=always,
// comma-separated)
// in cfg; the backend checks the names when it starts.
func parseCUDAKernels(spec string, cfg *cuda.Config) error {
	if spec == "" {
		return nil
	}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case ok && k == "attend":
			cfg.AttendKernel = v
		case ok && k == "score":
			cfg.ScoreKernel = v
		case ok && k == "prefill":
			var names []string
			for _, a := range cuda.AttendKernels() {
				names = append(names, a.String())
			}
			if !slices.Contains(names, v) {
				return usageError{fmt.Errorf("--cuda-kernels: prefill=%q is not a compiled prefill attention (%s)", v, strings.Join(names, ", "))}
			}
			cfg.PrefillKernel = v
		case ok && k == "topk":
			cfg.TopKPath = v
		case ok && k == "uploads":
			if v != "always" {
				return usageError{fmt.Errorf("--cuda-kernels: uploads=%q: the only value is always", v)}
			}
			cfg.AlwaysUpload = true
		case ok && (k == "score-chunk" || k == "attend-chunk"):
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return usageError{fmt.Errorf("--cuda-kernels: %s wants a positive number of pages, not %q", k, v)}
			}
			if k == "score-chunk" {
				cfg.ScoreChunk = n
			} else {
				cfg.AttendChunk = n
			}
		default:
			return usageError{fmt.Errorf("--cuda-kernels: %q is not attend=NAME, score=NAME, prefill=NAME, topk=PATH, score-chunk=N, attend-chunk=N or uploads=always", kv)}
		}
	}
	return nil
}
