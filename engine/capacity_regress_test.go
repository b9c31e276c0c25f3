package engine

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

func reviewCfg() Config {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim = 1, 4, 2, 8
	cfg.Policy.DenseLayers = 0
	return cfg
}

// TestRegressCapacityUsable: a shard of CapacityPages pages must hold
// CapacityPages pages of a sequence (the store alone accepts them). The
// append pre-check demands need+1 free pages even when no page is shared,
// so the last page of every pool can never be used.
func TestRegressCapacityUsable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	cfg := reviewCfg()
	cfg.CapacityPages = 2
	e := newEngine(t, cfg)
	id, _ := e.Create(plan.Striped)
	tok := cfg.KVHeads * cfg.HeadDim
	if err := e.Append(id, 0, randVec(rng, 32*tok), randVec(rng, 32*tok)); err != nil {
		t.Fatalf("2 pages into a 2-page pool: %v", err)
	}
}

// TestRegressRollbackSpuriousBroken: a rollback whose only affected CP rank
// is not rank 0 and that fails cleanly (pool exhausted for the copy of a
// shared tail page) changes nothing, yet marks the sequence broken for
// good.
func TestRegressRollbackSpuriousBroken(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	cfg := reviewCfg()
	cfg.CP, cfg.CapacityPages = 2, 3
	e := newEngine(t, cfg)
	tok := cfg.KVHeads * cfg.HeadDim
	add := func(id SeqID, n int) error { return e.Append(id, 0, randVec(rng, n*tok), randVec(rng, n*tok)) }
	a, _ := e.Create(plan.Striped)
	if err := add(a, 24); err != nil { // page 0 on rank 0, page 1 (8 tokens) on rank 1
		t.Fatal(err)
	}
	b, _ := e.Create(plan.Striped)
	if err := add(b, 32); err != nil { // one more page on each rank
		t.Fatal(err)
	}
	child, err := e.Fork(a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Fork(a); err != nil { // keeps the tail shared after a copies it
		t.Fatal(err)
	}
	if err := add(a, 1); err != nil { // copy-on-write of a's tail takes rank 1's last page
		t.Fatal(err)
	}
	if st := e.Shard(0, 1).Store().Stats(); st.FreePages != 0 {
		t.Fatalf("setup: rank 1 has %d free pages", st.FreePages)
	}
	err = e.Rollback(child, 4) // only rank 1 drops tokens; its shared tail needs a copy
	if !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("rollback: %v, want ErrPoolExhausted", err)
	}
	if n, err := e.Len(child); err != nil || n != 24 {
		t.Fatalf("after a failed rollback that changed nothing: len %d, %v; want 24, nil", n, err)
	}
}
