//go:build cuda

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/questrt/questrt/bench/gpudecode"
	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/model/gpu"
)

// The CUDA backend brackets a profiled step and marks a step's phases.
var (
	_ gpudecode.Profiler = (*cuda.Backend)(nil)
	_ gpu.PhaseMarker    = (*cuda.Backend)(nil)
)

// benchDecodeCUDA runs 'questctl bench decode' on GPU 0.
func benchDecodeCUDA(ctx context.Context, b decodeBench, stdout, stderr io.Writer) error {
	ccfg := cuda.Config{DType: b.Measure.KVDType, SummaryDType: b.summary}
	if err := parseCUDAKernels(b.cudaKernels, &ccfg); err != nil {
		return err
	}
	be, err := cuda.New(ccfg)
	if err != nil {
		return fmt.Errorf("--backend cuda: %w", err)
	}
	defer be.Close()
	return gpudecode.Run(ctx, be, b.Spec, stdout, func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) })
}
