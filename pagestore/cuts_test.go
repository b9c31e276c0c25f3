package pagestore

import (
	"errors"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestCuts: appends and forks leave a sequence's cut count alone; each
// rollback and truncation bumps it; an unknown sequence is an error.
func TestCuts(t *testing.T) {
	s := mustStore(t, Config{Layers: 1, Geometry: plan.Geometry{KVHeads: 1, HeadDim: 2, PageSize: 3}, Capacity: 16})
	id := s.Create()
	want := func(id SeqID, n uint64) {
		t.Helper()
		if got, err := s.Cuts(id); err != nil || got != n {
			t.Fatalf("seq %d: Cuts = %d, %v; want %d", id, got, err, n)
		}
	}
	want(id, 0)
	kv := make([]float32, 10*2)
	if err := s.Append(id, 0, kv, kv); err != nil {
		t.Fatal(err)
	}
	want(id, 0)
	child, err := s.Fork(id)
	if err != nil {
		t.Fatal(err)
	}
	want(child, 0)
	if err := s.Rollback(id, 4); err != nil {
		t.Fatal(err)
	}
	want(id, 1)
	want(child, 0)
	if err := s.Truncate(id, []int{2}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Cuts(id); got < 2 {
		t.Fatalf("after truncate: Cuts = %d, want at least 2", got)
	}
	if _, err := s.Cuts(999); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("unknown sequence: %v", err)
	}
}
