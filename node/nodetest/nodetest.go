// Package nodetest starts clusters of questrt nodes in one test process:
// real memberlist over UDP and TCP and real gRPC on 127.0.0.1, free ports,
// fast failure detection. For tests and benchmarks only.
package nodetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/plan"
)

// Geometry is the small model of the cluster tests: 2 layers, 8 query
// and 4 KV heads of 16, pages of 4 tokens, 128 pages per rank, a budget
// of 24 tokens with layer 0 dense, a 2 s step deadline, no memory check;
// the cp x tp grid and the selection mode as given.
func Geometry(cp, tp int, mode plan.SelectMode) engine.Config {
	ec := engine.DefaultConfig()
	ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = 2, 8, 4, 16, 4
	ec.CP, ec.TP, ec.CapacityPages, ec.Selection = cp, tp, 128, mode
	ec.Policy.PageSize, ec.Policy.BudgetTokens, ec.Policy.DenseLayers = 4, 24, 1
	ec.StepTimeout = 2 * time.Second
	ec.MemoryLimit = memlimit.NoLimit
	return ec
}

// Member is a member config called name on 127.0.0.1, port 0, with fast
// failure detection (a killed node declared dead in about a second and a
// quarter: a probe every 150 ms, 100 ms to answer, suspicion for 900 ms
// with two or three nodes) and immediate reclaim of a dead node's name.
// The probe timeout and suspicion are no shorter: with 50 ms and 200 ms,
// test processes starved on a loaded 2-core machine were declared dead
// while alive (CI: "node n1 is gone from the view"), and with 450 ms of
// suspicion still, under -race on that machine ("grid lost a node: node
// c1 is gone from the view" in the coord, client and serve tests).
func Member(name string) cluster.MemberConfig {
	mc := cluster.DefaultMemberConfig()
	mc.Name = name
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	mc.ProbeInterval, mc.ProbeTimeout, mc.SuspicionMult = 150*time.Millisecond, 100*time.Millisecond, 6
	mc.GossipInterval, mc.PushPullInterval, mc.TCPTimeout = 50*time.Millisecond, 2*time.Second, 2*time.Second
	mc.JoinRetryInterval, mc.DeadNodeReclaimTime = 100*time.Millisecond, time.Millisecond
	return mc
}

// Start starts n nodes called prefix0.. (node 0 first, the others joining
// it), plaintext unless tune sets TLS, waits until every node sees n
// members up (10 s at most), and stops them when the test ends. tune, when
// set, adjusts node i's config before it starts.
func Start(tb testing.TB, prefix string, n int, ec engine.Config, tune func(i int, c *node.Config)) []*node.Node {
	tb.Helper()
	var nodes []*node.Node
	tb.Cleanup(func() {
		for _, nd := range nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			nd.Stop(ctx)
			cancel()
		}
	})
	for i := range n {
		mc := Member(fmt.Sprintf("%s%d", prefix, i))
		if i > 0 {
			mc.Join = []string{nodes[0].GossipAddr()}
		}
		cfg := node.Config{GRPCAddr: "127.0.0.1:0", Member: mc, Engine: ec, Plaintext: true,
			MemoryLimit: memlimit.NoLimit, DrainTimeout: time.Second, MetaInterval: 100 * time.Millisecond, Version: "test"}
		if tune != nil {
			tune(i, &cfg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nd, err := node.Start(ctx, cfg)
		cancel()
		if err != nil {
			tb.Fatal(err)
		}
		nodes = append(nodes, nd)
	}
	WaitUp(tb, nodes, n)
	return nodes
}

// WaitUp waits (10 s at most) until every node's view has want members
// up.
func WaitUp(tb testing.TB, nodes []*node.Node, want int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, nd := range nodes {
		for len(nd.Membership().View().Up()) != want {
			if time.Now().After(deadline) {
				tb.Fatalf("%s sees %d members up, want %d", nd.Name(), len(nd.Membership().View().Up()), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
