package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// TestDistributedEqualsSingleShardSubBoxes is invariant 8 with multi-box
// summaries on (Policy.SubBoxes): over random CP x TP layouts,
// placements and GQA modes, every shard's store keeps the sub-boxes and
// the engine selects the same pages and gives the single shard's outputs.
func TestDistributedEqualsSingleShardSubBoxes(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 3))
	trials := 12
	if testing.Short() {
		trials = 4
	}
	for trial := range trials {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 8, 4, 16, 16
		cfg.CP = 1 + rng.IntN(6)
		cfg.TP = []int{1, 2, 4}[rng.IntN(3)]
		cfg.CapacityPages = 200
		cfg.Policy.PageSize = 16
		cfg.Policy.DenseLayers = 1
		cfg.Policy.SinkPages = rng.IntN(2)
		cfg.Policy.GQA = []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[rng.IntN(2)]
		cfg.Policy.SubBoxes = []int{2, 4, 8}[rng.IntN(3)]
		name := fmt.Sprintf("trial%d_cp%d_tp%d_%v_c%d", trial, cfg.CP, cfg.TP, cfg.Policy.GQA, cfg.Policy.SubBoxes)
		t.Run(name, func(t *testing.T) {
			p := newPair(t, cfg)
			if got := p.ref.Store().Config().SubBoxes; got != cfg.Policy.SubBoxes {
				t.Fatalf("single shard keeps %d sub-boxes, policy %d", got, cfg.Policy.SubBoxes)
			}
			for tp := range cfg.TP {
				for cp := range cfg.CP {
					if got := p.e.Shard(tp, cp).Store().Config().SubBoxes; got != cfg.Policy.SubBoxes {
						t.Fatalf("shard (%d, %d) keeps %d sub-boxes, policy %d", tp, cp, got, cfg.Policy.SubBoxes)
					}
				}
			}
			lens := []int{1, 17, 1 + rng.IntN(700), 200 + rng.IntN(500)}
			var seqs []SeqID
			var budgets []int
			for _, n := range lens {
				id := p.create([]plan.Placement{plan.Striped, plan.Contiguous}[rng.IntN(2)])
				p.append(rng, id, n)
				seqs = append(seqs, id)
				budgets = append(budgets, []int{32, 64, 160, 4096}[rng.IntN(4)])
			}
			budgets[len(budgets)-1] = 64 // at least one sparse plan
			for layer := range cfg.Layers {
				p.compare(rng, layer, seqs, budgets, true)
			}
		})
	}
}

// TestSubBoxesRefused: sub-boxes with replicated selection (the mirrors
// hold page boxes) or a backend other than the CPU one fail New with a
// clear error.
func TestSubBoxesRefused(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.CapacityPages = 1, 4, 2, 16, 16
	cfg.Policy.SubBoxes = 4
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	rep := cfg
	rep.Selection, rep.CP, rep.Backend = Replicated, 2, cpu
	if e, err := New(rep); err == nil {
		e.Close()
		t.Fatal("replicated selection accepted sub-boxes")
	} else if !strings.Contains(err.Error(), "sub-boxes") {
		t.Fatalf("replicated selection: %v, want an error naming the sub-boxes", err)
	}
	cfg.Backend = &faultyBackend{Backend: cpu}
	e, err := New(cfg)
	if err == nil {
		e.Close()
		t.Fatal("a fake device backend accepted sub-boxes")
	}
	if !errors.Is(err, kernels.ErrSubBoxes) {
		t.Fatalf("error %v, want ErrSubBoxes", err)
	}
}
