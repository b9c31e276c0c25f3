package engine

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestRegressFailedAppendRegistersPages: an append that fails cleanly on its
// first shard (copy-on-write of a shared tail, pool full) still registers
// its new global pages (when the engine kept page maps). A later append then skips the
// capacity pre-check for those pages, fails half-way and breaks the
// sequence, where a correct pre-check would have refused it cleanly.
func TestRegressFailedAppendRegistersPages(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	cfg := reviewCfg()
	cfg.CP, cfg.CapacityPages = 2, 4
	e := newEngine(t, cfg)
	tok := cfg.KVHeads * cfg.HeadDim
	add := func(id SeqID, n int) error { return e.Append(id, 0, randVec(rng, n*tok), randVec(rng, n*tok)) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	fork := func(id SeqID) SeqID { c, err := e.Fork(id); must(err); return c }
	a, _ := e.Create(plan.Striped)
	must(add(a, 24)) // page 0 on rank 0, page 1 (8 tokens) on rank 1
	var kids []SeqID
	for range 4 {
		kids = append(kids, fork(a))
	}
	for _, c := range kids[:3] { // each copy-on-write takes one page of rank 1
		must(add(c, 1))
	}
	// Rank 1 is full and a's tail is still shared with kids[3].
	if err := add(a, 16); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("append needing a copy on a full rank: %v", err)
	}
	// Fill rank 0 with copy-on-writes of a short sequence.
	s, _ := e.Create(plan.Striped)
	must(add(s, 8))
	for e.Shard(0, 0).Store().Stats().FreePages > 0 {
		fork(s)
		must(add(s, 1))
	}
	must(e.Release(kids[3])) // a's tail is private again
	// 16 tokens: 8 into a's tail on rank 1, 8 into a new page on rank 0 (full).
	if err := add(a, 16); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("append into a full rank 0: %v", err)
	}
	if n, err := e.Len(a); err != nil || n != 24 {
		t.Fatalf("after a refused append: len %d, %v; want 24, nil (pool too small must change nothing)", n, err)
	}
}
