//go:build !cuda

package main

import (
	"context"
	"errors"
	"io"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// benchCUDA is unavailable in the default (CPU) build.
func benchCUDA(context.Context, bench.AttentionConfig, []int, string, plan.SummaryDType, string, bool, io.Writer, io.Writer) error {
	return usageError{errors.New("backend cuda needs a build with -tags cuda (see README: building for a GPU host)")}
}

// newCUDABackend is unavailable in the default (CPU) build.
func newCUDABackend(string) (kernels.Backend, error) {
	return nil, usageError{errors.New("backend cuda needs a build with -tags cuda (see README: building for a GPU host)")}
}

// newCUDABackendSummary is unavailable in the default (CPU) build.
func newCUDABackendSummary(dtype string, _ plan.SummaryDType) (kernels.Backend, error) {
	return newCUDABackend(dtype)
}

// cudaAvailable reports that this build has no CUDA backend.
func cudaAvailable() error {
	return usageError{errors.New("backend cuda needs a build with -tags cuda (see README: building for a GPU host)")}
}

// generateCUDA is unavailable in the default (CPU) build.
func generateCUDA(context.Context, gpuGenerate, io.Writer, io.Writer) error { return cudaAvailable() }

// benchDecodeCUDA is unavailable in the default (CPU) build.
func benchDecodeCUDA(context.Context, decodeBench, io.Writer, io.Writer) error {
	return cudaAvailable()
}
