//go:build cuda

package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
)

// The CUDA backend brackets a profiled step and marks a step's phases.
var (
	_ gpu.Profiler    = (*cuda.Backend)(nil)
	_ gpu.PhaseMarker = (*cuda.Backend)(nil)
)

// benchDecodeCUDA runs 'questctl bench decode' on GPU 0.
func benchDecodeCUDA(ctx context.Context, b decodeBench, stdout, stderr io.Writer) error {
	ccfg := cuda.Config{DType: b.kvDType, SummaryDType: b.summary}
	if err := parseCUDAKernels(b.cudaKernels, &ccfg); err != nil {
		return err
	}
	be, err := cuda.New(ccfg)
	if err != nil {
		return fmt.Errorf("--backend cuda: %w", err)
	}
	defer be.Close()
	maxBatch := 0
	for _, n := range b.batches {
		maxBatch = max(maxBatch, n)
	}
	opt := gpu.Options{Float32Weights: b.f32Weights, MaxBatch: maxBatch, NoPDL: b.noPDL}
	t0 := time.Now()
	var x *gpu.Executor
	w, a := gpu.Need(b.cfg, opt)
	if err := gpu.Admit(ctx, be, w+a, fmt.Sprintf("the weights (%.2f GB) and activations (%.2f GB)", float64(w)/1e9, float64(a)/1e9)); err != nil {
		return err // before a checkpoint is read
	}
	if b.modelDir != "" {
		fmt.Fprintf(stderr, "weights: loading %s ...\n", b.modelDir)
		m, err := model.Load(b.modelDir, model.LoadOptions{})
		if err != nil {
			return err
		}
		x, err = gpu.New(ctx, be, m, opt)
		m.Close()
	} else {
		fmt.Fprintf(stderr, "weights: %d random parameters on the GPU ...\n", b.cfg.Params())
		x, err = gpu.NewRandom(ctx, be, b.cfg, b.seed, opt)
	}
	if err != nil {
		return err
	}
	defer x.Close(ctx)
	fmt.Fprintf(stderr, "weights: %.2f GB on the GPU in %v\n", float64(x.WeightBytes())/1e9, time.Since(t0).Round(time.Millisecond))
	pol := b.pol
	cfg := gpu.BenchConfig{Contexts: b.contexts, Batches: b.batches, Warmup: b.warmup, Steps: b.steps, Policy: &pol,
		KVDType: b.kvDType, Dense: b.dense, Seed: b.seed, Profile: b.profileRange, Phases: b.phases}
	if err := gpu.Bench(ctx, be, x, cfg, func(r gpu.BenchResult) error { return bench.WriteJSONLine(stdout, r) },
		func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }); err != nil {
		return err
	}
	if len(b.prefill) == 0 {
		return nil
	}
	if g, why := be.GemmEngine(ctx); why != nil {
		fmt.Fprintf(stderr, "prefill projections on %s (%v)\n", g, why)
	}
	return gpu.BenchPrefill(ctx, be, x, b.prefill, b.kvDType, 2, func(r gpu.PrefillResult) error { return bench.WriteJSONLine(stdout, r) })
}
