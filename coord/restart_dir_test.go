package coord_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// TestRestartWhileCoordinatorHoldsLostGrid: the coordinator n0 keeps
// running while n1, the other node of a CP = 2 sequence's grid, stops
// inside a client's step (after layer 0) and restarts on its data
// directory at once. The client's step stays open, which keeps the lost
// grid's engine, hence the grid on n0, open until the step deadline
// (engine.Close waits for the step): the grid that Recovered opens on
// the restarted cluster reaches n0 while n0 still holds the lost grid's
// directory. n0 must recover that directory (not open a fresh one
// beside it, which lost n0's half of the sequence and freed the
// sequence): the sequence is adopted with exact per-layer losses and
// its next steps equal, bit for bit, those of a cluster that never
// stopped.
func TestRestartWhileCoordinatorHoldsLostGrid(t *testing.T) {
	ec := geometry(2, 1)
	S := ec.PageSize
	dirs := []string{t.TempDir(), t.TempDir()}
	nodes := nodetest.Start(t, "n", 2, ec, func(i int, c *node.Config) { c.DataDir = dirs[i] })
	refNodes := startCluster(t, 2, ec)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, ref := dial(t, nodes[0]), dial(t, refNodes[0])
	seq, on, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rsq, _, err := ref.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	w := &twin{t: t, ctx: ctx, ec: ec, rng: rand.New(rand.NewPCG(27, 3)), c: c, ref: ref, seq: seq, rsq: rsq}
	// The open step's token goes to a page on n1's rank.
	p := 1
	if on[p%2] != "n1" {
		p = 2
	}
	n := p*S + 2
	w.appendN(n - 1)
	w.step() // acknowledged: n tokens in both layers
	st, err := c.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: c.Handle(seq), New: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var res decode.Result
	k := randVec(w.rng, ec.KVHeads*ec.HeadDim)
	if err := st.Layer(ctx, 0, decode.Host(randVec(w.rng, ec.QHeads*ec.HeadDim)), decode.Host(k), decode.Host(k), &res); err != nil {
		t.Fatal(err)
	}
	if nodes[1].Name() != "n1" {
		t.Fatalf("node 1 is %s", nodes[1].Name())
	}
	stopAll(nodes[1])
	n1 := restartNode(t, "n1", nodes[0].GossipAddr(), dirs[1], node.Config{Engine: ec})
	nodetest.WaitUp(t, []*node.Node{nodes[0], n1}, 2)
	recs, dmg, err := c.Recovered(ctx)
	st.End(ctx) // fails: the grid lost n1
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered %+v, damaged %+v", recs, dmg)
	if len(recs) != 1 || len(dmg) != 0 {
		t.Fatalf("recovered %+v, damaged %+v; want %s adopted", recs, dmg, seq)
	}
	r := recs[0]
	if r.ID != seq && r.RenamedFrom != seq {
		t.Fatalf("adopted %s (renamed from %q), want %s", r.ID, r.RenamedFrom, seq)
	}
	// n1 saved its tails and the open step's marker as it stopped: the
	// step's token is cut from layer 0, nothing acknowledged is lost.
	if !slices.Equal(r.Lens, []int{n, n}) || !slices.Equal(r.RolledBack, []int{1, 0}) || !slices.Equal(r.Lost, []int{1, 0}) {
		t.Errorf("recovered lens %v lost %v rolled back %v, want [%d %d], [1 0], [1 0]", r.Lens, r.Lost, r.RolledBack, n, n)
	}
	// One directory of the grid's shape on each node: the one the first
	// grid made (".0"), no fresh one beside it.
	for i, d := range dirs {
		got, err := filepath.Glob(filepath.Join(d, "grids", "n0", "*"))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || !strings.HasSuffix(got[0], ".0") {
			t.Errorf("n%d holds grid directories %v, want one, ending in .0", i, got)
		}
	}
	w.seq = r.ID
	w.step()
	w.step()
}
