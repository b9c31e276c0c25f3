//go:build !nvml && !cuda

package cluster

import (
	"errors"
	"testing"
)

// TestDiscoverDefaultBuild: the default (cgo-free) build has no NVML and
// says so with an error that still reads as ErrNoNVML to CPU fallbacks.
func TestDiscoverDefaultBuild(t *testing.T) {
	_, err := Discover()
	if !errors.Is(err, ErrNoDiscovery) || !errors.Is(err, ErrNoNVML) {
		t.Fatalf("Discover() = %v, want ErrNoDiscovery wrapping ErrNoNVML", err)
	}
}
