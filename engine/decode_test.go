package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Begin, Layer over every layer and End (one BeginStep per step) give,
// layer by layer, the outputs of Step on an identical engine, with queries that depend on
// the previous layer's output as a model's do; lengths grow by one in
// every layer.
func TestBeginLayerEqualsStepPerLayer(t *testing.T) {
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
			// The plan-once path: Begin, one Layer per layer, End, with
			// the caller's loop computing each layer's queries.
			got := make([][]float32, cfg.Layers)
			bt := decode.Batch{Rows: make([]decode.Row, len(reqs))}
			for i, r := range reqs {
				bt.Rows[i] = decode.Row{Seq: r.Seq, New: true}
			}
			st, err := a.Begin(context.Background(), bt)
			if err != nil {
				t.Fatalf("%v step %d: begin: %v", mode, step, err)
			}
			for l := range cfg.Layers {
				var q, k, v []float32
				for _, r := range reqs {
					q, k, v = append(q, r.Q...), append(k, r.K...), append(v, r.V...)
				}
				var dr decode.Result
				if err := st.Layer(context.Background(), l, decode.Host(q), decode.Host(k), decode.Host(v), &dr); err != nil {
					t.Fatalf("%v step %d layer %d: %v", mode, step, l, err)
				}
				o, err := dr.O.HostData("o")
				if err != nil {
					t.Fatal(err)
				}
				got[l] = append([]float32(nil), o...)
				for i := range reqs {
					reqs[i].Q, reqs[i].K, reqs[i].V = derive(o, i, l)
				}
			}
			if err := st.End(context.Background()); err != nil {
				t.Fatalf("%v step %d: end: %v", mode, step, err)
			}
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
