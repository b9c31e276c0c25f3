package node_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/questrt/questrt/cluster/client"
	"github.com/questrt/questrt/cluster/node/nodetest"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/replay"
)

// A replay case through a 3-node cluster gives the in-process result
// JSON byte for byte (selection, output, scores, recall and mass recall
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
			ec := engine.DefaultConfig()
			ec.Layers, ec.Geometry = 1, c.PlanGeometry()
			ec.CP, ec.TP, ec.Selection, ec.CapacityPages = tc.cp, tc.tp, tc.mode, 64
			ec.Policy = c.Policy(plan.Quest)
			ec.StepTimeout, ec.MemoryLimit = 5*time.Second, memlimit.NoLimit
			nodes := nodetest.Start(t, "r", 3, ec, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			cl, err := client.Dial(ctx, nodes[1].Addr(), client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			got, err := replay.RunCluster(ctx, c, plan.Quest, plan.Striped, cl)
			if err != nil {
				t.Fatal(err)
			}
			want, err := replay.Run(ctx, c, replay.Options{Selector: plan.Quest, CP: tc.cp, TP: tc.tp, Selection: tc.mode,
				Placement: plan.Striped, MemoryLimit: memlimit.NoLimit})
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
