package node_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/api/wire"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/replay"
	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A replay case through a 3-node cluster whose defaults are another
// geometry (the sequence created with the case's own config) gives the
// in-process result JSON byte for byte (selection, output, scores, recall and mass recall
// computed by the coordinator from keys read back from the nodes), for
// every selection mode and GQA mode, CP 2 and CP 3 x TP 2.
func TestReplayThroughCluster(t *testing.T) {
	for _, tc := range []struct {
		cp, tp int
		mode   plan.SelectMode
		gqa    string
	}{{2, 1, plan.Exact, "group_max"}, {3, 2, plan.Union, "per_head"}, {2, 2, plan.Replicated, "group_max"}} {
		t.Run(fmt.Sprintf("cp%d_tp%d_%v_%s", tc.cp, tc.tp, tc.mode, tc.gqa), func(t *testing.T) {
			c := replay.Generate(replay.GenConfig{Tokens: 300, PageSize: 8, BudgetTokens: 48, QHeads: 8, KVHeads: 4,
				HeadDim: 16, GQA: tc.gqa, SinkPages: 1, LocalPages: 1, Seed: uint64(tc.cp*10 + tc.tp)})
			// The cluster's own defaults are another geometry, grid and
			// policy: the sequence brings the case's.
			nodes := nodetest.Start(t, "r", 3, geometry(1, 1, plan.Exact), nil)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			cl, err := client.Dial(ctx, nodes[1].Addr(), client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			opt := replay.Options{Selector: plan.Quest, CP: tc.cp, TP: tc.tp, Selection: tc.mode, Placement: plan.Striped}
			got, err := replay.RunCluster(ctx, c, opt, cl)
			if err != nil {
				t.Fatal(err)
			}
			opt.MemoryLimit = memlimit.NoLimit
			want, err := replay.Run(ctx, c, opt)
			if err != nil {
				t.Fatal(err)
			}
			var a, b bytes.Buffer
			if err := got.Encode(&a); err != nil {
				t.Fatal(err)
			}
			if err := want.Encode(&b); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a.Bytes(), b.Bytes()) {
				t.Fatalf("cluster result differs from in process:\n%.600s\n---\n%.600s", a.String(), b.String())
			}
			if got.Recall <= 0 || got.MassRecall <= 0 {
				t.Fatalf("recall %g, mass recall %g", got.Recall, got.MassRecall)
			}
		})
	}
}

// A sequence's own config is validated at create (INVALID_ARGUMENT naming
// what is wrong, nothing created), and sequences of two configs decode
// side by side on one cluster, each with its own tensor shapes.
func TestCreateWithConfig(t *testing.T) {
	nodes := nodetest.Start(t, "c", 2, geometry(2, 1, plan.Exact), nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, nodes[0].Addr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	own := worker.Config{Layers: 1, Geometry: plan.Geometry{QHeads: 6, KVHeads: 3, HeadDim: 8, PageSize: 4}, CP: 2, TP: 1,
		Capacity: 32, Policy: plan.Policy{BudgetTokens: 8, LocalPages: 1}}
	bad := own
	bad.TP = 2 // 3 KV heads do not split over 2
	if _, _, err := cl.CreateWith(ctx, plan.Striped, remote.GridConfigProto(bad)); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "tp 2") {
		t.Fatalf("bad config: %v", err)
	}
	st, _ := cl.Status(ctx)
	if st.GetSequences() != 0 {
		t.Fatalf("%d sequences after a refused create", st.GetSequences())
	}
	a, _, err := cl.CreateWith(ctx, plan.Striped, remote.GridConfigProto(own))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := cl.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 9))
	def := geometry(2, 1, plan.Exact)
	for _, s := range []struct {
		id     string
		kv, q  int
		layers int
	}{{a, 3 * 8, 6 * 8, 1}, {b, def.KVHeads * def.HeadDim, def.QHeads * def.HeadDim, def.Layers}} {
		for l := range s.layers {
			if err := cl.Append(ctx, s.id, l, randVec(rng, 20*s.kv), randVec(rng, 20*s.kv)); err != nil {
				t.Fatal(err)
			}
		}
		res, err := cl.Step(ctx, 0, []client.Item{{Seq: s.id, Q: randVec(rng, s.q)}}, client.StepOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.O) != s.q {
			t.Fatalf("%s: output of %d floats, want %d", s.id, len(res.O), s.q)
		}
	}
	// A step mixing the two geometries is refused.
	_, err = cl.API().Step(ctx, &decodev1.StepRequest{Items: []*decodev1.StepItem{
		{Sequence: a, Q: wire.Float32Tensor(randVec(rng, 48), 6, 8)},
		{Sequence: b, Q: wire.Float32Tensor(randVec(rng, def.QHeads*def.HeadDim), def.QHeads, def.HeadDim)}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("mixed geometries: %v", err)
	}
}
