package remote

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// TestEquivalence runs one random workload (appends to every layer in
// chunks, decode steps with and without new tokens, a fork, a rollback
// that cuts a page, a diagnostics step, a release) on an in-process
// engine and on an engine over three nodes' Servers, for CP 1-4, TP 1-2
// and every selection mode, ranks spread over the nodes; outputs, LSEs,
// plans and diagnostics must agree within 1e-5 relative.
func TestEquivalence(t *testing.T) {
	nodes := startNodes(t, 3, DefaultServerConfig())
	cases := []struct {
		cp, tp int
		mode   plan.SelectMode
		gqa    plan.GQAMode
	}{
		{1, 1, plan.Exact, plan.GroupMax},
		{2, 1, plan.Union, plan.GroupMax},
		{2, 2, plan.Exact, plan.PerHead},
		{3, 1, plan.Replicated, plan.GroupMax},
		{4, 2, plan.Union, plan.PerHead},
		{2, 2, plan.Replicated, plan.GroupMax},
		{4, 1, plan.Exact, plan.GroupMax},
	}
	for ci, tc := range cases {
		name := fmt.Sprintf("cp%d_tp%d_%v_%v", tc.cp, tc.tp, tc.mode, tc.gqa)
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			c := engineConfig(tc.cp, tc.tp, tc.mode)
			c.Policy.GQA = tc.gqa
			ref, err := engine.New(c)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			rem, _ := openRemote(t, c, spread(c, conns(nodes), ci), "eq-"+name)
			w := &twin{t: t, c: c, ref: ref, rem: rem, rng: rand.New(rand.NewPCG(uint64(ci), 7)), identical: true}

			a := w.create(plan.Striped)
			b := w.create(plan.Contiguous)
			w.fill(a, 150+w.rng.IntN(150))
			w.fill(b, 150+w.rng.IntN(150))
			for range 4 {
				w.decode([]engine.SeqID{a, b}, true, engine.StepOptions{})
			}
			w.decode([]engine.SeqID{b, a}, false, engine.StepOptions{})
			ch := w.fork(a)
			for range 2 {
				w.decode([]engine.SeqID{a, ch}, true, engine.StepOptions{})
			}
			w.rollback(b, 5) // cuts a page: its owner rescans, mirrors follow
			w.decode([]engine.SeqID{b}, true, engine.StepOptions{})
			w.decode([]engine.SeqID{b, ch}, false, engine.StepOptions{Phased: true})
			w.decode([]engine.SeqID{a, b, ch}, true, engine.StepOptions{Diagnostics: true})
			w.sameLen(a, b, ch)
			w.release(ch)
			w.decode([]engine.SeqID{a}, true, engine.StepOptions{})
			w.sameLen(a, b)
			t.Logf("%d values compared, bit-identical %v (largest relative difference %.3g), %v",
				w.compared, w.identical, w.maxRel, time.Since(start).Round(time.Millisecond))
		})
	}
	for i, n := range nodes {
		if g := n.srv.Grids(); g != 0 {
			t.Errorf("node %d holds %d grids after every subtest closed its own", i, g)
		}
	}
}
