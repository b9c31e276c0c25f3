//go:build cuda

package main

import (
	"strings"
	"testing"
)

// TestBackendCUDADataDir: a cuda build refuses --data-dir with --backend
// cuda (pages in GPU memory do not persist).
func TestBackendCUDADataDir(t *testing.T) {
	_, err := load(t, nil, "--plaintext", "--backend", "cuda", "--data-dir", "/tmp/x")
	if err == nil || !strings.HasPrefix(err.Error(), `--data-dir "/tmp/x": not with --backend cuda`) {
		t.Fatalf("got %v", err)
	}
}
