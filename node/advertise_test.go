package node_test

import (
	"math/rand/v2"
	"net"
	"testing"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/internal/faultproxy"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// Config.GRPCAdvertise: node n1 listens on one port and advertises a
// proxy in front of it; n1's Addr and its meta in n0's view are the
// proxy's address, and the worker calls of a sequence coordinated by n0
// with a rank on n1 go through the proxy.
func TestGRPCAdvertise(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := l.Addr().String()
	l.Close()
	px, err := faultproxy.Listen(t.Context(), "127.0.0.1:0", faultproxy.Config{Target: listen})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	adv := px.Addr().String()
	ec := geometry(2, 1, plan.Exact)
	nodes := nodetest.Start(t, "a", 2, ec, func(i int, c *node.Config) {
		if i == 1 {
			c.GRPCAddr, c.GRPCAdvertise = listen, adv
		}
	})
	if nodes[1].Addr() != adv {
		t.Errorf("n1's Addr %q, want the advertised %q", nodes[1].Addr(), adv)
	}
	if m, ok := nodes[0].Membership().View().Member("a1"); !ok || m.Meta.GRPCAddr != adv {
		t.Fatalf("a1 in a0's view: %+v (found %v), want gRPC address %s", m, ok, adv)
	}
	c := dial(t, nodes[0])
	id, on, err := c.Create(t.Context(), plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	if len(on) != 2 || on[1] != "a1" {
		t.Fatalf("placed on %v", on)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	kv := ec.KVHeads * ec.HeadDim
	for l := range ec.Layers {
		if err := c.Append(t.Context(), id, l, randVec(rng, 40*kv), randVec(rng, 40*kv)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Step(t.Context(), 1, []client.Item{{Seq: id, Q: randVec(rng, ec.QHeads*ec.HeadDim)}}, client.StepOptions{}); err != nil {
		t.Fatal(err)
	}
	if st := px.Stats(); st.Accepted == 0 || st.Bytes == 0 {
		t.Errorf("proxy stats %+v: a0's calls to a1 did not go through a1's advertised address", st)
	}
}
