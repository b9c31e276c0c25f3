package remote

import (
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// TestQuarantineDamagedGrid: a grid persisted on two nodes; one node's
// page store manifest (store.db) gets both meta pages damaged while the
// nodes are down. When the grid opens again, that node moves the grid's
// directory aside (named .corrupt-..., reported to OnQuarantine) and
// opens the grid on a fresh one: it recovers nothing, the other node
// recovers every sequence, the grid takes new sequences, and the node's
// other grids are untouched. Before, one flipped byte in store.db
// panicked the node or failed every open of the grid.
func TestQuarantineDamagedGrid(t *testing.T) {
	ec := engineConfig(2, 1, plan.Exact)
	wc := workerConfig(ec)
	dirs := []string{t.TempDir(), t.TempDir()}
	var mu sync.Mutex
	var moved []string
	start := func() []*node {
		return persistNodes(t, dirs, func(cfg *ServerConfig) {
			cfg.OnQuarantine = func(dir, to string, err error) {
				mu.Lock()
				moved = append(moved, to)
				mu.Unlock()
			}
		})
	}
	ctx := context.Background()
	open := func(nodes []*node, id string) ([]*Client, *engine.Engine) { return openCP2(t, ec, wc, nodes, id) }
	nodes := start()
	clients, eng := open(nodes, "coord-a/1/1")
	rng := rand.New(rand.NewPCG(5, 5))
	kv := ec.KVHeads * ec.HeadDim
	for range 2 {
		id, err := eng.Create(plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		for l := range ec.Layers {
			k, v := make([]float32, 40*kv), make([]float32, 40*kv)
			for i := range k {
				k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
			}
			if err := eng.Append(id, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	other, err := OpenGrid(ctx, spread(ec, conns(nodes), 0), GridRef{Grid: "coord-b/1/1", View: 1}, wc)
	if err != nil {
		t.Fatal(err)
	}
	eng.Close()
	if err := CloseGrid(ctx, append(other, clients...)...); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.conn.Close()
		n.stop()
	}
	// Damage coord-a's store.db on node 0: both meta pages' checksums.
	var dbs []string
	filepath.WalkDir(dirs[0], func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "store.db" && strings.Contains(p, "coord-a") {
			dbs = append(dbs, p)
		}
		return nil
	})
	if len(dbs) == 0 {
		t.Fatalf("no store.db of coord-a's grid under %s", dirs[0])
	}
	for _, p := range dbs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		ps := os.Getpagesize()
		b[16+8] ^= 0xff    // meta 0, past the magic and version
		b[ps+16+8] ^= 0xff // meta 1
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	nodes = start()
	clients, eng = open(nodes, "coord-a/2/1")
	defer eng.Close()
	mu.Lock()
	if len(moved) != 1 || !strings.Contains(moved[0], ".corrupt-") || !strings.HasPrefix(moved[0], dirs[0]) {
		t.Fatalf("quarantined %v, want one directory of node 0 moved to .corrupt-*", moved)
	}
	mu.Unlock()
	if _, err := os.Stat(moved[0]); err != nil {
		t.Errorf("the damaged directory is not kept for inspection: %v", err)
	}
	if rec := clients[0].Recovered(); len(rec) != 0 {
		t.Errorf("node 0 recovered %+v from a fresh directory", rec)
	}
	if rec := clients[1].Recovered(); len(rec) != 2 {
		t.Errorf("node 1 recovered %d sequences, want 2", len(rec))
	}
	// Node 0 says why, and names the sequences the moved directory's
	// table held (those node 1 recovered), without server paths.
	nr := clients[0].NotRecovered()
	if !strings.Contains(nr.Quarantined, "moved aside") || !strings.Contains(nr.Quarantined, "store.db") || strings.Contains(nr.Quarantined, dirs[0]) {
		t.Errorf("node 0 reported quarantine %q, want the damaged store.db named without its path", nr.Quarantined)
	}
	if len(nr.Damaged) != 2 {
		t.Fatalf("node 0 reported damaged %+v, want the 2 sequences of its moved table", nr.Damaged)
	}
	for i, d := range nr.Damaged {
		r := clients[1].Recovered()[i]
		if d.Seq != r.Seq || d.Grid != r.Grid || d.Reason != nr.Quarantined {
			t.Errorf("node 0 reported damaged %+v, node 1 recovered seq %d of grid %s", d, r.Seq, r.Grid)
		}
	}
	if nr := clients[1].NotRecovered(); nr.Quarantined != "" || len(nr.Damaged) != 0 {
		t.Errorf("node 1 reported %+v", nr)
	}
	id, err := eng.Create(plan.Striped)
	if err != nil {
		t.Fatalf("create on the reopened grid: %v", err)
	}
	if err := eng.Append(id, 0, make([]float32, 4*kv), make([]float32, 4*kv)); err != nil {
		t.Fatalf("append on the reopened grid: %v", err)
	}
	// The node's other grid opens from its own directory, untouched.
	other, err = OpenGrid(ctx, spread(ec, conns(nodes), 0), GridRef{Grid: "coord-b/2/1", View: 1}, wc)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(moved) != 1 {
		t.Errorf("quarantined %v after coord-b's grid opened", moved)
	}
	mu.Unlock()
	if err := CloseGrid(ctx, append(other, clients...)...); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
