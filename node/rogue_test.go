package node_test

import (
	"context"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/testcert"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// TestRogueJoinersNeverPlaced: two honest nodes with mutual TLS and node
// certificates of their names; three processes join their gossip (no
// gossip key here: the e2e tests cover the key) that must never be given
// a rank: one serving gRPC with a client certificate of the cluster CA,
// one with the node certificate of another name, one in plaintext. Every
// honest node's Status lists each of them refused, with the reason; a
// CP 3 grid (more ranks than honest nodes, which rendezvous placement
// would spread over distinct members) is placed on the two honest nodes
// only, from either coordinator, and decodes as the in-process engine
// does.
func TestRogueJoinersNeverPlaced(t *testing.T) {
	ca := testcert.NewCA(t, "questrt test CA")
	ec := geometry(3, 1, plan.Exact)
	// Five nodes on a small machine (under -race too): failure
	// detection slower than nodetest's, so that no honest node is
	// suspected by mistake while the test decodes.
	calm := func(c *node.Config) {
		c.Member.ProbeInterval, c.Member.ProbeTimeout, c.Member.SuspicionMult = 500*time.Millisecond, 250*time.Millisecond, 4
	}
	nodes := nodetest.Start(t, "n", 2, ec, func(i int, c *node.Config) {
		c.Plaintext, c.TLS = false, ca.MutualTLS(ca.IssueNode(t, c.Member.Name))
		calm(c)
	})
	rogues := map[string]struct {
		tune func(c *node.Config)
		why  string
	}{
		// Start refuses these two certificates (TestStartRefusesForeignCert);
		// an attacker is not bound by it, so the rogues skip the check.
		"client": {func(c *node.Config) {
			c.Plaintext, c.TLS = false, ca.MutualTLS(ca.IssueClient(t, "client"))
			node.AllowForeignCert(c)
		}, "client certificate"},
		"impostr": {func(c *node.Config) {
			c.Plaintext, c.TLS = false, ca.MutualTLS(ca.IssueNode(t, "n1"))
			node.AllowForeignCert(c)
		}, `certificate is node "n1"'s, not "impostr"'s`},
		"plain": {func(c *node.Config) {}, "serves gRPC in plaintext"},
	}
	for name, r := range rogues {
		mc := nodetest.Member(name)
		mc.Join = []string{nodes[0].GossipAddr()}
		cfg := node.Config{GRPCAddr: "127.0.0.1:0", Member: mc, Engine: ec, Plaintext: true,
			MemoryLimit: memlimit.NoLimit, DrainTimeout: time.Second, MetaInterval: 100 * time.Millisecond, Version: "rogue"}
		r.tune(&cfg)
		calm(&cfg)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		rn, err := node.Start(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatalf("rogue %s: %v", name, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rn.Stop(ctx)
			cancel()
		})
	}
	nodetest.WaitUp(t, nodes, 5)

	creds := credentials.NewTLS(ca.MutualTLS(ca.IssueClient(t, "client")))
	clients := make([]*client.Client, len(nodes))
	for i, nd := range nodes {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		c, err := client.Dial(ctx, nd.Addr(), client.Options{Creds: creds})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}

	// Status: every rogue refused, with its reason; the honest ones not.
	deadline := time.Now().Add(10 * time.Second)
	for i, c := range clients {
		waitRefused(t, c, fmt.Sprintf("n%d", i), deadline, func(name string) string { return rogues[name].why })
	}

	ref, err := engine.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	rng := mrand.New(mrand.NewPCG(28, 2))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	ctx := t.Context()
	for i, c := range clients {
		id, on, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatalf("create through n%d: %v", i, err)
		}
		for _, n := range on {
			if n != "n0" && n != "n1" {
				t.Fatalf("create through n%d: ranks on %v, a rogue among them", i, on)
			}
		}
		rid, err := ref.Create(plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		n := 40 + rng.IntN(40)
		for l := range ec.Layers {
			k, v := randVec(rng, n*kv), randVec(rng, n*kv)
			if err := c.Append(ctx, id, l, k, v); err != nil {
				t.Fatal(err)
			}
			if err := ref.Append(rid, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
		for step := range 2 {
			for l := range ec.Layers {
				q, k, v := randVec(rng, qd), randVec(rng, kv), randVec(rng, kv)
				got, err := c.Step(ctx, l, []client.Item{{Seq: id, Q: q, K: k, V: v}}, client.StepOptions{})
				if err != nil {
					t.Fatalf("step %d layer %d: %v", step, l, err)
				}
				var want engine.Result
				if err := ref.Step(ctx, l, []engine.Request{{Seq: rid, Q: q, K: k, V: v}}, engine.StepOptions{}, &want); err != nil {
					t.Fatal(err)
				}
				for j := range want.O {
					if d := math.Abs(float64(got.O[j] - want.O[j])); d > 1e-5*(1+math.Abs(float64(want.O[j]))) {
						t.Fatalf("step %d layer %d: o[%d] = %g, in process %g", step, l, j, got.O[j], want.O[j])
					}
				}
			}
		}
		if err := c.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// waitRefused polls c's Status until its members' refusals are as why
// says (checkRefused), failing the test at deadline; name is c's node.
func waitRefused(t *testing.T, c *client.Client, name string, deadline time.Time, why func(name string) string) {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		st, err := c.Status(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		bad := checkRefused(st.GetMembers(), why)
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's Status: %s", name, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkRefused says what is wrong with the members' refusals: each
// member for which why returns a reason must be refused with it, the
// others not refused; "" when all is as expected.
func checkRefused(members []*decodev1.Member, why func(name string) string) string {
	var bad []string
	for _, m := range members {
		want := why(m.GetName())
		switch {
		case want == "" && m.GetRefused() != "":
			bad = append(bad, m.GetName()+" refused: "+m.GetRefused())
		case want != "" && !strings.Contains(m.GetRefused(), want):
			bad = append(bad, m.GetName()+" refused "+`"`+m.GetRefused()+`", want "`+want+`"`)
		}
	}
	return strings.Join(bad, "; ")
}

// TestTLSJoinerRefusedByPlaintextNodes: a node that serves gRPC over TLS
// joins the gossip layer of a plaintext cluster (same label, no gossip
// key). Each plaintext node lists it refused in Status, with the reason,
// from its metadata alone, and a CP 3 grid created through either
// plaintext node is placed on the two of them only.
func TestTLSJoinerRefusedByPlaintextNodes(t *testing.T) {
	ca := testcert.NewCA(t, "questrt test CA")
	ec := geometry(3, 1, plan.Exact)
	calm := func(c *node.Config) {
		c.Member.ProbeInterval, c.Member.ProbeTimeout, c.Member.SuspicionMult = 500*time.Millisecond, 250*time.Millisecond, 4
	}
	nodes := nodetest.Start(t, "n", 2, ec, func(i int, c *node.Config) { calm(c) })
	mc := nodetest.Member("tls")
	mc.Join = []string{nodes[0].GossipAddr()}
	cfg := node.Config{GRPCAddr: "127.0.0.1:0", Member: mc, Engine: ec, TLS: ca.MutualTLS(ca.IssueNode(t, "tls")),
		MemoryLimit: memlimit.NoLimit, DrainTimeout: time.Second, MetaInterval: 100 * time.Millisecond, Version: "tls"}
	calm(&cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	tn, err := node.Start(ctx, cfg)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		tn.Stop(ctx)
		cancel()
	})
	nodetest.WaitUp(t, nodes, 3)

	why := func(name string) string {
		if name == "tls" {
			return "serves gRPC over TLS"
		}
		return ""
	}
	deadline := time.Now().Add(10 * time.Second)
	for i, nd := range nodes {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		c, err := client.Dial(ctx, nd.Addr(), client.Options{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		waitRefused(t, c, fmt.Sprintf("n%d", i), deadline, why)
		id, on, err := c.Create(t.Context(), plan.Striped)
		if err != nil {
			t.Fatalf("create through n%d: %v", i, err)
		}
		for _, n := range on {
			if n != "n0" && n != "n1" {
				t.Fatalf("create through n%d: ranks on %v, the TLS node among them", i, on)
			}
		}
		if err := c.Release(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
}
