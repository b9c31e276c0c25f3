//go:build cuda

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/cuda"
)

// newCUDABackend starts a CUDA backend on GPU 0 storing dtype.
func newCUDABackend(dtype string) (kernels.Backend, error) {
	dt, err := cuda.ParseDType(dtype)
	if err != nil {
		return nil, usageError{err}
	}
	return cuda.New(cuda.Config{DType: dt})
}

// benchCUDA runs the device-resident attention benchmark on GPU 0.
func benchCUDA(ctx context.Context, c bench.AttentionConfig, batches []int, dtype string, asJSON bool, stdout, stderr io.Writer) error {
	dt, err := cuda.ParseDType(dtype)
	if err != nil {
		return usageError{err}
	}
	b, err := cuda.New(cuda.Config{DType: dt})
	if err != nil {
		return err
	}
	defer b.Close()
	cfg := cuda.BenchConfig{Contexts: c.Contexts, Batches: batches, Budgets: c.Budgets, QHeads: c.QHeads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, PageSize: c.PageSize, DType: dt, Iters: c.Iters}
	return b.BenchAttention(ctx, cfg, func(r cuda.BenchResult) error {
		if !asJSON {
			fmt.Fprintf(stderr, "%s ctx %7d batch %d budget %4d: dense %8.1f us (%5.0f GB/s, %.0f%% of copy), quest %7.1f us (score %6.1f, top-K %5.1f, attend %5.1f) %5.1fx, rho %.4f\n",
				r.DType, r.Context, r.Batch, r.Budget, r.DenseUS, r.DenseGBps, 100*r.DenseOfCopy, r.QuestUS, r.ScoreUS, r.TopKUS, r.AttendUS, r.Speedup, r.RhoFormula)
		}
		return bench.WriteJSONLine(stdout, r)
	})
}
