//go:build !cuda

package main

import (
	"strings"
	"testing"
)

// TestCUDAInCPUBuild: asking a CPU build for the cuda backend is a usage
// error (exit 2, one line) that says how to build for a GPU host.
func TestCUDAInCPUBuild(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--backend", "cuda"},
		{"bench", "attention", "--backend", "cuda"},
		{"generate", "--backend", "cuda", "--model", "/nonexistent", "--prompt", "x"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, "-tags cuda") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}
