package pagestore

import (
	"errors"
	"testing"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// TestNewRefusesOversizedPools: New computes the pools' bytes from the
// geometry and refuses a configuration over MemoryLimit (or over the
// machine's available memory) before allocating, with an error that says
// how much it needs; one that fits is created.
func TestNewRefusesOversizedPools(t *testing.T) {
	cfg := Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 2, HeadDim: 8, PageSize: 16}, Capacity: 4}
	need, err := cfg.HostBytes()
	if err != nil {
		t.Fatal(err)
	}
	// 2 layers x (K+V: 4 pages x 2 heads x 16 slots x 8 dims + summaries:
	// 4 x 2 x 2 x 8) x 4 bytes, plus 8 bytes per page.
	if want := int64(2*(2*4*2*16*8+4*2*2*8)*4 + 4*8); need != want {
		t.Fatalf("HostBytes = %d, want %d", need, want)
	}
	cfg.MemoryLimit = need
	if _, err := New(cfg); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	cfg.MemoryLimit = need - 1
	if _, err := New(cfg); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Fatalf("one byte over the limit: %v", err)
	}
	// A 155-byte replay case once asked for a page of 2^31 slots; the Go
	// runtime crashed allocating it. Now the available-memory check refuses.
	huge := Config{Layers: 1, Geometry: plan.Geometry{KVHeads: 1, HeadDim: 64, PageSize: 1 << 31}, Capacity: 1}
	if _, err := New(huge); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Fatalf("huge page: %v", err)
	}
	bad := cfg
	bad.MemoryLimit = -2
	if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("MemoryLimit -2: %v", err)
	}
}
