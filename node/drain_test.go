package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// TestStopEndsKeptStreams: the streams kept between decode steps do not
// hold a node's graceful stop until its drain timeout. Node 1 (rank 1 of
// the CP 2 grid, relaying a client's Steps stream to node 0) holds node
// 0's Calls stream and the relayed stream; node 0 holds the clients'
// Steps streams. Each stops within seconds, and a step after node 1
// stopped fails at once.
func TestStopEndsKeptStreams(t *testing.T) {
	const drain = 30 * time.Second
	ec := geometry(2, 1, plan.Exact)
	ec.Layers = 2
	nodes := nodetest.Start(t, "d", 2, ec, func(_ int, c *node.Config) { c.DrainTimeout = drain })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	owner, relay := dial(t, nodes[0]), dial(t, nodes[1])
	id, _, err := owner.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	kv := make([]float32, 20*ec.KVHeads*ec.HeadDim)
	for l := range ec.Layers {
		if err := owner.Append(ctx, id, l, kv, kv); err != nil {
			t.Fatal(err)
		}
	}
	q := make([]float32, ec.QHeads*ec.HeadDim)
	step := func(c *client.Client) error {
		st, err := c.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: c.Handle(id)}}})
		if err != nil {
			return err
		}
		defer st.End(ctx)
		var res decode.Result
		for l := range ec.Layers {
			if err := st.Layer(ctx, l, decode.Host(q), decode.Host(nil), decode.Host(nil), &res); err != nil {
				return err
			}
		}
		return nil
	}
	for _, c := range []*client.Client{owner, relay, owner, relay} {
		if err := step(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{1, 0} {
		start := time.Now()
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := nodes[i].Stop(sctx)
		scancel()
		if took := time.Since(start); took > drain/3 {
			t.Errorf("node %d took %v to stop (drain timeout %v): a kept stream held it", i, took, drain)
		}
		if err != nil {
			t.Logf("node %d stop: %v", i, err)
		}
		if i == 1 {
			// Node 0's next step meets node 1 gone: it fails, at once.
			start := time.Now()
			if err := step(owner); err == nil {
				t.Errorf("a step with node 1 stopped: no error")
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("a step with node 1 stopped took %v to fail", took)
			}
		}
	}
}
