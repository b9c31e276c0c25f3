package shard

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestFusedStepEqualsPhased: a step fused into one backend call (the CPU
// backend's Stepper) gives bit-identical outputs to the same step run
// phase by phase, over ragged batches (tail lengths 1/15/16/17, sequences
// shorter than the budget, empty candidate ranges), both GQA modes, sink
// pages, several local pages, and dense layers; and it really is fused.
func TestFusedStepEqualsPhased(t *testing.T) {
	const layers, qh, kvh, d, s = 2, 8, 2, 16, 16
	for _, tc := range []struct {
		gqa         kernels.GQAMode
		sink, local int
	}{{kernels.GroupMax, 0, 1}, {kernels.PerHead, 0, 1}, {kernels.GroupMax, 1, 2}, {kernels.PerHead, 2, 1}} {
		t.Run(fmt.Sprintf("%v_sink%d_local%d", tc.gqa, tc.sink, tc.local), func(t *testing.T) {
			pol := plan.DefaultPolicy()
			pol.BudgetTokens, pol.DenseLayers, pol.GQA, pol.SinkPages, pol.LocalPages = 6*s, 1, tc.gqa, tc.sink, tc.local
			sh := newTestShard(t, layers, qh, kvh, d, s, 400, pol)
			rng := rand.New(rand.NewPCG(11, uint64(tc.sink*10+tc.local)))
			var ids []pagestore.SeqID
			for _, n := range []int{1, 15, 16, 17, 64, 97, 700, 1601} {
				id := sh.Store().Create()
				fill(t, rng, sh, id, &refSeq{}, n)
				ids = append(ids, id)
			}
			for layer := range layers {
				var reqs []SeqStep
				for i, id := range ids {
					reqs = append(reqs, SeqStep{Seq: id, Q: randVec(rng, qh*d, 2), BudgetTokens: []int{0, 2 * s, 40 * s}[i%3]})
				}
				var fused, phased StepResult
				if err := sh.Step(context.Background(), layer, reqs, StepOptions{Phased: true}, &phased); err != nil {
					t.Fatal(err)
				}
				if err := sh.Step(context.Background(), layer, reqs, StepOptions{}, &fused); err != nil {
					t.Fatal(err)
				}
				if fused.Time.Fused == 0 || phased.Time.Fused != 0 || fused.Time.Score != 0 {
					t.Fatalf("layer %d: fused %+v, phased %+v: the fused path did not run (or ran phased)", layer, fused.Time, phased.Time)
				}
				if !slices.Equal(fused.O, phased.O) || !slices.Equal(fused.LSE, phased.LSE) {
					t.Fatalf("layer %d: fused and phased outputs differ", layer)
				}
				if !slices.Equal(fused.Plans, phased.Plans) {
					t.Fatalf("layer %d: plans differ", layer)
				}
			}
		})
	}
}
