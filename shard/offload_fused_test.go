package shard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestOffloadFusedResident: an offloading DeviceResident shard whose
// device budget holds every page runs every step fused, through the
// device's page -> slot table, through appends, forks, rollbacks,
// releases and recycled pages: outputs bit-identical to the shard
// holding every page, the device's slot table equal to the store's map
// after every operation (CheckResidency), and no recall at all.
func TestOffloadFusedResident(t *testing.T) {
	const layers, qh, kvh, d, s, capacity = 2, 4, 2, 8, 4, 160
	for _, dt := range []plan.DType{plan.Float32, plan.FP8} {
		for _, gqa := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			t.Run(fmt.Sprintf("%v_%v", dt, gqa), func(t *testing.T) {
				pol := plan.DefaultPolicy()
				pol.BudgetTokens, pol.DenseLayers, pol.GQA = 3*s, 1, gqa
				p := newOffPairOf(t, dt, layers, qh, kvh, d, s, capacity, capacity, pol, pagestore.EvictLRU, fakeDev, prefetchOpt{})
				rng := rand.New(rand.NewPCG(uint64(dt), 5))
				var live []pagestore.SeqID
				steps := 0
				for op := range 120 {
					switch r := rng.IntN(8); {
					case len(live) == 0:
						id := p.create()
						p.append(rng, id, 1+rng.IntN(60))
						live = append(live, id)
					case r == 0 && len(live) < 3:
						a, err := p.ref.Fork(live[0])
						if err != nil {
							t.Fatal(err)
						}
						if p.ids[a], err = p.off.Fork(p.ids[live[0]]); err != nil {
							t.Fatal(err)
						}
						live = append(live, a)
					case r == 1:
						id := live[rng.IntN(len(live))]
						if n, _ := p.ref.Store().Len(id); n > 1 {
							cut := 1 + rng.IntN(n-1)
							if err := p.ref.Rollback(id, cut); err != nil {
								t.Fatal(err)
							}
							if err := p.off.Rollback(p.ids[id], cut); err != nil {
								t.Fatal(err)
							}
						}
					case r == 2:
						i := rng.IntN(len(live))
						if err := p.ref.Release(live[i]); err != nil {
							t.Fatal(err)
						}
						if err := p.off.Release(p.ids[live[i]]); err != nil {
							t.Fatal(err)
						}
						live = slices.Delete(live, i, i+1)
					case r == 3:
						p.append(rng, live[rng.IntN(len(live))], 1+rng.IntN(20))
					default:
						budgets := make([]int, len(live))
						for i := range budgets {
							budgets[i] = []int{0, 2 * s, 3 * s}[rng.IntN(3)]
						}
						for layer := range layers {
							want, got, _ := p.step(rng, layer, live, budgets, StepOptions{}, true)
							if got.Time.Fused == 0 {
								t.Fatalf("op %d layer %d: every page resident, the step ran phased", op, layer)
							}
							if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
								t.Fatalf("op %d layer %d: outputs differ", op, layer)
							}
							steps++
						}
					}
					if err := p.off.Store().CheckResidency(); err != nil {
						t.Fatalf("op %d: %v", op, err)
					}
				}
				st := p.off.OffloadStats()
				if steps == 0 || st.Fused != int64(steps) || st.ResidentSteps != int64(steps) || st.Recalls != 0 || st.Steps != 0 {
					t.Fatalf("%d steps, stats %+v", steps, st)
				}
			})
		}
	}
}

// TestOffloadFusedRecency: the pages a fused step selects count as used
// for eviction (their use stamps, kept on the device, reach the evictor
// before it picks a victim): a small sequence stepped fused keeps its
// pages resident while a big one spills past the budget, the step after
// the spill runs phased (pages only in the tier), and once the big
// sequence is released every page is resident again and steps run fused;
// outputs stay bit-identical throughout.
func TestOffloadFusedRecency(t *testing.T) {
	const layers, qh, kvh, d, s, capacity, budget = 1, 4, 2, 8, 4, 200, 40
	pol := plan.DefaultPolicy()
	// Dense: the small sequence's steps read every one of its pages.
	pol.BudgetTokens, pol.DenseLayers = 3*s, 1
	p := newOffPair(t, layers, qh, kvh, d, s, capacity, budget, pol, pagestore.EvictLRU, fakeDev, prefetchOpt{})
	rng := rand.New(rand.NewPCG(9, 9))
	step := func(what string, fused bool, ids ...pagestore.SeqID) {
		t.Helper()
		want, got, _ := p.step(rng, 0, ids, make([]int, len(ids)), StepOptions{}, false)
		if (got.Time.Fused != 0) != fused {
			t.Fatalf("%s: fused %v, want %v", what, got.Time.Fused != 0, fused)
		}
		if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
			t.Fatalf("%s: outputs differ", what)
		}
	}
	small := p.create()
	p.append(rng, small, 10*s) // 10 pages
	step("small, resident", true, small)
	step("small again", true, small)
	big := p.create()
	p.append(rng, big, 20*s) // 30 pages in all: still resident
	step("both resident", true, small)
	p.append(rng, big, 30*s) // 60 pages: 20 go to the tier
	table, err := p.off.Store().AppendPageTable(nil, p.ids[small])
	if err != nil {
		t.Fatal(err)
	}
	for i, pg := range table {
		if p.off.Store().DeviceSlot(pg) < 0 {
			t.Fatalf("page %d of the small sequence (stepped fused) was evicted before the big one's older pages", i)
		}
	}
	if st := p.off.OffloadStats(); st.TierOnly == 0 || st.Evictions == 0 {
		t.Fatalf("nothing spilled: %+v", st)
	}
	step("small after the spill", false, small)
	if err := p.ref.Release(big); err != nil {
		t.Fatal(err)
	}
	if err := p.off.Release(p.ids[big]); err != nil {
		t.Fatal(err)
	}
	if err := p.off.Store().CheckResidency(); err != nil {
		t.Fatal(err)
	}
	step("small, the big one released", true, small)
	if p.fused != 4 {
		t.Fatalf("%d fused steps, want 4", p.fused)
	}
}
