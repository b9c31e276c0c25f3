//go:build !cuda

package main

import (
	"log/slog"
	"strings"
	"testing"
)

// TestBackendCUDANeedsTag: a CPU build refuses --backend cuda with a
// message that says how to get it, and runs --backend cpu on the worker
// server's own backend (no device).
func TestBackendCUDANeedsTag(t *testing.T) {
	if _, _, err := openDevices(Config{Devices: DeviceConfig{Backend: "cuda"}}, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "-tags cuda") {
		t.Fatalf("--backend cuda in a CPU build: %v", err)
	}
	devs, closeDevs, err := openDevices(Config{Devices: DeviceConfig{Backend: "cpu"}}, slog.New(slog.DiscardHandler))
	if err != nil || len(devs) != 0 {
		t.Fatalf("--backend cpu: %d devices, %v", len(devs), err)
	}
	closeDevs()
}

// TestBackendCUDARefusedAtLoad: in a CPU build --backend cuda is a usage
// error found with the other flag checks (one line, exit 2), and the
// checks that need a cuda build's --backend cuda are not reached.
func TestBackendCUDARefusedAtLoad(t *testing.T) {
	for _, args := range [][]string{{"--backend", "cuda"}, {"--backend", "cuda", "--data-dir", "/tmp/x"}} {
		_, err := load(t, nil, append([]string{"--plaintext"}, args...)...)
		if err == nil || !strings.HasPrefix(err.Error(), `--backend "cuda": needs a questd built with -tags cuda`) {
			t.Errorf("%v: %v", args, err)
		}
	}
}
