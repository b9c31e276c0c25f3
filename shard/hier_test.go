package shard

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestHierStepEqualsFlat: a shard ranking by the hierarchical search
// (Policy.HierGroup) and one scoring flat, fed the same tokens, give
// bit-identical outputs step after step while the trees follow appends
// (the tail page growing and new pages), rollbacks inside and across
// pages, forks and releases; both GQA modes, sink and local pages.
func TestHierStepEqualsFlat(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []plan.GQAMode{plan.GroupMax, plan.PerHead} {
		pol := plan.DefaultPolicy()
		pol.DenseLayers, pol.BudgetTokens, pol.SinkPages, pol.LocalPages, pol.GQA = 0, 64, 1, 2, mode
		hp := pol
		hp.HierGroup = 2
		const qh, kvh, d, S = 4, 2, 16, 4
		flat := newTestShard(t, 1, qh, kvh, d, S, 4096, pol)
		hier := newTestShard(t, 1, qh, kvh, d, S, 4096, hp)
		rng := rand.New(rand.NewPCG(32, uint64(mode)))
		ids := [2][]pagestore.SeqID{{flat.Store().Create()}, {hier.Store().Create()}}
		k, v := randVec(rng, 1500*kvh*d, 1), randVec(rng, 1500*kvh*d, 1)
		// Small keys with one page in 20 far out: bounds that prune, so the
		// search (and the trees' consistency) decides the selection.
		for p := range 1500 / S {
			f := float32(0.1)
			if rng.IntN(20) == 0 {
				f = 3
			}
			for i := range S * kvh * d {
				k[p*S*kvh*d+i] *= f
			}
		}
		for i, sh := range []*Shard{flat, hier} {
			if err := sh.Append(ids[i][0], 0, k, v); err != nil {
				t.Fatal(err)
			}
		}
		for step := range 60 {
			switch step {
			case 20: // roll back 37 tokens (across pages, ending inside
				// one) and write 40 others with large keys before the next
				// step: pages the tree had seen sealed now hold new keys.
				rk, rv := randVec(rng, 40*kvh*d, 4), randVec(rng, 40*kvh*d, 1)
				for i, sh := range []*Shard{flat, hier} {
					if err := sh.Rollback(ids[i][0], 37); err != nil {
						t.Fatal(err)
					}
					if err := sh.Append(ids[i][0], 0, rk, rv); err != nil {
						t.Fatal(err)
					}
				}
			case 30: // fork: the child shares sealed pages, its tail copies
				for i, sh := range []*Shard{flat, hier} {
					c, err := sh.Fork(ids[i][0])
					if err != nil {
						t.Fatal(err)
					}
					ids[i] = append(ids[i], c)
				}
			case 45:
				for i, sh := range []*Shard{flat, hier} {
					if err := sh.Release(ids[i][0]); err != nil {
						t.Fatal(err)
					}
					ids[i] = ids[i][1:]
				}
			}
			var res [2]StepResult
			q := randVec(rng, len(ids[0])*qh*d, 2)
			nk, nv := randVec(rng, kvh*d, 0.1), randVec(rng, kvh*d, 1)
			if step%7 == 0 {
				nk = randVec(rng, kvh*d, 4) // a new page (or tail) that stands out
			}
			for i, sh := range []*Shard{flat, hier} {
				var reqs []SeqStep
				for j, id := range ids[i] {
					reqs = append(reqs, SeqStep{Seq: id, Q: q[j*qh*d:][:qh*d], K: nk, V: nv})
				}
				if err := sh.Step(ctx, 0, reqs, StepOptions{}, &res[i]); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(res[0].O, res[1].O) || !slices.Equal(res[0].LSE, res[1].LSE) {
				t.Fatalf("%v step %d: hierarchical output differs from flat", mode, step)
			}
		}
		st := hier.HierStats()
		if st.Totals.Rows == 0 || st.Totals.Fallbacks == st.Totals.Rows || flat.HierStats().Totals.Rows != 0 {
			t.Fatalf("%v: hier shard searched %d rows, flat shard %d", mode, st.Totals.Rows, flat.HierStats().Totals.Rows)
		}
		hier.mu.Lock()
		trees := len(hier.hier.trees)
		hier.mu.Unlock()
		if trees != 1 {
			t.Fatalf("%v: %d trees kept after a release, want 1", mode, trees)
		}
		t.Logf("%v: %+v, p50 %d%% p95 %d%%", mode, st.Totals, st.Quantile(0.5), st.Quantile(0.95))
	}
}
