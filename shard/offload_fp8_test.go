package shard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// TestOffloadFP8BitIdentical: on fp8 K/V records, decode steps over a
// ragged batch with tails of 1, 15, 16 and 17 tokens give bit-identical
// o, lse, plans and selected pages with a device budget far below the
// pages (the records go to the tier and back as stored) and without one;
// also with the offloading shard DeviceResident on the pretend device
// (fp8 slot pools that quantize on append, as the GPU's do).
func TestOffloadFP8BitIdentical(t *testing.T) {
	const layers, qh, kvh, d, s = 2, 8, 2, 16, 16
	lens := []int{1, 15, 16, 17, 16*100 + 15, 16*150 + 1}
	for _, gqa := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
		const device = pagestore.Eviction(-1) // a marker: LRU on the pretend device
		for i, ev := range []pagestore.Eviction{pagestore.EvictLRU, pagestore.EvictScore, device} {
			var tr tier.Tier
			if ev == device {
				ev, tr = pagestore.EvictLRU, fakeDev
			}
			pf := prefetchOpts[(i+int(gqa))%len(prefetchOpts)]
			pol := plan.DefaultPolicy()
			pol.BudgetTokens, pol.DenseLayers, pol.GQA, pol.SinkPages, pol.LocalPages = 4*s, 0, gqa, 1, 1
			rows := kvh
			if gqa == kernels.PerHead {
				rows = qh
			}
			budget := len(lens) * (2 + rows*2)
			t.Run(fmt.Sprintf("%v_%v_%v_dev%v_budget%d", gqa, ev, pf, tr != nil, budget), func(t *testing.T) {
				p := newOffPairOf(t, plan.FP8, layers, qh, kvh, d, s, 300, budget, pol, ev, tr, pf)
				rng := rand.New(rand.NewPCG(26, uint64(budget)))
				var ids []pagestore.SeqID
				for _, n := range lens {
					id := p.create()
					p.append(rng, id, n)
					ids = append(ids, id)
				}
				budgets := []int{0, 0, 2 * s, 0, 3 * s, 0}
				for step := range 5 {
					for layer := range layers {
						want, got, one := p.step(rng, layer, ids, budgets, StepOptions{Diagnostics: step%2 == 1}, step%2 == 0)
						if !one {
							t.Fatalf("step %d layer %d ran in several passes (budget %d)", step, layer, budget)
						}
						if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) || !slices.Equal(want.Plans, got.Plans) {
							t.Fatalf("step %d layer %d: outputs or plans differ with offload", step, layer)
						}
						sameDiag(t, want.Diag, got.Diag)
					}
				}
				st := p.off.OffloadStats()
				t.Logf("%+v", st)
				if st.Misses == 0 || st.Evictions == 0 || st.WriteBacks == 0 {
					t.Fatalf("offload not exercised: %+v", st)
				}
			})
		}
	}
}

// TestOffloadFP8Property runs the random operations of
// TestOffloadProperty (appends, forks, rollbacks inside and across
// offloaded pages, releases, steps) on fp8 records with S = 16: every
// step bit-identical to the shard without a device budget, with host
// pools and DeviceResident on the pretend device's fp8 slot pools.
func TestOffloadFP8Property(t *testing.T) {
	const layers, qh, kvh, d, s = 2, 4, 2, 8, 16
	for seed := range 3 {
		pol := plan.DefaultPolicy()
		pol.BudgetTokens, pol.DenseLayers = 3*s, 0
		pol.GQA = []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[seed%2]
		rows := kvh
		if pol.GQA == kernels.PerHead {
			rows = qh
		}
		budget := 4*2 + 4*(2+rows*3)
		ev := []pagestore.Eviction{pagestore.EvictLRU, pagestore.EvictScore}[seed%2]
		pf := prefetchOpts[seed%len(prefetchOpts)]
		for _, tr := range []tier.Tier{nil, fakeDev} {
			t.Run(fmt.Sprintf("seed%d_%v_%v_%v_dev%v", seed, pol.GQA, ev, pf, tr != nil), func(t *testing.T) {
				p := newOffPairOf(t, plan.FP8, layers, qh, kvh, d, s, 400, budget, pol, ev, tr, pf)
				offloadPropertyOf(t, p, seed, budget, pf)
			})
		}
	}
}
