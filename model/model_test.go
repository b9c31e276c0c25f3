package model

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

func randTokens(rng *rand.Rand, n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = rng.IntN(256)
	}
	return ids
}

// TestAttentionImplsAgree: on a tiny random model, every Attention gives
// the logits of a one-shot float64 prefill at every position, whether the
// tokens come as one prefill, as chunks of prefill (the dense cache's
// offset path, the engine's dense steps) or as decode steps, for prompt
// lengths around page boundaries.
func TestAttentionImplsAgree(t *testing.T) {
	m := loadTiny(t, BF16, 1)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 3))
	ids := randTokens(rng, 90)
	want, err := m.Forward(ctx, NewReference(m.Geometry()), ids, ForwardOptions{AllLogits: true})
	if err != nil {
		t.Fatal(err)
	}
	v := m.Config.VocabSize
	p := plan.DefaultPolicy()
	p.DenseLayers = 0
	p.BudgetTokens = 256 // covers 90 tokens: dense plans
	impls := map[string]func() Attention{
		"reference": func() Attention { return NewReference(m.Geometry()) },
		"dense":     func() Attention { return NewDense(m.Geometry(), 3) },
		"engine": func() Attention {
			a, err := NewEngineAttention(newEngine(t, m, p, 256, 1, 1), m.Geometry())
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		"engine cp2 tp2": func() Attention {
			a, err := NewEngineAttention(newEngine(t, m, p, 256, 2, 2), m.Geometry())
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
	}
	for name, mk := range impls {
		for _, split := range [][]int{{90}, {1, 14, 1, 74}, {15, 16, 17, 42}, {16, 1, 1, 1, 1, 70}} {
			attn := mk()
			pos := 0
			for _, n := range split {
				got, err := m.Forward(ctx, attn, ids[pos:pos+n], ForwardOptions{AllLogits: true})
				if err != nil {
					t.Fatal(err)
				}
				if abs, _ := logitErr(got, want[pos*v:(pos+n)*v]); abs > 2e-5 {
					t.Errorf("%s split %v: tokens %d..%d: logits off by %.3g", name, split, pos, pos+n-1, abs)
				}
				pos += n
			}
			if attn.Len() != len(ids) {
				t.Errorf("%s: Len %d after %d tokens", name, attn.Len(), len(ids))
			}
		}
	}
}

// TestEngineLoad: keys and values recorded by a dense prefill, loaded
// into an engine sequence, decode like a sequence prefilled in place.
func TestEngineLoad(t *testing.T) {
	m := loadTiny(t, F32, 1)
	rng := rand.New(rand.NewPCG(5, 5))
	ids := randTokens(rng, 70)
	p := plan.DefaultPolicy()
	p.BudgetTokens = 32 // sparse layers from layer 2 on: here none (2 layers)
	p.DenseLayers = 1
	e := newEngine(t, m, p, 256, 1, 1)
	direct, err := NewEngineAttention(e, m.Geometry())
	if err != nil {
		t.Fatal(err)
	}
	want, wantToks := decodeRun(t, m, direct, ids, 8)
	rec := NewDense(m.Geometry(), 0)
	if _, err := m.Forward(context.Background(), rec, ids, ForwardOptions{}); err != nil {
		t.Fatal(err)
	}
	loaded, err := NewEngineAttention(e, m.Geometry())
	if err != nil {
		t.Fatal(err)
	}
	if err := loaded.Load(rec); err != nil {
		t.Fatal(err)
	}
	if loaded.Len() != len(ids) {
		t.Fatalf("Len %d after loading %d tokens", loaded.Len(), len(ids))
	}
	// want[0] came from the prefill; the steps decode from loaded pages.
	for i, id := range wantToks {
		got, err := m.Forward(context.Background(), loaded, []int{id}, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if abs, _ := logitErr(got, want[i+1]); abs > 1e-6 {
			t.Errorf("step %d: logits differ by %.3g", i, abs)
		}
	}
	if st := loaded.Steps()[1]; st.Plan.Dense || st.PagesRead >= st.PagesTotal {
		t.Errorf("layer 1 should be sparse at 78 tokens with a 32-token budget: %+v", st)
	}
	if err := loaded.Load(rec); err == nil {
		t.Error("load into a non-empty sequence succeeded")
	}
}

func TestForwardBadInput(t *testing.T) {
	m := loadTiny(t, BF16, 1)
	a := NewDense(m.Geometry(), 0)
	for _, ids := range [][]int{nil, {1, 2, 260}, {-1}, make([]int, 4097)} {
		if _, err := m.Forward(context.Background(), a, ids, ForwardOptions{}); !errors.Is(err, ErrBadInput) {
			t.Errorf("%d tokens: error %v, want ErrBadInput", len(ids), err)
		}
		if a.Len() != 0 {
			t.Fatalf("a refused pass changed the cache: Len %d", a.Len())
		}
	}
}

// TestCausalKernel: the tiled float32 kernel matches the float64
// reference for geometries and offsets around its tile sizes.
func TestCausalKernel(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, c := range []struct {
		g       Geometry
		base, n int
	}{
		{Geometry{1, 4, 2, 8}, 0, 1},
		{Geometry{1, 4, 2, 8}, 0, 17},
		{Geometry{1, 8, 2, 32}, 0, 200},
		{Geometry{1, 6, 2, 64}, 63, 66},
		{Geometry{1, 6, 6, 16}, 129, 1},
		{Geometry{1, 3, 1, 40}, 5, 31},
	} {
		total := c.base + c.n
		k := randVecs(rng, total*c.g.KVHeads*c.g.HeadDim, 2)
		v := randVecs(rng, total*c.g.KVHeads*c.g.HeadDim, 1)
		q := randVecs(rng, c.n*c.g.Heads*c.g.HeadDim, 2)
		ref := NewReference(c.g)
		qd, kvd := c.g.Heads*c.g.HeadDim, c.g.KVHeads*c.g.HeadDim
		// The reference needs its own prefix: feed it the first base tokens
		// with dummy queries.
		if c.base > 0 {
			dummy := make([]float32, c.base*qd)
			if err := ref.Prefill(context.Background(), 0, dummy, k[:c.base*kvd], v[:c.base*kvd], make([]float32, c.base*qd)); err != nil {
				t.Fatal(err)
			}
		}
		want := make([]float32, c.n*qd)
		if err := ref.Prefill(context.Background(), 0, q, k[c.base*kvd:], v[c.base*kvd:], want); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, c.n*qd)
		if err := causalAttention(context.Background(), 2, c.g, q, c.n, k, v, c.base, got); err != nil {
			t.Fatal(err)
		}
		if abs, _ := logitErr(got, want); abs > 5e-6 {
			t.Errorf("%+v base %d n %d: off by %.3g", c.g, c.base, c.n, abs)
		}
	}
}

func randVecs(rng *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * scale)
	}
	return x
}

func TestExpNeg(t *testing.T) {
	worst := 0.0
	for x := float32(0); x > -80; x -= 0.0137 {
		want := math.Exp(float64(x))
		rel := math.Abs(float64(expNeg(x))-want) / want
		worst = max(worst, rel)
	}
	if worst > 3e-7 {
		t.Errorf("expNeg relative error %.3g", worst)
	}
	if e := expNeg(-100); e > 2e-35 || e < 1e-35 || expNeg(0) != 1 {
		t.Errorf("expNeg(-100) = %v (want e^-80), expNeg(0) = %v", e, expNeg(0))
	}
}

func TestSampler(t *testing.T) {
	logits := []float32{1, 3, 2, 3, -1}
	g, _ := NewSampler(0, 0, 1)
	if got := g.Sample(logits); got != 1 {
		t.Errorf("greedy picks %d, want 1 (first of the tied maxima)", got)
	}
	// Top-p below the top token's probability keeps only the top tokens.
	s, _ := NewSampler(1, 0.3, 1)
	for range 100 {
		if got := s.Sample(logits); got != 1 {
			t.Fatalf("top-p 0.3 sampled %d", got)
		}
	}
	// Same seed, same draws; the frequencies follow softmax(logits / T).
	a, _ := NewSampler(0.7, 1, 42)
	b, _ := NewSampler(0.7, 1, 42)
	counts := make([]float64, len(logits))
	const n = 20000
	for range n {
		x := a.Sample(logits)
		if y := b.Sample(logits); x != y {
			t.Fatal("same seed, different draws")
		}
		counts[x]++
	}
	var sum float64
	p := make([]float64, len(logits))
	for i, l := range logits {
		p[i] = math.Exp(float64(l) / 0.7)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
		if se := math.Sqrt(p[i] * (1 - p[i]) / n); math.Abs(counts[i]/n-p[i]) > 5*se+1e-4 {
			t.Errorf("token %d: frequency %.4f, softmax %.4f", i, counts[i]/n, p[i])
		}
	}
	for _, bad := range [][2]float64{{-1, 1}, {1, 1.5}, {math.NaN(), 1}, {math.Inf(1), 1}} {
		if _, err := NewSampler(bad[0], bad[1], 0); err == nil {
			t.Errorf("NewSampler(%v, %v) accepted", bad[0], bad[1])
		}
	}
}

// TestSamplerTopKMinP: top-k keeps the k most likely tokens and min-p
// those at least min_p times as likely as the most likely; the draws over
// a fine grid of u spread over the kept tokens as softmax(logits / T)
// renormalized over them; top-p applies among the top-k (vLLM's order).
func TestSamplerTopKMinP(t *testing.T) {
	logits := []float32{1, 3, 2, 2.5, -1, 0}
	const temp = 1.0
	p := make([]float64, len(logits))
	for i, l := range logits {
		p[i] = math.Exp(float64(l) / temp)
	}
	// freq samples u over a grid of [0, 1) and counts the tokens.
	freq := func(s *Sampler) []float64 {
		const n = 100000
		c := make([]float64, len(logits))
		for i := range n {
			c[s.SampleU(logits, (float64(i)+0.5)/n)]++
		}
		for i := range c {
			c[i] /= n
		}
		return c
	}
	// want is the softmax renormalized over the kept tokens.
	want := func(keep ...int) []float64 {
		w := make([]float64, len(logits))
		var z float64
		for _, i := range keep {
			z += p[i]
		}
		for _, i := range keep {
			w[i] = p[i] / z
		}
		return w
	}
	for _, c := range []struct {
		name string
		s    Sampler
		keep []int
	}{
		{"top_k 2", Sampler{Temperature: temp, TopK: 2}, []int{1, 3}},
		{"top_k 3", Sampler{Temperature: temp, TopK: 3}, []int{1, 3, 2}},
		{"top_k over the vocabulary", Sampler{Temperature: temp, TopK: 100}, []int{0, 1, 2, 3, 4, 5}},
		// p(2.5)/p(3) = e^-0.5 = 0.61, p(2)/p(3) = e^-1 = 0.37.
		{"min_p 0.5", Sampler{Temperature: temp, MinP: 0.5}, []int{1, 3}},
		{"min_p 0.3", Sampler{Temperature: temp, MinP: 0.3}, []int{1, 3, 2}},
		{"min_p 1", Sampler{Temperature: temp, MinP: 1}, []int{1}},
		// Among the top 3 (1, 3, 2), token 1 holds 0.51 of the mass: a
		// top_p of 0.6 keeps 1 and 3.
		{"top_k 3 then top_p 0.6", Sampler{Temperature: temp, TopK: 3, TopP: 0.6}, []int{1, 3}},
		{"top_k 1", Sampler{Temperature: temp, TopK: 1}, []int{1}},
	} {
		got, w := freq(&c.s), want(c.keep...)
		for i := range got {
			if math.Abs(got[i]-w[i]) > 1e-3 {
				t.Errorf("%s: token %d drawn %.4f of the time, want %.4f (kept %v)", c.name, i, got[i], w[i], c.keep)
			}
		}
	}
}

// TestSummarize: bytes read vs dense follow the byte model: a sparse
// layer reads its K pages and scans every page's summary (1/S of its
// K/V), a dense layer reads everything.
func TestSummarize(t *testing.T) {
	steps := []StepInfo{
		{Plan: plan.Plan{Pages: 64, Dense: true, K: 8}, PagesRead: 128, PagesTotal: 128},
		{Plan: plan.Plan{Pages: 64, K: 8, Local: 1, Rank: 7}, PagesRead: 16, PagesTotal: 128},
	}
	s := Summarize(steps, 16)
	wantSparse := 1.0/16 + 8.0/64
	if s.PagesRead != 144 || s.PagesTotal != 256 || s.SparseLayers != 1 ||
		math.Abs(s.SparseRho-wantSparse) > 1e-12 || math.Abs(s.SparseRhoFormula-wantSparse) > 1e-12 ||
		math.Abs(s.Rho-(128+16+8)/256.0) > 1e-12 || math.Abs(s.RhoFormula-(1+wantSparse)/2) > 1e-12 {
		t.Errorf("%+v", s)
	}
}

// TestRopeLlama3: Llama 3.1 scaling keeps wavelengths below
// original/high_freq_factor, divides those above original/low_freq_factor
// by factor, and interpolates in between.
func TestRopeLlama3(t *testing.T) {
	c := Config{HeadDim: 128, RopeTheta: 500000}
	plain := newRope(c).invFreq
	c.RopeScaling = &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
	scaled := newRope(c).invFreq
	var kept, divided, mixed int
	for i, f := range plain {
		wave := 2 * math.Pi / f
		switch {
		case wave < 8192/4.0:
			kept++
			if scaled[i] != f {
				t.Errorf("dim %d (wavelength %.0f): %v, want unchanged %v", i, wave, scaled[i], f)
			}
		case wave > 8192:
			divided++
			if math.Abs(scaled[i]-f/8) > 1e-15 {
				t.Errorf("dim %d (wavelength %.0f): %v, want %v", i, wave, scaled[i], f/8)
			}
		default:
			mixed++
			if !(scaled[i] < f && scaled[i] > f/8) {
				t.Errorf("dim %d (wavelength %.0f): %v not between %v and %v", i, wave, scaled[i], f/8, f)
			}
		}
	}
	if kept == 0 || divided == 0 || mixed == 0 {
		t.Errorf("kept %d, divided %d, interpolated %d: the test covers every case", kept, divided, mixed)
	}
}
