package remote

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestPersistGridAcrossNodes: a CP = 2 grid over two persisting nodes
// (one rank each) takes appends that seal pages and leave a tail; the
// grid closes (gracefully) and the nodes restart on their directories.
// The same coordinator's next grid of the same shape (a new grid id:
// another coordinator instance) finds it: each node's ConnectGrid
// reports the recovered sequences, the smallest lengths and largest
// lengths-before-the-stop over the nodes are the sequences' lengths,
// claims make them live under their ids, every rank's keys come back
// bit for bit and a Check of the next append at that length passes on
// every node. Another coordinator's grid of the same shape starts
// empty.
func TestPersistGridAcrossNodes(t *testing.T) {
	ec := engineConfig(2, 1, plan.Exact)
	wc := workerConfig(ec)
	dirs := []string{t.TempDir(), t.TempDir()}
	start := func() []*node { return persistNodes(t, dirs, nil) }
	ctx := context.Background()
	nodes := start()
	// A second server on a held directory is refused, naming it.
	cfg := DefaultServerConfig()
	cfg.DataDir, cfg.Plaintext = dirs[0], true
	if _, err := NewServer(cfg); !errors.Is(err, ErrDataDirInUse) || !strings.Contains(err.Error(), dirs[0]) {
		t.Fatalf("second server on %s: %v, want ErrDataDirInUse naming it", dirs[0], err)
	}
	open := func(nodes []*node, id string) ([]*Client, *engine.Engine) { return openCP2(t, ec, wc, nodes, id) }
	clients, eng := open(nodes, "coord-a/1/1")
	rng := rand.New(rand.NewPCG(2, 2))
	kv := ec.KVHeads * ec.HeadDim
	lens := map[uint64]int{}
	for _, n := range []int{37, 20} {
		id, err := eng.Create(plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		for l := range ec.Layers {
			k, v := make([]float32, n*kv), make([]float32, n*kv)
			for i := range k {
				k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
			}
			if err := eng.Append(id, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
		lens[uint64(id)] = n
	}
	// keys reads every rank's keys of its full pages (the tail page's
	// slots past its length are unspecified).
	keys := func(clients []*Client, seq uint64) []uint32 {
		t.Helper()
		var out []uint32
		for cp, c := range clients {
			pages := (lens[seq]/ec.PageSize - cp + 1) / 2 // rank cp's full pages of a striped sequence
			for l := range ec.Layers {
				var rep worker.KeysReply
				if err := c.Keys(ctx, worker.KeysRequest{Seq: seq, Rank: worker.Rank{CP: cp}, Layer: l, Count: pages}, &rep); err != nil {
					t.Fatal(err)
				}
				for _, x := range rep.K {
					out = append(out, math.Float32bits(x))
				}
			}
		}
		return out
	}
	before := map[uint64][]uint32{}
	for seq := range lens {
		before[seq] = keys(clients, seq)
	}
	eng.Close()
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.conn.Close()
		n.stop()
	}

	nodes = start()
	clients, eng = open(nodes, "coord-a/2/1")
	defer eng.Close()
	got, had := map[uint64]int{}, map[uint64]int{}
	for i, c := range clients {
		rec := c.Recovered()
		if len(rec) != len(lens) {
			t.Fatalf("node %d recovered %+v, want %d sequences", i, rec, len(lens))
		}
		for _, r := range rec {
			if r.Grid != "coord-a/1/1" || len(r.Placement) != 2 || r.Placement[0] != "na" || r.Placement[1] != "nb" {
				t.Fatalf("node %d: recovered sequence %d of grid %q on %v, want coord-a/1/1 on [na nb]", i, r.Seq, r.Grid, r.Placement)
			}
			// Node i hosts rank (tp 0, cp i): it reports the end of
			// its own tokens; the coordinator bounds them.
			m := slices.Min(worker.MaxLens(r.Layout, ec.PageSize, []worker.Rank{{CP: i}}, r.Lens))
			if n, ok := got[r.Seq]; !ok || m < n {
				got[r.Seq] = m
			}
			had[r.Seq] = max(had[r.Seq], r.Had)
			if err := c.Park(ctx, r.Seq); !errors.Is(err, worker.ErrUnknownSequence) {
				t.Fatalf("node %d: park of a sequence not claimed: %v, want worker.ErrUnknownSequence", i, err)
			}
			// Claimed, parked again, claimed for good.
			for _, f := range []func() error{
				func() error { return c.Claim(ctx, r.Key, r.Seq) },
				func() error { return c.Park(ctx, r.Seq) },
				func() error { return c.Claim(ctx, r.Key, r.Seq) },
			} {
				if err := f(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for seq, n := range lens {
		if got[seq] != n || had[seq] != n {
			t.Fatalf("sequence %d: recovered %d tokens of %d, want %d of %d", seq, got[seq], had[seq], n, n)
		}
		for _, c := range clients {
			if err := c.Check(ctx, worker.CheckRequest{Seq: seq, Len: n, Append: 1}); err != nil {
				t.Fatalf("sequence %d: check of an append at %d after the restart: %v", seq, n, err)
			}
		}
		k := keys(clients, seq)
		if len(k) == 0 || len(k) != len(before[seq]) {
			t.Fatalf("sequence %d: %d key words after the restart, %d before", seq, len(k), len(before[seq]))
		}
		for i := range k {
			if k[i] != before[seq][i] {
				t.Fatalf("sequence %d: key word %d differs after the restart", seq, i)
			}
		}
	}
	// Another coordinator's grid of the same shape has its own directory.
	other, err := OpenGrid(ctx, spread(ec, conns(nodes), 0), GridRef{Grid: "coord-b/1/1", View: 1}, wc)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range other {
		if rec := c.Recovered(); len(rec) != 0 {
			t.Fatalf("coord-b's grid on node %d recovered %+v", i, rec)
		}
	}
	if err := CloseGrid(ctx, append(other, clients...)...); err != nil {
		t.Fatal(err)
	}
}

// TestGridDir: the grid directory depends on the coordinator's name and
// the shape, not on the coordinator's instance or grid number, the
// policy or the offload settings, and is a safe file name.
func TestGridDir(t *testing.T) {
	wc := workerConfig(engineConfig(2, 1, plan.Exact))
	ranks := []worker.Rank{{CP: 0}}
	base := gridDirBase("/d", "node-0/1f/1", wc, ranks)
	same := wc
	same.Policy.BudgetTokens, same.DeviceBudgetPages = 64, 8
	for _, c := range []struct {
		id    string
		cfg   worker.Config
		ranks []worker.Rank
		eq    bool
	}{
		{"node-0/2a/9", same, ranks, true},
		{"node-1/1f/1", wc, ranks, false},
		{"node-0/1f/1", wc, []worker.Rank{{CP: 1}}, false},
		{"node-0/1f/1", func() worker.Config { c := wc; c.Capacity++; return c }(), ranks, false},
	} {
		if got := gridDirBase("/d", c.id, c.cfg, c.ranks); (got == base) != c.eq {
			t.Errorf("grid %s %v: dir %s, first grid's %s: want equal %v", c.id, c.ranks, got, base, c.eq)
		}
	}
	if d := gridDirBase("/d", "../../etc/x/1", wc, ranks); !strings.HasPrefix(d, "/d/grids/") || strings.Contains(d, "/../") {
		t.Errorf("a hostile grid id gives dir %s", d)
	}
}

// persistNodes starts one node on each of dirs (its DataDir), cfg
// adjusted by mutate when set.
func persistNodes(t *testing.T, dirs []string, mutate func(*ServerConfig)) []*node {
	t.Helper()
	var nodes []*node
	for _, d := range dirs {
		cfg := DefaultServerConfig()
		cfg.DataDir, cfg.MemoryLimit = d, -1
		if mutate != nil {
			mutate(&cfg)
		}
		nodes = append(nodes, startNodes(t, 1, cfg)...)
	}
	return nodes
}

// openCP2 opens grid id of the CP 2 config ec over two nodes (named na,
// nb), one rank each, and an engine over it.
func openCP2(t *testing.T, ec engine.Config, wc worker.Config, nodes []*node, id string) ([]*Client, *engine.Engine) {
	t.Helper()
	nr := spread(ec, conns(nodes), 0)
	for i := range nr {
		nr[i].Name = "n" + string(rune('a'+i))
	}
	clients, err := OpenGrid(context.Background(), nr, GridRef{Grid: id, View: 1}, wc)
	if err != nil {
		t.Fatal(err)
	}
	hosts := []engine.Host{{Worker: clients[0], Ranks: []worker.Rank{{CP: 0}}}, {Worker: clients[1], Ranks: []worker.Rank{{CP: 1}}}}
	eng, err := engine.Open(ec, hosts)
	if err != nil {
		t.Fatal(err)
	}
	return clients, eng
}
