package node_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// Steps of one layer (decode.Batch.Layers 1) through the client's
// Stepper give the in-process engine's outputs and plans, with and
// without a new token and with diagnostics; the step ends cleanly after
// its layer, so a whole-model step follows on the same client; a
// Layers past the model is refused with nothing changed.
func TestClientOneLayerSteps(t *testing.T) {
	g := model.Geometry{Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 8}
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 4, 8, 1
	ec := engine.ModelConfig(g, pol, 64)
	ec.CP, ec.StepTimeout = 2, 5*time.Second
	e, err := engine.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	lid, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	nodes := nodetest.Start(t, "o", 2, geometry(1, 1, plan.Exact), nil)
	ctx := t.Context()
	cl := dial(t, nodes[0])
	id, _, err := cl.CreateWith(ctx, plan.Striped, remote.GridConfigProto(ec.WorkerConfig()))
	if err != nil {
		t.Fatal(err)
	}
	cs := client.Sequence{C: cl, ID: id}
	rng := rand.New(rand.NewPCG(7, 7))
	qd, kvd := g.Heads*g.HeadDim, g.KVHeads*g.HeadDim
	for l := range g.Layers {
		k, v := randVec(rng, 30*kvd), randVec(rng, 30*kvd)
		if err := e.Append(lid, l, k, v); err != nil {
			t.Fatal(err)
		}
		if err := cs.Append(ctx, l, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: cs.SeqID()}}, FirstLayer: 2, Layers: 2}); !errors.Is(err, decode.ErrBadInput) {
		t.Fatalf("layers 2..3 of a 3-layer model: %v, want ErrBadInput", err)
	}
	one := func(s decode.Stepper, seq decode.SeqID, layer int, q, k, v []float32, opt decode.Options) decode.Result {
		t.Helper()
		st, err := s.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: seq, New: k != nil}}, FirstLayer: layer, Layers: 1, Options: opt})
		if err != nil {
			t.Fatal(err)
		}
		var res decode.Result
		if err := st.Layer(ctx, layer, decode.Host(q), decode.Host(k), decode.Host(v), &res); err != nil {
			t.Fatal(err)
		}
		if err := st.Layer(ctx, layer+1, decode.Host(q), decode.Host(k), decode.Host(v), &res); layer+1 < g.Layers && !errors.Is(err, decode.ErrBadInput) {
			t.Fatalf("a second layer in a step of one: %v, want ErrBadInput", err)
		}
		if err := st.End(ctx); err != nil {
			t.Fatal(err)
		}
		return res
	}
	same := func(what string, a, b decode.Result) {
		t.Helper()
		if len(a.O.Data) != qd || len(b.O.Data) != qd || a.Plans[0] != b.Plans[0] {
			t.Fatalf("%s: %d and %d outputs, plans %+v in process, %+v through the cluster", what, len(a.O.Data), len(b.O.Data), a.Plans[0], b.Plans[0])
		}
		for i := range a.O.Data {
			if a.O.Data[i] != b.O.Data[i] {
				t.Fatalf("%s: out[%d] %g in process, %g through the cluster", what, i, a.O.Data[i], b.O.Data[i])
			}
		}
	}
	for l := range g.Layers {
		q, k, v := randVec(rng, qd), randVec(rng, kvd), randVec(rng, kvd)
		// A sparse step with a new token at layer l alone.
		same("new token", one(e, lid, l, q, k, v, decode.Options{}), one(cl, cs.SeqID(), l, q, k, v, decode.Options{}))
		// A dense reference of the query alone.
		same("dense", one(e, lid, l, q, nil, nil, decode.Options{ForceDense: true}), one(cl, cs.SeqID(), l, q, nil, nil, decode.Options{ForceDense: true}))
	}
	// With diagnostics (the engine's own one-layer Step for reference).
	q := randVec(rng, qd)
	var ref engine.Result
	if err := e.Step(ctx, 1, []engine.Request{{Seq: lid, Q: q}}, engine.StepOptions{Diagnostics: true}, &ref); err != nil {
		t.Fatal(err)
	}
	got := one(cl, cs.SeqID(), 1, q, nil, nil, decode.Options{Diagnostics: true})
	if len(got.Diag) != 1 || got.Diag[0].Recall != ref.Diag[0].Recall || got.Diag[0].PagesRead != ref.Diag[0].PagesRead ||
		got.Diag[0].PagesTotal != ref.Diag[0].PagesTotal || got.Diag[0].MassRecall != ref.Diag[0].MassRecall {
		t.Fatalf("diagnostics through the cluster %+v, in process %+v", got.Diag, ref.Diag)
	}
	// A whole-model step on the same client after the one-layer ones:
	// every layer has 30 + 1 tokens now, and the step adds one.
	st, err := cl.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: cs.SeqID(), New: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var res decode.Result
	for l := range g.Layers {
		if err := st.Layer(ctx, l, decode.Host(randVec(rng, qd)), decode.Host(randVec(rng, kvd)), decode.Host(randVec(rng, kvd)), &res); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := cl.Len(ctx, id); err != nil || n != 32 {
		t.Fatalf("length %d (%v) through the cluster, want 32", n, err)
	}
}
