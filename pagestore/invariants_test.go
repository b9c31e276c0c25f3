package pagestore

import (
	"strings"
	"testing"

	"github.com/questrt/questrt/internal/invariants"
	"github.com/questrt/questrt/plan"
)

// TestCheckInvariants: a store after appends, forks, a rollback and a
// release passes; each kind of damage to its bookkeeping, made by hand,
// is named.
func TestCheckInvariants(t *testing.T) {
	cfg := Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 1, HeadDim: 2, PageSize: 4}, Capacity: 16}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := s.Create()
	tok := make([]float32, 2)
	for range 10 { // 3 pages, the last holding 2 tokens
		for l := range 2 {
			if err := s.Append(a, l, tok, tok); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, err := s.Fork(a)
	if err != nil {
		t.Fatal(err)
	}
	for l := range 2 { // b copies the shared tail page
		if err := s.Append(b, l, tok, tok); err != nil {
			t.Fatal(err)
		}
	}
	c, err := s.ForkPrefix(a, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Rollback(a, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(c); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatalf("a healthy store: %v", err)
	}
	sa, sb := s.seqs[a], s.seqs[b]
	damage := []struct {
		name string
		do   func() (undo func())
		want string
	}{
		{"refcount one too high", func() func() {
			p := sa.pages[0]
			s.ref[p]++
			return func() { s.ref[p]-- }
		}, "page tables name it"},
		{"a page twice in one table", func() func() {
			old := sb.pages[1]
			sb.pages[1] = sb.pages[0]
			return func() { sb.pages[1] = old }
		}, "are both physical page"},
		{"a table longer than its layers", func() func() {
			sb.pages = append(sb.pages, s.free[len(s.free)-1])
			return func() { sb.pages = sb.pages[:len(sb.pages)-1] }
		}, "want 3"},
		{"a used page on the free list", func() func() {
			s.free = append(s.free, sa.pages[0])
			return func() { s.free = s.free[:len(s.free)-1] }
		}, "free list holds page"},
		{"a free page lost", func() func() {
			old := s.free
			s.free = s.free[1:]
			return func() { s.free = old }
		}, "not on the free list"},
	}
	for _, d := range damage {
		undo := d.do()
		err := s.CheckInvariants()
		undo()
		if err == nil || !strings.Contains(err.Error(), d.want) {
			t.Errorf("%s: %v, want an error containing %q", d.name, err, d.want)
		}
		if err := s.CheckInvariants(); err != nil {
			t.Fatalf("after undoing %s: %v", d.name, err)
		}
	}
	if !invariants.Enabled {
		return
	}
	// With the invariants or race tag, a change that leaves a sequence
	// broken panics as it unlocks.
	sa.mu.Lock()
	sa.pages = append(sa.pages, sa.pages[0])
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "invariant") {
				t.Errorf("unlock of a broken sequence: recovered %v, want an invariant panic", r)
			}
		}()
		s.unlock(sa, true)
	}()
	sa.mu.Lock()
	sa.pages = sa.pages[:len(sa.pages)-1]
	sa.mu.Unlock()
}
