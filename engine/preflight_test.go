package engine

import (
	"errors"
	"testing"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestNewPreflight: the engine sums the host pools of all CP x TP shards
// (and replicated selection's summary mirrors) and refuses a configuration
// over its MemoryLimit before creating any shard.
func TestNewPreflight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.CapacityPages = 2, 4, 2, 8, 16
	cfg.CP, cfg.TP = 2, 2
	per, err := pagestore.Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 1, HeadDim: 8, PageSize: 16}, Capacity: 16}.HostBytes()
	if err != nil {
		t.Fatal(err)
	}
	cfg.MemoryLimit = 4 * per
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("4 shards at the limit: %v", err)
	}
	e.Close()
	cfg.MemoryLimit = 4*per - 1
	if _, err := New(cfg); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
	// Replicated selection adds each rank's mirror of its group's summaries.
	cfg.MemoryLimit = 4 * per
	cfg.Selection = Replicated
	if _, err := New(cfg); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Fatalf("replicated mirrors not counted: %v", err)
	}
	cfg.CapacityPages = 1 << 40
	cfg.MemoryLimit = memlimit.Auto
	if _, err := New(cfg); err == nil {
		t.Fatal("2^40 pages per shard accepted")
	}
}
