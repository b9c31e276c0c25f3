package engine

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestRegressBatchCapacity: a step whose new tokens fit the pool one
// sequence at a time but not together is refused before anything is
// appended (the check used to look at each sequence alone, so the first
// sequence's token landed and the step then failed on the second).
func TestRegressBatchCapacity(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	cfg := reviewCfg()
	cfg.CapacityPages = 3
	e := newEngine(t, cfg)
	tok := cfg.KVHeads * cfg.HeadDim
	var ids []SeqID
	var reqs []Request
	for range 2 {
		id, err := e.Create(plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Append(id, 0, randVec(rng, 16*tok), randVec(rng, 16*tok)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		reqs = append(reqs, Request{Seq: id, Q: randVec(rng, cfg.QHeads*cfg.HeadDim), K: randVec(rng, tok), V: randVec(rng, tok)})
	}
	// Two full pages used, one free: each new token needs a page.
	var res Result
	err := e.Step(t.Context(), 0, reqs, StepOptions{}, &res)
	if !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("step needing 2 pages of 1 free: %v", err)
	}
	for _, id := range ids {
		if n, err := e.Len(id); err != nil || n != 16 {
			t.Fatalf("sequence %d: length %d (%v) after a refused step, want 16", id, n, err)
		}
	}
	// One sequence alone still fits.
	if err := e.Step(t.Context(), 0, reqs[:1], StepOptions{}, &res); err != nil {
		t.Fatalf("one new token in one free page: %v", err)
	}
}
