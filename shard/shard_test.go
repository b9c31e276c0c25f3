package shard

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

func newTestShard(t *testing.T, layers, qh, kvh, d, s, capacity int, pol plan.Policy) *Shard {
	t.Helper()
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2, AttendChunk: 4, ScoreChunk: 8})
	t.Cleanup(func() { be.Close() })
	pol.PageSize = s
	sh, err := New(Config{
		Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s, DType: plan.Float32}, Capacity: capacity},

		Policy: pol,
	}, be)
	if err != nil {
		t.Fatal(err)
	}
	return sh
}

func randVec(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// refSeq keeps a test-side copy of a sequence's keys and values per layer:
// [tokens][kvHeads][D].
type refSeq struct {
	k, v [][]float32
}

func (r *refSeq) attend(layer, h, g, kvh, d, s int, q []float32, pages []int32) ([]float64, float64) {
	n := len(r.k[layer]) / (kvh * d)
	kv := h / g
	scale := 1 / math.Sqrt(float64(d))
	var logits []float64
	var toks []int
	for _, p := range pages {
		for t := int(p) * s; t < min(int(p+1)*s, n); t++ {
			var x float64
			for j := range d {
				x += float64(q[j]) * float64(r.k[layer][(t*kvh+kv)*d+j])
			}
			logits = append(logits, x*scale)
			toks = append(toks, t)
		}
	}
	o := make([]float64, d)
	if len(logits) == 0 {
		return o, math.Inf(-1)
	}
	m := slices.Max(logits)
	var z float64
	for _, x := range logits {
		z += math.Exp(x - m)
	}
	for i, t := range toks {
		w := math.Exp(logits[i]-m) / z
		for j := range d {
			o[j] += w * float64(r.v[layer][(t*kvh+kv)*d+j])
		}
	}
	return o, m + math.Log(z)
}

func fill(t *testing.T, rng *rand.Rand, sh *Shard, id pagestore.SeqID, ref *refSeq, tokens int) {
	t.Helper()
	c := sh.Config().Store
	if ref.k == nil {
		ref.k = make([][]float32, c.Layers)
		ref.v = make([][]float32, c.Layers)
	}
	for l := range c.Layers {
		k := randVec(rng, tokens*c.KVHeads*c.HeadDim, 1)
		v := randVec(rng, tokens*c.KVHeads*c.HeadDim, 1)
		if err := sh.Append(id, l, k, v); err != nil {
			t.Fatal(err)
		}
		ref.k[l] = append(ref.k[l], k...)
		ref.v[l] = append(ref.v[l], v...)
	}
}

// TestFourPageExample is the notes' example (2.2): page A has true max 10
// and bound 10, B 3/14, C 2/12, D 1/4. Quest with K=2 picks B and C and
// misses A; K=3 recalls A; the oracle finds A with K=1.
func TestFourPageExample(t *testing.T) {
	pages := [][]float32{
		{5, 5, 0, 0},      // A: M=(5,5) U=10, true max 10
		{14, -11, -11, 0}, // B: M=(14,0) U=14, true max 3
		{12, -10, -10, 0}, // C: U=12, true max 2
		{4, -3, -3, 0},    // D: U=4, true max 1
	}
	q := []float32{1, 1}
	cases := []struct {
		sel  plan.Selector
		k    int
		want []int32
		hasA bool
	}{
		{plan.Quest, 2, []int32{1, 2}, false},
		{plan.Quest, 3, []int32{0, 1, 2}, true},
		{plan.Oracle, 1, []int32{0}, true},
		{plan.Recent, 2, []int32{2, 3}, false},
	}
	for _, c := range cases {
		pol := plan.Policy{BudgetTokens: 2, Selector: c.sel, LocalPages: 0, DenseLayers: 0}
		sh := newTestShard(t, 1, 1, 1, 2, 2, 8, pol)
		id := sh.Store().Create()
		for _, p := range pages {
			if err := sh.Append(id, 0, p, p); err != nil {
				t.Fatal(err)
			}
		}
		var res StepResult
		err := sh.Step(context.Background(), 0, []SeqStep{{Seq: id, Q: q, BudgetTokens: 2 * c.k}}, StepOptions{Diagnostics: true, TopR: 1}, &res)
		if err != nil {
			t.Fatal(err)
		}
		got := res.Diag[0].Selected[0]
		if !slices.Equal(got, c.want) {
			t.Errorf("%v K=%d: selected %v, want %v", c.sel, c.k, got, c.want)
		}
		if c.sel == plan.Quest {
			if want := []float32{10, 14, 12, 4}; !slices.Equal(res.Diag[0].Scores[0], want) {
				t.Errorf("quest scores %v, want %v", res.Diag[0].Scores[0], want)
			}
		}
		if c.sel == plan.Oracle {
			if want := []float32{10, 3, 2, 1}; !slices.Equal(res.Diag[0].Scores[0], want) {
				t.Errorf("oracle scores %v, want %v", res.Diag[0].Scores[0], want)
			}
		}
		// The top-1 token (logit 10/sqrt(2)) sits in page A.
		if (res.Diag[0].Recall == 1) != c.hasA {
			t.Errorf("%v K=%d: recall %v, page A attended: %v", c.sel, c.k, res.Diag[0].Recall, c.hasA)
		}
	}
}

// TestStepMatchesReference checks a ragged batch (tail lengths 1, 15, 16,
// 17 and longer, different budgets) against float64 attention over the pages
// the step reports, and that K >= P is dense (invariants 2 and 4).
func TestStepMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
		pol := plan.DefaultPolicy()
		pol.GQA = mode
		pol.SinkPages = 1
		pol.DenseLayers = 1
		const layers, qh, kvh, d, s = 2, 8, 2, 16, 16
		sh := newTestShard(t, layers, qh, kvh, d, s, 512, pol)
		lens := []int{1, 15, 16, 17, 333, 1000}
		budgets := []int{16, 32, 48, 64, 128, 1 << 20}
		refs := make([]refSeq, len(lens))
		var reqs []SeqStep
		for i, n := range lens {
			id := sh.Store().Create()
			fill(t, rng, sh, id, &refs[i], n)
			reqs = append(reqs, SeqStep{Seq: id, Q: randVec(rng, qh*d, 1), BudgetTokens: budgets[i]})
		}
		for layer := range layers {
			var res StepResult
			if err := sh.Step(context.Background(), layer, reqs, StepOptions{Diagnostics: true}, &res); err != nil {
				t.Fatal(err)
			}
			for i, r := range reqs {
				pl := res.Plans[i]
				np := (lens[i] + s - 1) / s
				wantDense := layer == 0 || budgets[i]/s >= np
				if pl.Dense != wantDense || pl.Pages != np {
					t.Fatalf("%v layer %d seq %d: plan %+v, want dense=%v pages=%d", mode, layer, i, pl, wantDense, np)
				}
				dg := res.Diag[i]
				for h := range qh {
					sel := dg.Selected[h]
					if len(sel) != pl.Reads() {
						t.Fatalf("seq %d head %d: %d pages read, plan says %d", i, h, len(sel), pl.Reads())
					}
					if !pl.Dense && (sel[0] != 0 || sel[len(sel)-1] != int32(np-1)) {
						t.Fatalf("seq %d head %d: sink page 0 and tail page %d must be read: %v", i, h, np-1, sel)
					}
					wo, wl := refs[i].attend(layer, h, qh/kvh, kvh, d, s, r.Q[h*d:(h+1)*d], sel)
					if got := res.LSE[i*qh+h]; math.Abs(float64(got)-wl) > 1e-5*max(1, math.Abs(wl)) {
						t.Fatalf("seq %d head %d: lse %v, want %v", i, h, got, wl)
					}
					for j := range d {
						if got := res.O[(i*qh+h)*d+j]; math.Abs(float64(got)-wo[j]) > 1e-5 {
							t.Fatalf("seq %d head %d: o[%d] %v, want %v", i, h, j, got, wo[j])
						}
					}
				}
				if pl.Dense && (dg.Recall != 1 || math.Abs(dg.MassRecall-1) > 1e-5 || dg.RelL2 > 1e-5) {
					t.Fatalf("dense plan: recall %v mass %v rel L2 %v", dg.Recall, dg.MassRecall, dg.RelL2)
				}
				if !pl.Dense && (dg.MassRecall <= 0 || dg.MassRecall >= 1 || dg.PagesRead >= dg.PagesTotal) {
					t.Fatalf("sparse plan: mass recall %v, pages %d of %d", dg.MassRecall, dg.PagesRead, dg.PagesTotal)
				}
			}
		}
	}
}

// TestRaggedBatchEqualsSingles: one batched call gives the same outputs as
// one call per sequence.
func TestRaggedBatchEqualsSingles(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pol := plan.DefaultPolicy()
	pol.DenseLayers = 0
	sh := newTestShard(t, 1, 8, 2, 32, 16, 512, pol)
	lens := []int{2000, 17, 600}
	budgets := []int{256, 64, 0}
	var reqs []SeqStep
	for i, n := range lens {
		id := sh.Store().Create()
		fill(t, rng, sh, id, &refSeq{}, n)
		reqs = append(reqs, SeqStep{Seq: id, Q: randVec(rng, 8*32, 2), BudgetTokens: budgets[i]})
	}
	var all StepResult
	if err := sh.Step(context.Background(), 0, reqs, StepOptions{}, &all); err != nil {
		t.Fatal(err)
	}
	for i, r := range reqs {
		var one StepResult
		if err := sh.Step(context.Background(), 0, []SeqStep{r}, StepOptions{}, &one); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(one.O, all.O[i*8*32:(i+1)*8*32]) {
			t.Fatalf("sequence %d: batched output differs from single", i)
		}
	}
}

// TestGQAModesAgreeOnMHA: with one query head per KV head, group_max and
// per_head are the same rule.
func TestGQAModesAgreeOnMHA(t *testing.T) {
	var outs [2]StepResult
	for i, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
		rng := rand.New(rand.NewPCG(5, 6))
		pol := plan.DefaultPolicy()
		pol.DenseLayers = 0
		pol.GQA = mode
		sh := newTestShard(t, 1, 4, 4, 32, 16, 256, pol)
		id := sh.Store().Create()
		fill(t, rng, sh, id, &refSeq{}, 1500)
		req := SeqStep{Seq: id, Q: randVec(rng, 4*32, 2), BudgetTokens: 160}
		if err := sh.Step(context.Background(), 0, []SeqStep{req}, StepOptions{Diagnostics: true}, &outs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(outs[0].O, outs[1].O) || !slices.Equal(outs[0].LSE, outs[1].LSE) {
		t.Fatal("group_max and per_head outputs differ on MHA")
	}
	for h := range 4 {
		if !slices.Equal(outs[0].Diag[0].Selected[h], outs[1].Diag[0].Selected[h]) {
			t.Fatalf("head %d: selections differ", h)
		}
	}
}

// TestPhysicalPlacementInvariance appends the same data once alone and
// once interleaved with another sequence (so its pages land on different
// physical slots): selections and outputs must be identical.
func TestPhysicalPlacementInvariance(t *testing.T) {
	const qh, kvh, d, s, n = 8, 2, 32, 16, 800
	rng := rand.New(rand.NewPCG(7, 8))
	k := randVec(rng, n*kvh*d, 1)
	v := randVec(rng, n*kvh*d, 1)
	q := randVec(rng, qh*d, 2)
	pol := plan.DefaultPolicy()
	pol.DenseLayers = 0
	run := func(interleave bool) StepResult {
		sh := newTestShard(t, 1, qh, kvh, d, s, 256, pol)
		other := sh.Store().Create()
		id := sh.Store().Create()
		tok := kvh * d
		for t0 := 0; t0 < n; t0 += s {
			t1 := min(t0+s, n)
			if interleave {
				if err := sh.Append(other, 0, k[:s*tok], v[:s*tok]); err != nil {
					t.Fatal(err)
				}
			}
			if err := sh.Append(id, 0, k[t0*tok:t1*tok], v[t0*tok:t1*tok]); err != nil {
				t.Fatal(err)
			}
		}
		var res StepResult
		if err := sh.Step(context.Background(), 0, []SeqStep{{Seq: id, Q: q, BudgetTokens: 256}}, StepOptions{Diagnostics: true}, &res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b := run(false), run(true)
	for h := range qh {
		if !slices.Equal(a.Diag[0].Selected[h], b.Diag[0].Selected[h]) {
			t.Fatalf("head %d: selection depends on physical placement", h)
		}
	}
	for i := range a.O {
		if math.Abs(float64(a.O[i]-b.O[i])) > 1e-6 {
			t.Fatalf("output %d: %v vs %v", i, a.O[i], b.O[i])
		}
	}
}

// TestStepBadInput: each bad request fails with ErrBadInput (or the
// store's error) and changes nothing.
func TestStepBadInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	pol := plan.DefaultPolicy()
	sh := newTestShard(t, 2, 4, 2, 8, 16, 64, pol)
	id := sh.Store().Create()
	fill(t, rng, sh, id, &refSeq{}, 40)
	empty := sh.Store().Create()
	q := randVec(rng, 4*8, 1)
	kv := randVec(rng, 2*8, 1)
	nan := slices.Clone(kv)
	nan[3] = float32(math.NaN())
	cases := []struct {
		name  string
		layer int
		reqs  []SeqStep
	}{
		{"empty batch", 0, nil},
		{"layer out of range", 2, []SeqStep{{Seq: id, Q: q}}},
		{"short query", 0, []SeqStep{{Seq: id, Q: q[:5]}}},
		{"NaN query", 0, []SeqStep{{Seq: id, Q: append(slices.Clone(q[:31]), float32(math.NaN()))}}},
		{"inf in query", 0, []SeqStep{{Seq: id, Q: append(slices.Clone(q[:31]), float32(math.Inf(1)))}}},
		{"k without v", 0, []SeqStep{{Seq: id, Q: q, K: kv}}},
		{"NaN key", 0, []SeqStep{{Seq: id, Q: q, K: nan, V: kv}}},
		{"NaN key in second sequence", 0, []SeqStep{{Seq: empty, Q: q, K: kv, V: kv}, {Seq: id, Q: q, K: nan, V: kv}}},
		{"unknown sequence", 0, []SeqStep{{Seq: 999, Q: q}}},
		{"duplicate sequence", 0, []SeqStep{{Seq: id, Q: q}, {Seq: id, Q: q}}},
		{"budget below a page", 0, []SeqStep{{Seq: id, Q: q, BudgetTokens: 8}}},
		{"negative budget", 0, []SeqStep{{Seq: id, Q: q, BudgetTokens: -16}}},
		{"no tokens", 0, []SeqStep{{Seq: empty, Q: q}}},
	}
	before := sh.Store().Stats()
	for _, c := range cases {
		var res StepResult
		err := sh.Step(context.Background(), c.layer, c.reqs, StepOptions{}, &res)
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if !errors.Is(err, ErrBadInput) && !errors.Is(err, pagestore.ErrUnknownSequence) {
			t.Errorf("%s: error %v is neither ErrBadInput nor ErrUnknownSequence", c.name, err)
		}
		if n, _ := sh.Store().Len(id); n != 40 {
			t.Fatalf("%s: sequence length changed to %d", c.name, n)
		}
		if n, _ := sh.Store().Len(empty); n != 0 {
			t.Fatalf("%s: empty sequence grew to %d", c.name, n)
		}
		if after := sh.Store().Stats(); after != before {
			t.Fatalf("%s: store stats changed: %+v -> %+v", c.name, before, after)
		}
	}
}

// TestStepAppendsNewToken: the new token is appended before attention and
// attends to itself.
func TestStepAppendsNewToken(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	pol := plan.DefaultPolicy()
	pol.DenseLayers = 0
	sh := newTestShard(t, 1, 2, 1, 8, 4, 16, pol)
	id := sh.Store().Create()
	ref := &refSeq{}
	fill(t, rng, sh, id, ref, 4)
	k, v := randVec(rng, 8, 1), randVec(rng, 8, 1)
	q := randVec(rng, 16, 1)
	var res StepResult
	if err := sh.Step(context.Background(), 0, []SeqStep{{Seq: id, Q: q, K: k, V: v}}, StepOptions{}, &res); err != nil {
		t.Fatal(err)
	}
	ref.k[0] = append(ref.k[0], k...)
	ref.v[0] = append(ref.v[0], v...)
	if n, _ := sh.Store().Len(id); n != 5 {
		t.Fatalf("length %d after a step with a new token, want 5", n)
	}
	wo, _ := ref.attend(0, 1, 2, 1, 8, 4, q[8:], []int32{0, 1})
	for j := range 8 {
		if math.Abs(float64(res.O[8+j])-wo[j]) > 1e-5 {
			t.Fatalf("o[%d] = %v, want %v", j, res.O[8+j], wo[j])
		}
	}
}
