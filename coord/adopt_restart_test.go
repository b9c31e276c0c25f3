package coord_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

func restartNode(t *testing.T, name, join, dir string, ec node.Config) *node.Node {
	t.Helper()
	mc := nodetest.Member(name)
	mc.Join = []string{join}
	cfg := node.Config{GRPCAddr: "127.0.0.1:0", Member: mc, Engine: ec.Engine, Plaintext: true,
		MemoryLimit: memlimit.NoLimit, DrainTimeout: time.Second, MetaInterval: 100 * time.Millisecond, Version: "test", DataDir: dir}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nd, err := node.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		nd.Stop(ctx)
		cancel()
	})
	return nd
}

// TestReleasedOnLostGridNotAdopted: a worker node restarts while the
// coordinator stays up; the client releases its sequence (forgotten on
// the lost grid); the next Create opens a new grid that adopts the
// released sequence again under the id the client released.
func TestReleasedOnLostGridNotAdopted(t *testing.T) {
	ec := geometry(2, 1)
	dirs := []string{t.TempDir(), t.TempDir()}
	nodes := nodetest.Start(t, "n", 2, ec, func(i int, c *node.Config) { c.DataDir = dirs[i] })
	c := dial(t, nodes[0])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	kv := ec.KVHeads * ec.HeadDim
	a, _, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	for l := range ec.Layers {
		if err := c.Append(ctx, a, l, randVec(rng, 20*kv), randVec(rng, 20*kv)); err != nil {
			t.Fatal(err)
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	nodes[1].Stop(sctx)
	scancel()
	n1 := restartNode(t, "n1", nodes[0].GossipAddr(), dirs[1], node.Config{Engine: ec})
	nodetest.WaitUp(t, []*node.Node{nodes[0], n1}, 2)
	time.Sleep(300 * time.Millisecond)
	if err := c.Release(ctx, a); err != nil {
		t.Logf("release %s: %v", a, err)
	}
	b, _, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	recs, dmg, err := c.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("released %s, created %s; recovered %+v damaged %+v", a, b, recs, dmg)
	if err := c.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
	for _, nd := range []*node.Node{nodes[0], n1} {
		if st := nd.Stats(); st.PagesDevice != 0 {
			t.Errorf("%s: %d pages in use after the client released every sequence it knows", nd.Name(), st.PagesDevice)
		}
	}
	if len(recs) > 0 {
		t.Errorf("sequence %s, released by the client, came back adopted as %s", a, recs[0].ID)
	}
}

// TestConcurrentFirstCreatesAdoptOnce: after both nodes restart on their
// data directories, the first Creates arrive together (as a server's
// first requests do); the grids they open race for the nodes' grid
// directories.
func TestConcurrentFirstCreatesAdoptOnce(t *testing.T) {
	ec := geometry(2, 1)
	dirs := []string{t.TempDir(), t.TempDir()}
	persist := func(i int, c *node.Config) { c.DataDir = dirs[i] }
	nodes := nodetest.Start(t, "n", 2, ec, persist)
	c := dial(t, nodes[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	kv := ec.KVHeads * ec.HeadDim
	a, _, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	for l := range ec.Layers {
		if err := c.Append(ctx, a, l, randVec(rng, 20*kv), randVec(rng, 20*kv)); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range nodes {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		nd.Stop(sctx)
		scancel()
	}
	nodes = nodetest.Start(t, "n", 2, ec, persist)
	c = dial(t, nodes[0])
	const N = 8
	errs := make(chan error, N)
	for range N {
		go func() {
			_, _, err := c.Create(ctx, plan.Striped)
			errs <- err
		}()
	}
	for range N {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	recs, dmg, err := c.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	parked := 0
	for _, nd := range nodes {
		parked += nd.Stats().Recovery.Parked
	}
	t.Logf("recovered %+v damaged %+v parked %d", recs, dmg, parked)
	if len(recs) != 1 || recs[0].ID != a {
		t.Errorf("sequence %s not adopted after concurrent first creates (recovered %+v, damaged %+v)", a, recs, dmg)
	}
}

// TestRecoveredOnOtherPlacementStaysParked: a CP = 2 sequence on n0 and
// one of n1, n2; all three stop; n0 and the other node come back first
// and the first Create places the grid on them: n0's ranks find their
// directory (same coordinator, same shape, same hosted rank) and
// recover the sequence, the new peer has none, and the adoption frees
// n0's half, though the node holding the other half is only late.
func TestRecoveredOnOtherPlacementStaysParked(t *testing.T) {
	ec := geometry(2, 1)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	nodes := nodetest.Start(t, "n", 3, ec, func(i int, c *node.Config) { c.DataDir = dirs[i] })
	c := dial(t, nodes[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	kv := ec.KVHeads * ec.HeadDim
	a, placed, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	for l := range ec.Layers {
		if err := c.Append(ctx, a, l, randVec(rng, 20*kv), randVec(rng, 20*kv)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("sequence %s on %v", a, placed)
	for _, nd := range nodes {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		nd.Stop(sctx)
		scancel()
	}
	other := 2
	if placed[1] == "n2" {
		other = 1
	}
	n0 := nodetest.Start(t, "n", 1, ec, func(i int, c *node.Config) { c.DataDir = dirs[0] })[0]
	no := restartNode(t, "n"+itoa(other), n0.GossipAddr(), dirs[other], node.Config{Engine: ec})
	nodetest.WaitUp(t, []*node.Node{n0, no}, 2)
	c = dial(t, n0)
	if _, _, err := c.Create(ctx, plan.Striped); err != nil {
		t.Fatal(err)
	}
	recs, dmg, err := c.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered %+v, damaged %+v", recs, dmg)
	if len(dmg) > 0 {
		t.Errorf("sequence %s freed on n0 as damaged while %s, which holds its other half, was merely not up yet", a, placed[1])
	}
	if p := n0.Stats().Recovery.Parked; p != 1 {
		t.Errorf("n0: %d sequences parked, want %s's half", p, a)
	}
	// Every node back: the original placement's grid adopts it.
	for _, nd := range []*node.Node{n0, no} {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		nd.Stop(sctx)
		scancel()
	}
	nodes = nodetest.Start(t, "n", 3, ec, func(i int, c *node.Config) { c.DataDir = dirs[i] })
	c = dial(t, nodes[0])
	b, placedB, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	recs, dmg, err = c.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("all back: created %s on %v; recovered %+v, damaged %+v", b, placedB, recs, dmg)
	if len(recs) != 1 || recs[0].ID != a || recs[0].Len != 20 {
		t.Errorf("all nodes back on the original placement: recovered %+v, damaged %+v, want %s with 20 tokens", recs, dmg, a)
	}
}

func itoa(n int) string { return string(rune('0' + n)) }
