package shard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// offPair is a shard holding every page (the reference) and an
// offloading shard fed the same operations.
type offPair struct {
	t        *testing.T
	ref, off *Shard
	ids      map[pagestore.SeqID]pagestore.SeqID // ref id -> off id
	fused    int                                 // offloading steps that ran fused (checkFused)
}

// prefetchOpt is the prefetch of an offPair's offloading shard.
type prefetchOpt struct {
	pages int
	cross bool
}

func (o prefetchOpt) String() string {
	if o.pages == 0 {
		return "noprefetch"
	}
	if o.cross {
		return fmt.Sprintf("prefetch%d_cross", o.pages)
	}
	return fmt.Sprintf("prefetch%d", o.pages)
}

// prefetchOpts are the prefetch settings every offload test runs with:
// off, within-layer and cross-layer.
var prefetchOpts = []prefetchOpt{{}, {pages: 4}, {pages: 3, cross: true}}

// onDevice, passed as newOffPair's tier, makes the offloading shard a
// DeviceResident one on a backendtest.FakeDevice: slot pools on the
// pretend device and its host tier (kernels.SlotStore).
type onDevice struct{ tier.Tier }

var fakeDev tier.Tier = onDevice{}

func newOffPair(t *testing.T, layers, qh, kvh, d, s, capacity, budget int, pol plan.Policy, ev pagestore.Eviction, tr tier.Tier, pf prefetchOpt) *offPair {
	t.Helper()
	return newOffPairOf(t, plan.Float32, layers, qh, kvh, d, s, capacity, budget, pol, ev, tr, pf)
}

// newOffPairOf is newOffPair with K/V of type dt in both stores.
func newOffPairOf(t *testing.T, dt plan.DType, layers, qh, kvh, d, s, capacity, budget int, pol plan.Policy, ev pagestore.Eviction, tr tier.Tier, pf prefetchOpt) *offPair {
	t.Helper()
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2, AttendChunk: 4, ScoreChunk: 8})
	t.Cleanup(func() { cpu.Close() })
	var be kernels.Backend = cpu
	_, dev := tr.(onDevice)
	if dev {
		tr = nil
	}
	pol.PageSize = s
	st := pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s, DType: dt}, Capacity: capacity}
	ref, err := New(Config{Store: st, Policy: pol}, be)
	if err != nil {
		t.Fatal(err)
	}
	st.DeviceBudget, st.Eviction, st.Tier = budget, ev, tr
	offBe := be
	if dev {
		offBe = backendtest.FakeDevice{CPU: cpu, DType: dt}
	}
	off, err := New(Config{Store: st, Policy: pol, PrefetchPages: pf.pages, PrefetchCrossLayer: pf.cross, DeviceResident: dev}, offBe)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { off.Close() })
	return &offPair{t: t, ref: ref, off: off, ids: map[pagestore.SeqID]pagestore.SeqID{}}
}

func (p *offPair) create() pagestore.SeqID {
	a := p.ref.Store().Create()
	p.ids[a] = p.off.Store().Create()
	return a
}

func (p *offPair) append(rng *rand.Rand, id pagestore.SeqID, n int) {
	p.t.Helper()
	c := p.ref.Config().Store
	for l := range c.Layers {
		k, v := randVec(rng, n*c.KVHeads*c.HeadDim, 1), randVec(rng, n*c.KVHeads*c.HeadDim, 1)
		if err := p.ref.Append(id, l, k, v); err != nil {
			p.t.Fatal(err)
		}
		if err := p.off.Append(p.ids[id], l, k, v); err != nil {
			p.t.Fatal(err)
		}
	}
}

// step runs one layer of a step on both with a new token per sequence
// and returns both results and whether the offloading step ran in one
// pass.
func (p *offPair) step(rng *rand.Rand, layer int, ids []pagestore.SeqID, budgets []int, opt StepOptions, token bool) (want, got StepResult, onePass bool) {
	p.t.Helper()
	c := p.ref.Config().Store
	var ra, rb []SeqStep
	for i, id := range ids {
		q := randVec(rng, c.QHeads*c.HeadDim, 2)
		var k, v []float32
		if token {
			k, v = randVec(rng, c.KVHeads*c.HeadDim, 1), randVec(rng, c.KVHeads*c.HeadDim, 1)
		}
		ra = append(ra, SeqStep{Seq: id, Q: q, K: k, V: v, BudgetTokens: budgets[i]})
		rb = append(rb, SeqStep{Seq: p.ids[id], Q: q, K: k, V: v, BudgetTokens: budgets[i]})
	}
	st0 := p.off.OffloadStats()
	before := st0.MultiPass
	if err := p.ref.Step(context.Background(), layer, ra, opt, &want); err != nil {
		p.t.Fatal(err)
	}
	if err := p.off.Step(context.Background(), layer, rb, opt, &got); err != nil {
		p.t.Fatal(err)
	}
	p.checkFused(st0, got, opt)
	if err := p.off.Store().CheckResidency(); err != nil {
		p.t.Fatal(err)
	}
	return want, got, p.off.OffloadStats().MultiPass == before
}

// checkFused checks how an offloading step ran, given the offload stats
// before it (st0): fused exactly when the shard keeps a device page ->
// slot table, does not prefetch, the options allow fusing and every page
// with data was resident (none only in the tier), counted once in
// OffloadStats.Fused and ResidentSteps and in nothing a recall counts.
func (p *offPair) checkFused(st0 OffloadStats, got StepResult, opt StepOptions) {
	p.t.Helper()
	st := p.off.OffloadStats()
	can := p.off.slotTab != nil && p.off.pfPlan == nil && !opt.Phased && !opt.Diagnostics &&
		st0.TierOnly == 0 && st0.PrefetchPending == 0
	fused := got.Time.Fused != 0
	if fused != can {
		p.t.Fatalf("the offloading step ran fused: %v, expected %v (tier-only pages %d, slot table %v)", fused, can, st0.TierOnly, p.off.slotTab != nil)
	}
	if fused {
		p.fused++
		if st.Fused != st0.Fused+1 || st.ResidentSteps != st0.ResidentSteps+1 || st.Recalls != st0.Recalls || st.Steps != st0.Steps {
			p.t.Fatalf("a fused offloading step counted %+v, before %+v", st, st0)
		}
	} else if st.Fused != st0.Fused || st.ResidentSteps != st0.ResidentSteps {
		p.t.Fatalf("a phased offloading step counted as fused: %+v, before %+v", st, st0)
	}
}

func sameDiag(t *testing.T, want, got []Diagnostics) {
	t.Helper()
	for i := range want {
		a, b := want[i], got[i]
		if a.Recall != b.Recall || a.MassRecall != b.MassRecall || a.RelL2 != b.RelL2 || a.PagesRead != b.PagesRead {
			t.Fatalf("sequence %d: diagnostics %+v vs %+v", i, a, b)
		}
		for h := range a.Selected {
			if !slices.Equal(a.Selected[h], b.Selected[h]) || (a.Scores != nil && !slices.Equal(a.Scores[h], b.Scores[h])) {
				t.Fatalf("sequence %d head %d: pages or scores differ", i, h)
			}
		}
	}
}

// TestOffloadBitIdentical: decode steps over several layers and a ragged
// batch give bit-identical o and lse with offload on and off, for both
// GQA modes and eviction policies, with a device budget of 10% and 20% of
// the pages (raised, where the batch needs more, to the forced pages plus
// K per row of every sequence: the most one step attends), so every step
// runs in one pass; diagnostics agree too.
func TestOffloadBitIdentical(t *testing.T) {
	const layers, qh, kvh, d, s = 3, 8, 2, 16, 16
	lens := []int{1, 17, 2000, 2500, 3000}
	pages := 0
	for _, n := range lens {
		pages += (n + s - 1) / s
	}
	for _, gqa := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
		for _, frac := range []float64{0.1, 0.2, 1} {
			const device = pagestore.Eviction(-1) // a marker: LRU on the pretend device
			for i, ev := range []pagestore.Eviction{pagestore.EvictLRU, pagestore.EvictScore, device} {
				var tr tier.Tier
				if ev == device {
					// The DeviceResident offload on the pretend device.
					if frac == 1 {
						continue
					}
					ev, tr = pagestore.EvictLRU, fakeDev
				}
				pf := prefetchOpts[(i+int(frac*10))%len(prefetchOpts)]
				pol := plan.DefaultPolicy()
				pol.BudgetTokens, pol.DenseLayers, pol.GQA, pol.SinkPages, pol.LocalPages = 4*s, 0, gqa, 1, 1
				rows := kvh
				if gqa == kernels.PerHead {
					rows = qh
				}
				steps := 6
				// Each step adds a token: at most one page more per sequence.
				need := len(lens) * (pol.SinkPages + pol.LocalPages + rows*(4-pol.SinkPages-pol.LocalPages))
				budget := max(int(math.Ceil(frac*float64(pages+len(lens)))), need)
				t.Run(fmt.Sprintf("%v_%.0f%%_%v_%v_dev%v_budget%d_of%d", gqa, frac*100, ev, pf, tr != nil, budget, pages), func(t *testing.T) {
					p := newOffPair(t, layers, qh, kvh, d, s, 520, budget, pol, ev, tr, pf)
					rng := rand.New(rand.NewPCG(21, uint64(budget)))
					var ids []pagestore.SeqID
					for _, n := range lens {
						id := p.create()
						p.append(rng, id, n)
						ids = append(ids, id)
					}
					budgets := []int{0, 0, 2 * s, 0, 6 * s}
					for step := range steps {
						for layer := range layers {
							opt := StepOptions{Diagnostics: step == steps-1}
							want, got, one := p.step(rng, layer, ids, budgets, opt, true)
							if !one {
								t.Fatalf("step %d layer %d ran in several passes (budget %d)", step, layer, budget)
							}
							if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
								t.Fatalf("step %d layer %d: outputs differ with offload", step, layer)
							}
							if !slices.Equal(want.Plans, got.Plans) {
								t.Fatalf("step %d layer %d: plans differ", step, layer)
							}
							sameDiag(t, want.Diag, got.Diag)
						}
					}
					st := p.off.OffloadStats()
					t.Logf("%+v hit rate %.3f", st, st.HitRate())
					if (frac < 1 && (st.Misses == 0 || st.Evictions == 0)) || st.Resident > budget || st.MultiPass != 0 {
						t.Fatalf("offload not exercised or over budget: %+v", st)
					}
					if pf.pages > 0 && frac < 1 && st.PrefetchSteps == 0 {
						t.Fatalf("prefetch not exercised: %+v", st)
					}
				})
			}
		}
	}
}

// TestOffloadMultiPass: a dense layer (and a forced dense step) reads more
// pages than the device holds: attention runs in passes whose partial
// states merge to the single-pass result within fp32 rounding; the sparse
// layer stays bit-identical.
func TestOffloadMultiPass(t *testing.T) {
	const layers, qh, kvh, d, s = 2, 4, 2, 16, 16
	pol := plan.DefaultPolicy()
	pol.BudgetTokens, pol.DenseLayers, pol.SinkPages = 4*s, 1, 1
	for _, pf := range prefetchOpts {
		t.Run(pf.String(), func(t *testing.T) { testOffloadMultiPass(t, pol, pf, nil) })
	}
	t.Run("device", func(t *testing.T) { testOffloadMultiPass(t, pol, prefetchOpts[1], fakeDev) })
}

func testOffloadMultiPass(t *testing.T, pol plan.Policy, pf prefetchOpt, tr tier.Tier) {
	const layers, qh, kvh, d, s = 2, 4, 2, 16, 16
	p := newOffPair(t, layers, qh, kvh, d, s, 100, 20, pol, pagestore.EvictScore, tr, pf)
	rng := rand.New(rand.NewPCG(3, 3))
	var ids []pagestore.SeqID
	for _, n := range []int{300, 450, 20} {
		id := p.create()
		p.append(rng, id, n)
		ids = append(ids, id)
	}
	budgets := []int{0, 0, 0}
	for step := range 3 {
		for layer := range layers {
			opt := StepOptions{ForceDense: step == 2, Diagnostics: step == 1}
			want, got, one := p.step(rng, layer, ids, budgets, opt, layer == 0)
			if layer == 0 || opt.ForceDense {
				if one {
					t.Fatalf("step %d layer %d: a dense read of 50 pages ran in one pass of 20", step, layer)
				}
				for j := range want.O {
					if math.Abs(float64(want.O[j]-got.O[j])) > 1e-5*max(1, math.Abs(float64(want.O[j]))) {
						t.Fatalf("step %d layer %d: o[%d] = %v, single pass %v", step, layer, j, got.O[j], want.O[j])
					}
				}
				for j := range want.LSE {
					if math.Abs(float64(want.LSE[j]-got.LSE[j])) > 1e-5*max(1, math.Abs(float64(want.LSE[j]))) {
						t.Fatalf("step %d layer %d: lse[%d] = %v, single pass %v", step, layer, j, got.LSE[j], want.LSE[j])
					}
				}
				continue
			}
			if !one || !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
				t.Fatalf("step %d layer %d: the sparse layer differs (one pass: %v)", step, layer, one)
			}
			sameDiag(t, want.Diag, got.Diag)
		}
	}
	if st := p.off.OffloadStats(); st.MultiPass == 0 || st.Passes <= st.Steps {
		t.Fatalf("no multi-pass step: %+v", st)
	}
}

// TestOffloadProperty runs random sequences of appends, batched steps,
// forks, rollbacks and releases on an offloading shard and on a shard
// holding every page: every step's o and lse must be bit-identical.
func TestOffloadProperty(t *testing.T) {
	const layers, qh, kvh, d, s = 2, 4, 2, 8, 4
	seeds := 6
	if testing.Short() {
		seeds = 2
	}
	for seed := range seeds {
		pol := plan.DefaultPolicy()
		pol.BudgetTokens, pol.DenseLayers = 3*s, 0
		pol.GQA = []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[seed%2]
		pol.SinkPages = seed % 3 / 2
		const maxSeqs = 4
		rows := kvh
		if pol.GQA == kernels.PerHead {
			rows = qh
		}
		// Every live sequence's pinned pages (sink, tail) plus, per
		// sequence of a step, its forced pages and K per row.
		budget := maxSeqs*2 + maxSeqs*(2+rows*3)
		ev := []pagestore.Eviction{pagestore.EvictLRU, pagestore.EvictScore}[seed/2%2]
		for _, pf := range prefetchOpts {
			t.Run(fmt.Sprintf("seed%d_%v_sink%d_%v_%v_budget%d", seed, pol.GQA, pol.SinkPages, ev, pf, budget), func(t *testing.T) {
				offloadProperty(t, seed, pol, budget, ev, pf, nil)
			})
		}
		t.Run(fmt.Sprintf("seed%d_%v_sink%d_%v_device_budget%d", seed, pol.GQA, pol.SinkPages, ev, budget), func(t *testing.T) {
			offloadProperty(t, seed, pol, budget, ev, prefetchOpts[seed%len(prefetchOpts)], fakeDev)
		})
	}
}

// offloadProperty is one run of TestOffloadProperty (and of
// TestPrefetchProperty, over a slow tier tr).
func offloadProperty(t *testing.T, seed int, pol plan.Policy, budget int, ev pagestore.Eviction, pf prefetchOpt, tr tier.Tier) {
	const layers, qh, kvh, d, s = 2, 4, 2, 8, 4
	offloadPropertyOf(t, newOffPair(t, layers, qh, kvh, d, s, 400, budget, pol, ev, tr, pf), seed, budget, pf)
}

// offloadPropertyOf runs offloadProperty's random operations on pair p
// (built with a device budget of budget pages and prefetch pf).
func offloadPropertyOf(t *testing.T, p *offPair, seed, budget int, pf prefetchOpt) {
	c := p.ref.Config().Store
	layers, s := c.Layers, c.PageSize
	const maxSeqs = 4
	rng := rand.New(rand.NewPCG(uint64(seed), 77))
	var live []pagestore.SeqID
	for op := range 150 {
		switch r := rng.IntN(10); {
		case len(live) == 0 || (r == 0 && len(live) < maxSeqs):
			id := p.create()
			p.append(rng, id, (1+rng.IntN(200))*s/4) // as many pages at any S
			live = append(live, id)
		case r <= 2:
			p.append(rng, live[rng.IntN(len(live))], 1+rng.IntN(40))
		case r == 3 && len(live) < maxSeqs:
			par := live[rng.IntN(len(live))]
			a, err := p.ref.Fork(par)
			if err != nil {
				t.Fatal(err)
			}
			b, err := p.off.Fork(p.ids[par])
			if err != nil {
				t.Fatal(err)
			}
			p.ids[a] = b
			live = append(live, a)
		case r == 4:
			id := live[rng.IntN(len(live))]
			n, _ := p.ref.Store().Len(id)
			if n > 1 {
				cut := 1 + rng.IntN(n-1)
				if err := p.ref.Rollback(id, cut); err != nil {
					t.Fatal(err)
				}
				if err := p.off.Rollback(p.ids[id], cut); err != nil {
					t.Fatal(err)
				}
			}
		case r == 5 && len(live) > 1:
			i := rng.IntN(len(live))
			if err := p.ref.Release(live[i]); err != nil {
				t.Fatal(err)
			}
			if err := p.off.Release(p.ids[live[i]]); err != nil {
				t.Fatal(err)
			}
			live = slices.Delete(live, i, i+1)
		default: // a whole decode step over the live sequences, layer by layer
			budgets := make([]int, len(live))
			for i := range budgets {
				budgets[i] = []int{0, 2 * s, 3 * s}[rng.IntN(3)]
			}
			for layer := range layers {
				want, got, one := p.step(rng, layer, live, budgets, StepOptions{Diagnostics: rng.IntN(8) == 0}, true)
				if !one {
					t.Fatalf("op %d layer %d: several passes with budget %d", op, layer, budget)
				}
				if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
					t.Fatalf("op %d layer %d: outputs differ", op, layer)
				}
				sameDiag(t, want.Diag, got.Diag)
			}
		}
		if err := p.off.Store().CheckResidency(); err != nil {
			t.Fatalf("op %d: %v", op, err)
		}
	}
	st := p.off.OffloadStats()
	if st.Misses == 0 || st.Evictions == 0 {
		t.Fatalf("offload not exercised: %+v", st)
	}
	if pf.pages > 0 && st.PrefetchIssued == 0 {
		t.Fatalf("prefetch not exercised: %+v", st)
	}
	t.Logf("%+v", st)
}

// TestOffloadTierFault: a tier that cannot read one page fails exactly
// the steps that attend it, with an error wrapping the tier's sentinel;
// other sequences' steps go on, bit-identical to the reference, and the
// residency stays consistent.
func TestOffloadTierFault(t *testing.T) {
	for _, pf := range prefetchOpts {
		t.Run(pf.String(), func(t *testing.T) { testOffloadTierFault(t, pf) })
	}
}

func testOffloadTierFault(t *testing.T, pf prefetchOpt) {
	const layers, qh, kvh, d, s = 1, 4, 2, 8, 4
	pol := plan.DefaultPolicy()
	pol.BudgetTokens, pol.DenseLayers = 3*s, 0
	c := pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 64}
	mem, err := tier.NewMemory(c.Capacity, c.PayloadBytes())
	if err != nil {
		t.Fatal(err)
	}
	f := &tier.Faulty{Tier: mem, FailReadSlots: []int{1}} // page 1: A's second page
	p := newOffPair(t, layers, qh, kvh, d, s, c.Capacity, 8, pol, pagestore.EvictLRU, f, pf)
	rng := rand.New(rand.NewPCG(4, 4))
	a := p.create()
	p.append(rng, a, 10*s) // pages 0..9: page 1 goes to the tier
	b := p.create()
	p.append(rng, b, 10*s)
	if got := p.off.Store().DeviceSlot(1); got >= 0 {
		t.Fatalf("page 1 resident (slot %d)", got)
	}
	var res StepResult
	q := randVec(rng, qh*d, 1)
	err = p.off.Step(context.Background(), 0, []SeqStep{{Seq: p.ids[a], Q: q}}, StepOptions{ForceDense: true}, &res)
	if !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("a step reading the unreadable page: %v, want ErrInjected", err)
	}
	if err := p.off.Store().CheckResidency(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		want, got, _ := p.step(rng, 0, []pagestore.SeqID{b}, []int{0}, StepOptions{}, true)
		if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
			t.Fatal("the other sequence's step differs after the fault")
		}
	}
	// A's steps that do not select page 1 still work: attend only the
	// tail (budget of one page).
	want, got, _ := p.step(rng, 0, []pagestore.SeqID{a}, []int{s}, StepOptions{}, false)
	if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
		t.Fatal("a step of A that does not need page 1 differs")
	}
}

// TestOffloadOracle: the oracle selector reads keys on the host; on an
// offloading shard it reads copies from the device pool or the tier, and
// selects and attends exactly as a shard holding every page.
func TestOffloadOracle(t *testing.T) {
	for _, pf := range prefetchOpts {
		t.Run(pf.String(), func(t *testing.T) { testOffloadOracle(t, pf) })
	}
}

func testOffloadOracle(t *testing.T, pf prefetchOpt) {
	const layers, qh, kvh, d, s = 1, 4, 2, 8, 4
	pol := plan.DefaultPolicy()
	pol.BudgetTokens, pol.DenseLayers, pol.Selector = 4*s, 0, plan.Oracle
	p := newOffPair(t, layers, qh, kvh, d, s, 128, 16, pol, pagestore.EvictLRU, nil, pf)
	rng := rand.New(rand.NewPCG(8, 8))
	ids := []pagestore.SeqID{p.create(), p.create()}
	p.append(rng, ids[0], 150)
	p.append(rng, ids[1], 90)
	for step := range 4 {
		want, got, one := p.step(rng, 0, ids, []int{0, 0}, StepOptions{Diagnostics: step == 3}, true)
		if !one || !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
			t.Fatalf("step %d: outputs differ (one pass: %v)", step, one)
		}
		sameDiag(t, want.Diag, got.Diag)
	}
	if p.off.ReadBackBytes() == 0 {
		t.Fatal("the oracle read no page copies")
	}
}

// TestOffloadConfigShard: offload with DeviceResident is refused with a clear
// error, and budget 0 leaves the fused path on.
func TestOffloadConfigShard(t *testing.T) {
	st := pagestore.Config{Layers: 1, Geometry: plan.Geometry{QHeads: 2, KVHeads: 1, HeadDim: 4, PageSize: 4}, Capacity: 8, DeviceBudget: 4}
	// Offload with DeviceResident needs a backend with slot pools.
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	if _, err := New(Config{Store: st, Policy: plan.DefaultPolicy(), DeviceResident: true}, cpu); !errors.Is(err, pagestore.ErrInvalidConfig) {
		t.Fatalf("offload with DeviceResident on the CPU backend: %v", err)
	} else {
		t.Log(err)
	}
	sh := newTestShard(t, 1, 2, 1, 4, 4, 8, plan.DefaultPolicy())
	id := sh.Store().Create()
	fill(t, rand.New(rand.NewPCG(1, 1)), sh, id, &refSeq{}, 20)
	var res StepResult
	if err := sh.Step(context.Background(), 0, []SeqStep{{Seq: id, Q: make([]float32, 8)}}, StepOptions{}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Time.Fused == 0 || res.Time.Recall != 0 {
		t.Fatalf("budget 0: the step did not run fused (%+v)", res.Time)
	}
	if sh.OffloadStats() != (OffloadStats{}) {
		t.Fatal("stats of a shard without offload")
	}
}

// TestOffloadHostTablesFollowStore: an offloading DeviceResident shard
// keeps its host copy of the page tables from one step to the next while
// the store reports no change. Changes that keep every page count (a
// fork's copy on write of the shared tail page at an append or a
// rollback, a release and a fork reusing the tail's old page) still reach
// the next step: every output stays bit-identical to the shard holding
// every page.
func TestOffloadHostTablesFollowStore(t *testing.T) {
	const layers, qh, kvh, d, s = 1, 4, 2, 16, 16
	pol := plan.DefaultPolicy()
	pol.BudgetTokens, pol.DenseLayers = 4*s, 0
	p := newOffPair(t, layers, qh, kvh, d, s, 64, 16, pol, pagestore.EvictLRU, fakeDev, prefetchOpt{})
	rng := rand.New(rand.NewPCG(26, 2))
	id := p.create()
	p.append(rng, id, 10*s+5)
	check := func(what string, ids ...pagestore.SeqID) {
		t.Helper()
		want, got, _ := p.step(rng, 0, ids, make([]int, len(ids)), StepOptions{}, false)
		if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
			t.Fatalf("%s: outputs differ with offload", what)
		}
	}
	fork := func(id pagestore.SeqID) pagestore.SeqID {
		t.Helper()
		a, err := p.ref.Fork(id)
		if err != nil {
			t.Fatal(err)
		}
		if p.ids[a], err = p.off.Fork(p.ids[id]); err != nil {
			t.Fatal(err)
		}
		return a
	}
	rollback := func(id pagestore.SeqID, n int) {
		t.Helper()
		if err := p.ref.Rollback(id, n); err != nil {
			t.Fatal(err)
		}
		if err := p.off.Rollback(p.ids[id], n); err != nil {
			t.Fatal(err)
		}
	}
	check("first step", id)
	check("same tables", id)
	child := fork(id)
	check("after the fork", id)
	p.append(rng, id, 1) // the shared tail page is copied: same page count
	check("after the copy on write of an append", id)
	check("the child", child)
	check("parent again", id)
	child2 := fork(id)
	check("after the second fork", id)
	rollback(id, 2) // the shared tail page is copied again
	check("after the copy on write of a rollback", id)
	for _, c := range []pagestore.SeqID{child, child2} {
		if err := p.ref.Release(c); err != nil {
			t.Fatal(err)
		}
		if err := p.off.Release(p.ids[c]); err != nil {
			t.Fatal(err)
		}
	}
	check("after the releases", id)
	child3 := fork(id)
	rollback(child3, 1)
	check("the third child", child3)
	check("its parent", id)
	check("both", id, child3)
}
