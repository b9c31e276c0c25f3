package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// shape is a Shaper of fixed values.
type shape struct {
	layers int
	g      plan.Geometry
}

func (s shape) Shape() (int, plan.Geometry) { return s.layers, s.g }

// TestModelConfig: the configuration takes the shape's layers and heads,
// the policy's page size and the capacity, and validates.
func TestModelConfig(t *testing.T) {
	p := DefaultConfig().Policy
	p.PageSize = 32
	c := ModelConfig(shape{3, plan.Geometry{QHeads: 8, KVHeads: 2, HeadDim: 16, DType: plan.Float32}}, p, 77)
	want := plan.Geometry{QHeads: 8, KVHeads: 2, HeadDim: 16, PageSize: 32, DType: plan.Float32}
	if c.Layers != 3 || c.Geometry != want || c.CapacityPages != 77 || !reflect.DeepEqual(c.Policy, p) {
		t.Fatalf("config: %d layers, %+v, %d pages, policy %+v; want 3, %+v, 77, %+v", c.Layers, c.Geometry, c.CapacityPages, c.Policy, want, p)
	}
	if c.CP != 1 || c.TP != 1 {
		t.Fatalf("config: cp %d tp %d, want one shard", c.CP, c.TP)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, c)
	if l, g := e.Shape(); l != 3 || g != want {
		t.Fatalf("shape: %d layers, %+v; want 3, %+v", l, g, want)
	}
}

// TestSequenceStepLayer: a sequence handle's measured one-layer step
// (diagnostics inside the step, a new token) on a CP 3 x TP 2 engine
// equals the same step of a single shard fed the same data, and its fork,
// rollback and release act on the engine.
func TestSequenceStepLayer(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 24))
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 8, 4, 16, 16
	cfg.CP, cfg.TP, cfg.CapacityPages = 3, 2, 200
	cfg.Policy.PageSize, cfg.Policy.DenseLayers, cfg.Policy.GQA = 16, 1, kernels.GroupMax
	p := newPair(t, cfg)
	ctx := context.Background()
	s, err := p.e.NewSequence(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	if s.Stepper() != decode.Stepper(p.e) {
		t.Fatal("the sequence's Stepper is not its engine")
	}
	p.ids[s.SeqID()] = p.ref.Store().Create()
	kvd := cfg.KVHeads * cfg.HeadDim
	const n = 300
	for l := range cfg.Layers {
		k, v := randVec(rng, n*kvd), randVec(rng, n*kvd)
		if err := s.Append(ctx, l, k, v); err != nil {
			t.Fatal(err)
		}
		if err := p.ref.Append(p.ids[s.SeqID()], l, k, v); err != nil {
			t.Fatal(err)
		}
	}
	var got decode.Result
	for l := range cfg.Layers {
		q, k, v := randVec(rng, cfg.QHeads*cfg.HeadDim), randVec(rng, kvd), randVec(rng, kvd)
		opt := StepOptions{Diagnostics: true}
		if err := s.StepLayer(ctx, l, decode.Row{Budget: 64}, q, k, v, opt, &got); err != nil {
			t.Fatal(err)
		}
		var want shard.StepResult
		ref := []shard.SeqStep{{Seq: p.ids[s.SeqID()], Q: q, K: k, V: v, BudgetTokens: 64}}
		if err := p.ref.Step(ctx, l, ref, shard.StepOptions{Diagnostics: true}, &want); err != nil {
			t.Fatal(err)
		}
		if len(got.Plans) != 1 || got.Plans[0] != want.Plans[0] {
			t.Fatalf("layer %d: plans %+v, single shard %+v", l, got.Plans, want.Plans[0])
		}
		if !got.O.OnHost() || len(got.O.Data) != len(want.O) || len(got.LSE) != len(want.LSE) || len(got.Diag) != 1 {
			t.Fatalf("layer %d: %d outputs (host %v), %d LSE, %d diagnostics; want %d, %d, 1", l, len(got.O.Data), got.O.OnHost(), len(got.LSE), len(got.Diag), len(want.O), len(want.LSE))
		}
		for j, w := range want.O {
			if math.Abs(float64(got.O.Data[j]-w)) > 2e-5*max(1, math.Abs(float64(w))) {
				t.Fatalf("layer %d output %d: %v, single shard %v", l, j, got.O.Data[j], w)
			}
		}
		for h := range cfg.QHeads {
			if !slices.Equal(got.Diag[0].Selected[h], want.Diag[0].Selected[h]) {
				t.Fatalf("layer %d head %d: selected %v, single shard %v", l, h, got.Diag[0].Selected[h], want.Diag[0].Selected[h])
			}
		}
		if math.Abs(got.Diag[0].MassRecall-want.Diag[0].MassRecall) > 1e-4 {
			t.Fatalf("layer %d: mass recall %v, single shard %v", l, got.Diag[0].MassRecall, want.Diag[0].MassRecall)
		}
		// Without diagnostics the result holds none.
		if err := s.StepLayer(ctx, l, decode.Row{}, q, nil, nil, StepOptions{}, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Diag) != 0 || len(got.Plans) != 1 {
			t.Fatalf("layer %d without diagnostics: %d diagnostics, %d plans; want 0, 1", l, len(got.Diag), len(got.Plans))
		}
	}
	f, err := s.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Rollback(ctx, 5); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[SeqID]int{s.SeqID(): n + 1, f.SeqID(): n - 4} {
		if got, err := p.e.Len(id); err != nil || got != want {
			t.Fatalf("sequence %d: %d tokens (%v), want %d", id, got, err, want)
		}
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.e.Len(f.SeqID()); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("released fork: %v, want ErrUnknownSequence", err)
	}
	q := randVec(rng, cfg.QHeads*cfg.HeadDim)
	if err := f.StepLayer(ctx, 0, decode.Row{}, q, nil, nil, StepOptions{}, &got); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("step of a released sequence: %v, want ErrUnknownSequence", err)
	}
	dev := decode.Result{O: decode.OnDevice(decode.Device{Kind: decode.CUDA}, 1, 8, 0)}
	if err := s.StepLayer(ctx, 0, decode.Row{}, q, nil, nil, StepOptions{}, &dev); !errors.Is(err, decode.ErrDeviceTensor) {
		t.Fatalf("step into a device output: %v, want ErrDeviceTensor", err)
	}
	if l, err := p.e.Len(s.SeqID()); err != nil || l != n+1 {
		t.Fatalf("after refused steps: %d tokens (%v), want %d", l, err, n+1)
	}
}
