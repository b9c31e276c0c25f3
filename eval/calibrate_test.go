package eval

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// TestPageBoundsNotes is the notes' hand-worked example (eq. 5): keys
// (1,4), (3,-2), (-1,1) and q = (2,-1) bound the page at 8; keys (3,4),
// (-1,-2) have the same box and the same bound 8 over true dots 2 and 0.
func TestPageBoundsNotes(t *testing.T) {
	q := []float32{2, -1}
	for _, keys := range [][]float32{{1, 4, 3, -2, -1, 1}, {3, 4, -1, -2}} {
		n := len(keys) / 2
		b := PageBounds(q, keys, n, 1, 1, 2, 4)
		if len(b) != 1 || len(b[0]) != 1 || b[0][0] != 8 {
			t.Fatalf("keys %v: bounds %v, want [[8]]", keys, b)
		}
	}
}

// TestMassCurveHand: four pages of mass .1 .4 .2 .3, sink 1, local 1,
// candidates ranked 2 over 1: K = 1 reads page 0 and 3 (forced, K is
// below them: the plan still reads its forced pages), K = 2 the same,
// K = 3 adds page 2, and K = 4 is dense.
func TestMassCurveHand(t *testing.T) {
	pm := []float64{0.1, 0.4, 0.2, 0.3}
	order := rankPages([]float64{9, 1, 5, 9}, 1, 3)
	if !slices.Equal(order, []int{2, 1}) {
		t.Fatalf("order %v, want [2 1]", order)
	}
	got := MassCurve(pm, order, 1, 1)
	want := []float64{0.4, 0.4, 0.4, 0.6}
	for k := range want {
		if math.Abs(got[k]-want[k]) > 1e-12 {
			t.Fatalf("curve %v, want %v", got, want)
		}
	}
	// Ties go to the lower page.
	if o := rankPages([]float64{3, 3, 3}, 0, 3); !slices.Equal(o, []int{0, 1, 2}) {
		t.Fatalf("tied order %v", o)
	}
}

// TestCalibrationCurveMatchesEngine: the calibrator's float64 curve at a
// budget equals the engine's own diagnostics (its Quest selection and its
// dense reference) per head, on random keys with a planted heavy page,
// for both GQA modes, sink and local pages.
func TestCalibrationCurveMatchesEngine(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	g := model.Geometry{Layers: 1, Heads: 4, KVHeads: 2, HeadDim: 8}
	for _, mode := range []plan.GQAMode{plan.GroupMax, plan.PerHead} {
		for trial := range 12 {
			pol := plan.DefaultPolicy()
			pol.PageSize = 4 + 4*rng.IntN(2)
			pol.DenseLayers, pol.SinkPages, pol.LocalPages, pol.GQA = 0, rng.IntN(2), rng.IntN(2), mode
			n := 40 + rng.IntN(60)
			keys := make([]float32, n*g.KVHeads*g.HeadDim)
			vals := make([]float32, len(keys))
			for i := range keys {
				keys[i] = float32(rng.NormFloat64())
				vals[i] = float32(rng.NormFloat64())
			}
			q := make([]float32, g.Heads*g.HeadDim)
			for i := range q {
				q[i] = float32(rng.NormFloat64()) * 1.5
			}
			np := (n + pol.PageSize - 1) / pol.PageSize
			e, err := engine.New(engine.ModelConfig(g, pol, np+4))
			if err != nil {
				t.Fatal(err)
			}
			id, err := e.Create(plan.Striped)
			if err != nil {
				t.Fatal(err)
			}
			kvd := g.KVHeads * g.HeadDim
			// All but the last token appended, the last one comes with the step.
			if err := e.Append(id, 0, keys[:(n-1)*kvd], vals[:(n-1)*kvd]); err != nil {
				t.Fatal(err)
			}
			k := 1 + rng.IntN(np-1)
			budget := k * pol.PageSize
			var res engine.Result
			req := engine.Request{Seq: id, Q: q, K: keys[(n-1)*kvd:], V: vals[(n-1)*kvd:], BudgetTokens: budget}
			if err := e.Step(context.Background(), 0, []engine.Request{req}, engine.StepOptions{Diagnostics: true}, &res); err != nil {
				t.Fatal(err)
			}
			e.Close()
			c := &Calibrator{cfg: CalibrateConfig{Policy: pol, TargetMass: 0.99, MaxRho: 1}, g: g, curves: [][]curve{make([]curve, g.KVHeads)}}
			c.observe(0, q, keys)
			dg := res.Diag[0]
			grp := g.Heads / g.KVHeads
			for kvh := range g.KVHeads {
				var want float64
				for h := kvh * grp; h < (kvh+1)*grp; h++ {
					want += dg.HeadMassRecall[h] / float64(grp)
				}
				if got := c.MassAt(0, kvh, budget); math.Abs(got-want) > 1e-4 {
					t.Fatalf("%v trial %d (n %d, S %d, sink %d, local %d, K %d) KV head %d: calibrator %v, engine %v (plan %+v)",
						mode, trial, n, pol.PageSize, pol.SinkPages, pol.LocalPages, k, kvh, got, want, res.Plans[0])
				}
			}
		}
	}
}

// TestCalibrationResult: on synthetic curves, the budget is the smallest
// reaching the target, a layer needing every page is dense, and the
// uniform budget reads the same pages.
func TestCalibrationResult(t *testing.T) {
	pol := plan.DefaultPolicy() // S 16, 2 dense layers
	c := &Calibrator{cfg: CalibrateConfig{Policy: pol, TargetMass: 0.9, MaxRho: 1}, g: model.Geometry{Layers: 4, KVHeads: 1},
		curves: make([][]curve, 4)}
	const np = 10
	ramp := func(k0 int) []float64 { // mass 1 from K = k0, 0.5 before
		m := make([]float64, np)
		for k := range m {
			m[k] = 0.5
			if k >= k0 {
				m[k] = 1
			}
		}
		return m
	}
	for l, k0 := range []int{np, np, 3, 5} { // layers 0 and 1 need dense
		c.curves[l] = make([]curve, 1)
		c.curves[l][0].add(ramp(k0))
		c.pages += np
		c.nPages++
	}
	r, err := c.Result()
	if err != nil {
		t.Fatal(err)
	}
	if r.Policy.DenseLayers != 2 || r.Policy.LayerBudget[2] != 48 || r.Policy.LayerBudget[3] != 80 {
		t.Fatalf("policy %+v, want 2 dense layers, budgets 48 and 80", r.Policy)
	}
	if !r.Layers[0].Dense || r.Layers[2].Dense || r.Layers[2].Budget != 48 {
		t.Fatalf("layers %+v", r.Layers)
	}
	// Reads: 10 + 10 + (3 + 10/16) + (5 + 10/16); uniform over layers 2-3:
	// K = 4 pages = 64 tokens.
	if r.UniformBudget != 64 {
		t.Fatalf("uniform budget %d, want 64", r.UniformBudget)
	}
	if _, err := (&Calibrator{}).Result(); err != ErrNoSamples {
		t.Fatalf("empty calibrator: %v", err)
	}
}

// TestCalibrateModel: on passkey-llama-v1, curves rise with the budget to
// 1 at every page, every layer has one curve per KV head, each decode
// step of every prompt is counted, and the calibrated policy validates.
func TestCalibrateModel(t *testing.T) {
	m, err := model.Load(filepath.Join(modelsDir(t), "passkey-llama-v1"), model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := model.NewByteTokenizer(m.Config)
	if err != nil {
		t.Fatal(err)
	}
	cal, err := NewCalibrator(m, tok, DefaultCalibrateConfig())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	steps := 0
	for range 3 {
		p, err := Passkey(rng, 1024, PasskeyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := cal.Add(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		steps += len(p.Question) + len(p.Answer) - 1
	}
	r, err := cal.Result()
	if err != nil {
		t.Fatal(err)
	}
	if r.Prompts != 3 || r.Steps != steps || len(r.Layers) != m.Config.Layers {
		t.Fatalf("%d prompts, %d steps (want %d), %d layers", r.Prompts, r.Steps, steps, len(r.Layers))
	}
	for _, l := range r.Layers {
		if len(l.HeadBudgets) != m.Config.KVHeads {
			t.Fatalf("layer %d: %d head budgets", l.Layer, len(l.HeadBudgets))
		}
		prev := 0.0
		for _, pt := range l.Curve {
			if pt.Mass < prev-1e-12 || pt.Mass > 1+1e-12 {
				t.Fatalf("layer %d: curve %+v not rising in [0, 1]", l.Layer, l.Curve)
			}
			prev = pt.Mass
		}
		if last := l.Curve[len(l.Curve)-1]; math.Abs(last.Mass-1) > 1e-9 {
			t.Fatalf("layer %d: mass %v at %d tokens (every page)", l.Layer, last.Mass, last.Budget)
		}
	}
	if err := r.Policy.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Logf("policy %+v, uniform budget %d", r.Policy, r.UniformBudget)
}
