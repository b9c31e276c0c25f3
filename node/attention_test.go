package node_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// The model's attention over a cluster sequence (model.NewAttentionOf
// over client.Sequence: one-layer steps through the client's Stepper) gives
// the outputs of the same attention over an in-process engine: a dense
// prefill, decode steps with diagnostics, a fork.
func TestModelAttentionThroughCluster(t *testing.T) {
	g := model.Geometry{Layers: 2, Heads: 8, KVHeads: 4, HeadDim: 16}
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 4, 16, 1
	ec := engine.ModelConfig(g, pol, 64)
	ec.CP, ec.StepTimeout = 2, 5*time.Second
	e, err := engine.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	local, err := model.NewEngineAttention(e, g)
	if err != nil {
		t.Fatal(err)
	}
	nodes := nodetest.Start(t, "m", 2, geometry(1, 1, plan.Exact), nil)
	ctx := t.Context()
	cl := dial(t, nodes[0])
	id, _, err := cl.CreateWith(ctx, plan.Striped, remote.GridConfigProto(ec.WorkerConfig()))
	if err != nil {
		t.Fatal(err)
	}
	viaCluster := model.NewAttentionOf(client.Sequence{C: cl, ID: id}, g)
	rng := rand.New(rand.NewPCG(4, 4))
	qd, kvd := g.Heads*g.HeadDim, g.KVHeads*g.HeadDim
	run := func(n int, decode bool, attns ...*model.EngineAttention) {
		t.Helper()
		for l := range g.Layers {
			q, k, v := randVec(rng, n*qd), randVec(rng, n*kvd), randVec(rng, n*kvd)
			var outs [][]float32
			for _, a := range attns {
				out := make([]float32, n*qd)
				var err error
				if decode {
					err = a.Decode(ctx, l, q, k, v, out)
				} else {
					err = a.Prefill(ctx, l, q, k, v, out)
				}
				if err != nil {
					t.Fatal(err)
				}
				outs = append(outs, out)
			}
			for i := range outs[0] {
				if outs[0][i] != outs[1][i] {
					t.Fatalf("layer %d: out[%d] %g in process, %g through the cluster", l, i, outs[0][i], outs[1][i])
				}
			}
		}
	}
	run(40, false, local, viaCluster)
	local.Options.Diagnostics, viaCluster.Options.Diagnostics = true, true
	for range 3 {
		run(1, true, local, viaCluster)
		for l, st := range local.Steps() {
			rt := viaCluster.Steps()[l]
			if !st.Diag || !rt.Diag {
				t.Fatalf("layer %d: no diagnostics (in process %v, cluster %v)", l, st.Diag, rt.Diag)
			}
			// Every field but the times, bit for bit (the page slack
			// came through the cluster as NaN before).
			st.Time, rt.Time = engine.Times{}, engine.Times{}
			if l >= pol.DenseLayers && (math.IsNaN(st.SlackMax) || st.SlackMax < 0) {
				t.Fatalf("layer %d: slack max %v in process: want a measured bound gap", l, st.SlackMax)
			}
			if a, b := fmt.Sprintf("%#v", st), fmt.Sprintf("%#v", rt); a != b {
				t.Fatalf("layer %d: step\n%s in process,\n%s through the cluster", l, a, b)
			}
		}
	}
	lf, err := local.Fork()
	if err != nil {
		t.Fatal(err)
	}
	rf, err := viaCluster.Fork()
	if err != nil {
		t.Fatal(err)
	}
	run(1, true, lf, rf)
	if local.Len() != 43 || viaCluster.Len() != 43 || rf.Len() != 44 {
		t.Fatalf("lengths %d, %d, fork %d", local.Len(), viaCluster.Len(), rf.Len())
	}
}
