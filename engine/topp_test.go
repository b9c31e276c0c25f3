package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// TestDistributedEqualsSingleShardTopP is invariant 8 with top-p pruning
// on (Policy.TopP): over random CP x TP layouts, placements, GQA modes
// and exact or replicated selection, the engine selects the same pages
// and its outputs (normalised over the kept tokens) equal the single
// shard's, so every CP rank derives the same kept set from the gathered
// logits; the kept tokens are counted once per TP group.
func TestDistributedEqualsSingleShardTopP(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 2))
	trials := 16
	if testing.Short() {
		trials = 6
	}
	for trial := range trials {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 8, 4, 16, 16
		cfg.CP = 1 + rng.IntN(6)
		cfg.TP = []int{1, 2, 4}[rng.IntN(3)]
		cfg.CapacityPages = 200
		cfg.Selection = []Selection{Exact, Replicated}[rng.IntN(2)]
		cfg.Policy.PageSize = 16
		cfg.Policy.DenseLayers = 1
		cfg.Policy.SinkPages = rng.IntN(2)
		cfg.Policy.GQA = []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[rng.IntN(2)]
		cfg.Policy.TopP = []float64{0.5, 0.9, 0.99}[rng.IntN(3)]
		name := fmt.Sprintf("trial%d_cp%d_tp%d_%v_%v_p%v", trial, cfg.CP, cfg.TP, cfg.Selection, cfg.Policy.GQA, cfg.Policy.TopP)
		t.Run(name, func(t *testing.T) {
			p := newPair(t, cfg)
			lens := []int{1, 17, 1 + rng.IntN(700), 200 + rng.IntN(500)}
			var seqs []SeqID
			var budgets []int
			for _, n := range lens {
				id := p.create([]plan.Placement{plan.Striped, plan.Contiguous}[rng.IntN(2)])
				p.append(rng, id, n)
				seqs = append(seqs, id)
				budgets = append(budgets, []int{32, 64, 160, 4096}[rng.IntN(4)])
			}
			budgets[len(budgets)-1] = 64 // at least one sparse plan (200+ tokens, 4 pages)
			for layer := range cfg.Layers {
				p.compare(rng, layer, seqs, budgets, true)
			}
			var got, want int64
			for tp := range cfg.TP {
				for cp := range cfg.CP {
					st := p.e.Shard(tp, cp).TopPStats()
					if cp > 0 && st.Rows != 0 {
						t.Fatalf("CP rank %d counted %d rows", cp, st.Rows)
					}
					got += st.Kept
				}
			}
			ws := p.ref.TopPStats()
			want = ws.Kept
			if got != want || ws.Kept > ws.Tokens || ws.Rows == 0 {
				t.Fatalf("kept %d tokens over the shards, single shard %d (of %d candidates, %d rows)", got, want, ws.Tokens, ws.Rows)
			}
			if cfg.Policy.TopP == 0.5 && ws.Kept >= ws.Tokens {
				t.Fatalf("p 0.5 kept every one of %d tokens", ws.Tokens)
			}
		})
	}
}

// TestTopPRefusedOffCPU: a backend other than the CPU one (a wrapper) refuses a
// top-p policy when the engine is built, with kernels.ErrTopPUnsupported.
func TestTopPRefusedOffCPU(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.CapacityPages = 1, 4, 2, 16, 16
	cfg.Policy.TopP = 0.9
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	cfg.Backend = &faultyBackend{Backend: cpu}
	e, err := New(cfg)
	if err == nil {
		e.Close()
		t.Fatal("a fake device backend accepted top-p")
	}
	if !errors.Is(err, kernels.ErrTopPUnsupported) {
		t.Fatalf("error %v, want ErrTopPUnsupported", err)
	}
}
