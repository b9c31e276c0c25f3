package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Decode over every layer (one BeginStep per step) gives, layer by layer,
// the outputs of Step on an identical engine, with queries that depend on
// the previous layer's output as a model's do; lengths grow by one in
// every layer.
func TestDecodeEqualsStepPerLayer(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	for _, mode := range []Selection{Exact, Union, Replicated} {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 4, 8, 4, 16, 4
		cfg.CP, cfg.TP, cfg.CapacityPages, cfg.Selection = 3, 2, 64, mode
		cfg.Policy.PageSize, cfg.Policy.BudgetTokens, cfg.Policy.DenseLayers = 4, 16, 1
		cfg.Backend, cfg.MemoryLimit = be, memlimit.NoLimit
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		rng := rand.New(rand.NewPCG(9, uint64(mode)))
		kv, qd := cfg.KVHeads*cfg.HeadDim, cfg.QHeads*cfg.HeadDim
		var ida, idb []SeqID
		for s := range 2 {
			x, _ := a.Create(plan.Striped)
			y, _ := b.Create(plan.Striped)
			ida, idb = append(ida, x), append(idb, y)
			n := 30 + 17*s
			for l := range cfg.Layers {
				k, v := randVec(rng, n*kv), randVec(rng, n*kv)
				if err := a.Append(x, l, k, v); err != nil {
					t.Fatal(err)
				}
				if err := b.Append(y, l, k, v); err != nil {
					t.Fatal(err)
				}
			}
		}
		// q of layer l+1 derives from layer l's output (a stand-in for a
		// model's residual stream).
		derive := func(o []float32, i, l int) (q, k, v []float32) {
			q, k, v = make([]float32, qd), make([]float32, kv), make([]float32, kv)
			for j := range q {
				q[j] = o[i*qd+j]*3 + float32(math.Sin(float64(j+l)))
			}
			for j := range k {
				k[j], v[j] = o[i*qd+j]*2+float32(l), o[i*qd+(j+5)%qd]
			}
			return
		}
		for step := range 3 {
			reqs := make([]Request, 2)
			for i := range reqs {
				reqs[i] = Request{Seq: ida[i], Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}
			}
			// The reference: Step layer by layer on engine b.
			ref := make([][]float32, cfg.Layers)
			breqs := make([]Request, 2)
			for i := range breqs {
				breqs[i] = Request{Seq: idb[i], Q: reqs[i].Q, K: reqs[i].K, V: reqs[i].V}
			}
			for l := range cfg.Layers {
				var res Result
				if err := b.Step(context.Background(), l, breqs, StepOptions{}, &res); err != nil {
					t.Fatal(err)
				}
				ref[l] = append([]float32(nil), res.O...)
				for i := range breqs {
					breqs[i].Q, breqs[i].K, breqs[i].V = derive(res.O, i, l)
				}
			}
			got := make([][]float32, cfg.Layers)
			var res Result
			err := a.Decode(context.Background(), 0, cfg.Layers, reqs, StepOptions{}, &res, func(l int, rq []Request, r *Result) error {
				got[l] = append([]float32(nil), r.O...)
				for i := range rq {
					rq[i].Q, rq[i].K, rq[i].V = derive(r.O, i, l)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%v step %d: %v", mode, step, err)
			}
			got[cfg.Layers-1] = append([]float32(nil), res.O...)
			for l := range cfg.Layers {
				for j := range ref[l] {
					if got[l][j] != ref[l][j] {
						t.Fatalf("%v step %d layer %d: o[%d] %g, Step gives %g", mode, step, l, j, got[l][j], ref[l][j])
					}
				}
			}
		}
		for i := range ida {
			na, _ := a.Len(ida[i])
			nb, _ := b.Len(idb[i])
			if na != nb || na != 30+17*i+3 {
				t.Fatalf("lengths %d and %d, want %d", na, nb, 30+17*i+3)
			}
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 3, 4, 2, 8, 4
	cfg.Policy.PageSize, cfg.CapacityPages, cfg.MemoryLimit = 4, 16, memlimit.NoLimit
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	id, _ := e.Create(plan.Striped)
	rng := rand.New(rand.NewPCG(1, 1))
	kv, qd := cfg.KVHeads*cfg.HeadDim, cfg.QHeads*cfg.HeadDim
	if err := e.Append(id, 0, randVec(rng, 8*kv), randVec(rng, 8*kv)); err != nil {
		t.Fatal(err)
	}
	var res Result
	req := []Request{{Seq: id, Q: randVec(rng, qd)}}
	ok := func(int, []Request, *Result) error { return nil }
	for name, run := range map[string]func() error{
		"uneven layers": func() error { return e.Decode(context.Background(), 0, 3, req, StepOptions{}, &res, ok) },
		"diagnostics": func() error {
			return e.Decode(context.Background(), 0, 1, req, StepOptions{Diagnostics: true}, &res, ok)
		},
		"empty range": func() error { return e.Decode(context.Background(), 1, 1, req, StepOptions{}, &res, ok) },
		"no next":     func() error { return e.Decode(context.Background(), 0, 2, req, StepOptions{}, &res, nil) },
	} {
		if err := run(); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
	// A token at the first layer and not at the next fails the step
	// there; the first layer's token stays.
	for l := 1; l < 3; l++ {
		if err := e.Append(id, l, randVec(rng, 8*kv), randVec(rng, 8*kv)); err != nil {
			t.Fatal(err)
		}
	}
	req = []Request{{Seq: id, Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}}
	err = e.Decode(context.Background(), 0, 3, req, StepOptions{}, &res, func(l int, rq []Request, _ *Result) error {
		rq[0].K, rq[0].V = nil, nil
		return nil
	})
	if !errors.Is(err, ErrBadInput) {
		t.Fatalf("token dropped mid-step: %v", err)
	}
	// The engine goes on: a Step works.
	if err := e.Step(context.Background(), 1, []Request{{Seq: id, Q: randVec(rng, qd)}}, StepOptions{}, &res); err != nil {
		t.Fatal(err)
	}
}

// Finite inputs whose scores would overflow float32 are refused before
// anything changes: a key over MagnitudeLimit at append, a query over it
// at step (with a new token: not appended). At the limit, the largest
// possible score stays finite.
func TestMagnitudeLimit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 1, 2, 1, 16, 4
	cfg.Policy.PageSize, cfg.Policy.DenseLayers, cfg.CapacityPages, cfg.MemoryLimit = 4, 0, 16, memlimit.NoLimit
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	lim := MagnitudeLimit(cfg.HeadDim)
	if s := float64(lim) * float64(lim) * float64(cfg.HeadDim); s > math.MaxFloat32/2*1.0001 {
		t.Fatalf("limit %g: d * lim^2 = %g exceeds MaxFloat32/2", lim, s)
	}
	id, _ := e.Create(plan.Striped)
	d := cfg.HeadDim
	full := func(x float32, n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = x
		}
		return v
	}
	if err := e.Append(id, 0, full(lim*1.01, 4*d), full(1, 4*d)); !errors.Is(err, ErrBadInput) {
		t.Fatalf("key over the limit: %v", err)
	}
	if n, _ := e.Len(id); n != 0 {
		t.Fatalf("length %d after a refused append", n)
	}
	if err := e.Append(id, 0, full(lim, 4*d), full(1, 4*d)); err != nil {
		t.Fatal(err)
	}
	var res Result
	err = e.Step(context.Background(), 0, []Request{{Seq: id, Q: full(-lim*1.01, 2*d), K: full(0, d), V: full(0, d)}}, StepOptions{}, &res)
	if !errors.Is(err, ErrBadInput) {
		t.Fatalf("query over the limit: %v", err)
	}
	if n, _ := e.Len(id); n != 4 {
		t.Fatalf("length %d after a refused step, want 4", n)
	}
	// Every element at the limit: scores d*lim^2, finite outputs.
	if err := e.Step(context.Background(), 0, []Request{{Seq: id, Q: full(lim, 2*d)}}, StepOptions{}, &res); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	for _, x := range append(res.O, res.LSE...) {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf("non-finite output at the limit: %v %v", res.O, res.LSE)
		}
	}
}
