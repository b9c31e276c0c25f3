package coord_test

import (
	"context"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// twin drives one sequence on a persisting cluster and on a reference
// cluster that never stops, with the same K/V, comparing outputs bit for
// bit.
type twin struct {
	t        *testing.T
	ctx      context.Context
	ec       engine.Config
	rng      *rand.Rand
	c, ref   *client.Client
	seq, rsq string
}

func (w *twin) appendN(n int) {
	w.t.Helper()
	kv := w.ec.KVHeads * w.ec.HeadDim
	for l := range w.ec.Layers {
		k, v := randVec(w.rng, n*kv), randVec(w.rng, n*kv)
		if err := w.c.Append(w.ctx, w.seq, l, k, v); err != nil {
			w.t.Fatal(err)
		}
		if err := w.ref.Append(w.ctx, w.rsq, l, k, v); err != nil {
			w.t.Fatal(err)
		}
	}
}

func (w *twin) step() {
	w.t.Helper()
	kv, qd := w.ec.KVHeads*w.ec.HeadDim, w.ec.QHeads*w.ec.HeadDim
	for l := range w.ec.Layers {
		q, k, v := randVec(w.rng, qd), randVec(w.rng, kv), randVec(w.rng, kv)
		got, err := w.c.Step(w.ctx, l, []client.Item{{Seq: w.seq, Q: q, K: k, V: v}}, client.StepOptions{})
		if err != nil {
			w.t.Fatal(err)
		}
		want, err := w.ref.Step(w.ctx, l, []client.Item{{Seq: w.rsq, Q: q, K: k, V: v}}, client.StepOptions{})
		if err != nil {
			w.t.Fatal(err)
		}
		for i := range want.O {
			if math.Float32bits(got.O[i]) != math.Float32bits(want.O[i]) {
				w.t.Fatalf("%s layer %d: output %d is %v, the cluster that never stopped has %v", w.seq, l, i, got.O[i], want.O[i])
			}
		}
	}
}

func stopAll(nodes ...*node.Node) {
	for _, nd := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		nd.Stop(ctx)
		cancel()
	}
}

// TestRecoveredNamesQuarantine: two persisting nodes, each the
// coordinator of its own sequences (grid n0/... and grid n1/..., both
// over both nodes). While they are down, n0's grid's store.db on n1 is
// damaged. After the restart n1 moves that grid's directory aside:
// n0's Recovered lists n0's sequence as damaged, with n1's reason (the
// directory damaged and moved aside, no server path), where before it
// said only that a worker did not recover it; n1's Recovered adopts n1's
// two sequences, whose next steps equal, bit for bit, those of a
// cluster that never stopped.
func TestRecoveredNamesQuarantine(t *testing.T) {
	ec := geometry(2, 1)
	dirs := []string{t.TempDir(), t.TempDir()}
	persist := func(i int, c *node.Config) { c.DataDir = dirs[i] }
	nodes := nodetest.Start(t, "n", 2, ec, persist)
	refNodes := startCluster(t, 2, ec)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c0, c1, ref := dial(t, nodes[0]), dial(t, nodes[1]), dial(t, refNodes[0])
	rng := rand.New(rand.NewPCG(27, 1))
	mk := func(c *client.Client) *twin {
		seq, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		rsq, _, err := ref.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		return &twin{t: t, ctx: ctx, ec: ec, rng: rng, c: c, ref: ref, seq: seq, rsq: rsq}
	}
	lost, keep := mk(c0), []*twin{mk(c1), mk(c1)}
	for i, w := range append([]*twin{lost}, keep...) {
		w.appendN(9 + 4*i)
		w.step()
	}
	if !strings.HasPrefix(lost.seq, "n0/") || !strings.HasPrefix(keep[0].seq, "n1/") {
		t.Fatalf("sequences %s and %s: want one of each coordinator", lost.seq, keep[0].seq)
	}
	stopAll(nodes...)

	// Damage n0's grid's store.db on n1: both meta pages.
	var dbs []string
	filepath.WalkDir(filepath.Join(dirs[1], "grids", "n0"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "store.db" {
			dbs = append(dbs, p)
		}
		return nil
	})
	if len(dbs) == 0 {
		t.Fatalf("no store.db of n0's grid under %s", dirs[1])
	}
	for _, p := range dbs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[24] ^= 0xff
		b[os.Getpagesize()+24] ^= 0xff
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	nodes = nodetest.Start(t, "n", 2, ec, persist)
	c0, c1 = dial(t, nodes[0]), dial(t, nodes[1])
	recs, dmg, err := c0.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("n0: recovered %+v, damaged %+v", recs, dmg)
	if len(recs) != 0 || len(dmg) != 1 || dmg[0].ID != lost.seq || dmg[0].Parked {
		t.Fatalf("n0 recovered %+v, damaged %+v; want %s damaged and freed", recs, dmg, lost.seq)
	}
	d := dmg[0]
	if !strings.HasPrefix(d.Reason, "node n1: ") || !strings.Contains(d.Reason, "data directory was damaged and moved aside") ||
		!strings.Contains(d.Reason, "store.db") || !strings.Contains(d.Err, d.Reason) {
		t.Errorf("damaged %s: reason %q (error %q): want n1's quarantine of the grid's directory, its store.db named", d.ID, d.Reason, d.Err)
	}
	for _, dir := range dirs {
		if strings.Contains(d.Err, dir) {
			t.Errorf("the damaged sequence's error names the server path %s: %q", dir, d.Err)
		}
	}
	st, err := c0.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sd := st.GetDamaged(); len(sd) != 1 || sd[0].GetReason() != d.Reason {
		t.Errorf("Status lists damaged %v, want %s with reason %q", sd, lost.seq, d.Reason)
	}

	recs, dmg, err = c1.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(dmg) != 0 || len(recs) != 2 {
		t.Fatalf("n1 recovered %+v, damaged %+v; want %s and %s", recs, dmg, keep[0].seq, keep[1].seq)
	}
	for i, w := range keep {
		r := recs[i]
		if r.ID != w.seq || r.LostTokens != 0 || slices.Max(r.Lost) != 0 {
			t.Fatalf("n1 recovered %+v, want %s whole (a graceful stop)", r, w.seq)
		}
		w.c = c1
		w.step()
		w.step()
	}
	for _, nd := range nodes {
		if p := nd.Stats().Recovery.Parked; p != 0 {
			t.Errorf("%s: %d sequences parked after the adoptions", nd.Name(), p)
		}
	}
}

// TestRecoveredExactLostPerLayer: a step of a CP = 2 sequence on two
// persisting nodes runs layer 0 and stops there (the client's step
// open), and the node storing the step's token stops with it: it saves
// its tails and the step's marker; then the other node stops. Both
// restarted, that node cuts the token from layer 0; the coordinator
// adopts the sequence and reports, per layer, exactly what each layer
// lost: layer 0 its unacknowledged token
// (lost 1, rolled back 1), layer 1 nothing (lost 0), where one length
// per node made it lost 1 in every layer. Nothing acknowledged is to
// append again (lost - rolled back is 0 in each layer) and the next
// steps equal, bit for bit, those of a cluster that saw the same
// acknowledged tokens.
func TestRecoveredExactLostPerLayer(t *testing.T) {
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
	w := &twin{t: t, ctx: ctx, ec: ec, rng: rand.New(rand.NewPCG(27, 2)), c: c, ref: ref, seq: seq, rsq: rsq}
	// The step's token (position n) goes to page p, striped on rank
	// p mod 2: pick p on n1's rank, so that n0, the coordinator, stays.
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
	i1 := slices.IndexFunc(nodes, func(nd *node.Node) bool { return nd.Name() == "n1" })
	stopAll(nodes[i1]) // the step still open on the client: never acknowledged
	st.End(ctx)        // fails: the grid lost n1
	// n0 stops too (its part of the lost grid persisted as it closes);
	// both restart, as after a restart of the whole cluster.
	stopAll(nodes[1-i1])
	nodes = nodetest.Start(t, "n", 2, ec, func(i int, c *node.Config) { c.DataDir = dirs[i] })
	c = dial(t, nodes[0])
	w.c = c
	recs, dmg, err := c.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered %+v, damaged %+v", recs, dmg)
	if len(recs) != 1 || len(dmg) != 0 || recs[0].ID != seq {
		t.Fatalf("recovered %+v, damaged %+v; want %s", recs, dmg, seq)
	}
	r := recs[0]
	w.seq = r.ID
	// The reference saw n acknowledged tokens in every layer; n1 held
	// one more in layer 0 (the open step's).
	if !slices.Equal(r.Lens, []int{n, n}) || r.Had != n+1 || r.LostTokens != 1 {
		t.Errorf("recovered lens %v had %d lost_tokens %d, want [%d %d], %d, 1", r.Lens, r.Had, r.LostTokens, n, n, n+1)
	}
	if !slices.Equal(r.RolledBack, []int{1, 0}) || !slices.Equal(r.Lost, []int{1, 0}) {
		t.Errorf("recovered lost %v rolled back %v per layer, want [1 0] and [1 0]", r.Lost, r.RolledBack)
	}
	for l := range r.Lens {
		if acked := n - r.Lens[l]; r.Lost[l]-r.RolledBack[l] != acked {
			t.Errorf("layer %d: lost %d - rolled back %d, but %d acknowledged tokens are missing", l, r.Lost[l], r.RolledBack[l], acked)
		}
	}
	w.step()
	w.step()
}
