package remote

import (
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// dirSums maps each file under dir but the lock to its SHA-256.
func dirSums(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == lockName {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = sha256.Sum256(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestVerifyDataDir writes two grids' directories on two nodes through
// the real servers (coord-a: a CP 2 grid, one rank per node, two
// sequences of 40 tokens; coord-b: opened, no sequences) and verifies
// them offline: refused while a server holds the directory; every
// sequence found with the tokens its rank holds (a striped layout:
// each rank's length ends with its last page) and every page of every
// layer read; nothing in the directory changed. Then
// a flipped store.db meta page makes its grid refused as the server
// refuses it, the other grid still ok; a flipped slab byte makes a
// grid damaged but not refused; Repair moves the refused grid to the
// server's quarantine name, after which a server opens that grid fresh
// without quarantining anything.
func TestVerifyDataDir(t *testing.T) {
	ec := engineConfig(2, 1, plan.Exact)
	wc := workerConfig(ec)
	dirs := []string{t.TempDir(), t.TempDir()}
	var moved []string
	start := func() []*node {
		return persistNodes(t, dirs, func(cfg *ServerConfig) {
			cfg.OnQuarantine = func(dir, to string, err error) { moved = append(moved, to) }
		})
	}
	ctx := context.Background()
	nodes := start()
	clients, eng := openCP2(t, ec, wc, nodes, "coord-a/1/1")
	rng := rand.New(rand.NewPCG(6, 6))
	kv := ec.KVHeads * ec.HeadDim
	var seqs []uint64
	for range 2 {
		id, err := eng.Create(plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, uint64(id))
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
	if _, err := VerifyDataDir(ctx, dirs[0], VerifyConfig{}); !errors.Is(err, ErrDataDirInUse) {
		t.Errorf("verify while a server runs: %v, want ErrDataDirInUse", err)
	}
	eng.Close()
	if err := CloseGrid(ctx, append(other, clients...)...); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.conn.Close()
		n.stop()
	}

	for i, dir := range dirs {
		before := dirSums(t, dir)
		rep, err := VerifyDataDir(ctx, dir, VerifyConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Damaged() || len(rep.Grids) != 2 || len(rep.Quarantined) != 0 {
			t.Fatalf("node %d: %+v, want two grids, ok", i, rep)
		}
		// Striped: rank i holds pages i, i+2, ... of the 40 tokens; its
		// length ends with its last page.
		wantLen, wantPages := 0, 0
		for p := i; p*ec.PageSize < 40; p += 2 {
			wantLen, wantPages = min(40, (p+1)*ec.PageSize), wantPages+ec.Layers
		}
		for _, g := range rep.Grids {
			if !g.OK() || g.Empty {
				t.Errorf("node %d grid %s: %+v", i, g.Dir, g)
			}
			if strings.Contains(g.Dir, "coord-b") {
				if len(g.Sequences) != 0 {
					t.Errorf("node %d: coord-b's grid has %d sequences", i, len(g.Sequences))
				}
				continue
			}
			var got []uint64
			for _, s := range g.Sequences {
				got = append(got, s.Seq)
				if s.Grid != "coord-a/1/1" || s.Err != nil || s.Pages != wantPages || s.LostTokens() != 0 || slices.ContainsFunc(s.Lens, func(n int) bool { return n != wantLen }) {
					t.Errorf("node %d: sequence %+v, want grid coord-a/1/1, lengths %d, %d pages", i, s, wantLen, wantPages)
				}
			}
			if slices.Sort(got); !slices.Equal(got, seqs) {
				t.Errorf("node %d: sequences %v, want %v", i, got, seqs)
			}
		}
		after := dirSums(t, dir)
		if len(after) != len(before) {
			t.Errorf("node %d: %d files after verification, %d before", i, len(after), len(before))
		}
		for p, s := range before {
			if after[p] != s {
				t.Errorf("node %d: verification changed %s", i, p)
			}
		}
	}

	// A slab byte, on a copy of node 1's directory.
	slabDir := t.TempDir()
	copyDir(t, dirs[1], slabDir)
	slabs, _ := filepath.Glob(filepath.Join(slabDir, "grids", "coord-a", "*", "rank-*", "slab-*"))
	if len(slabs) != 1 {
		t.Fatalf("slabs %v", slabs)
	}
	b, err := os.ReadFile(slabs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0x40 // inside the first page's payload
	if err := os.WriteFile(slabs[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyDataDir(ctx, slabDir, VerifyConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rep.Grids {
		if bad := strings.Contains(g.Dir, "coord-a"); g.OK() == bad || g.Refused {
			t.Errorf("slab flipped: grid %s ok %v refused %v (%+v)", g.Dir, g.OK(), g.Refused, g)
		}
	}

	// Both meta pages of coord-a's store.db on node 0.
	dbs, _ := filepath.Glob(filepath.Join(dirs[0], "grids", "coord-a", "*", "rank-*", "store.db"))
	if len(dbs) != 1 {
		t.Fatalf("store.db files %v", dbs)
	}
	if b, err = os.ReadFile(dbs[0]); err != nil {
		t.Fatal(err)
	}
	b[16+8] ^= 0xff
	b[os.Getpagesize()+16+8] ^= 0xff
	if err := os.WriteFile(dbs[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	gridDir := filepath.Dir(filepath.Dir(dbs[0]))
	for _, repair := range []bool{false, true} {
		now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
		rep, err := VerifyDataDir(ctx, dirs[0], VerifyConfig{Repair: repair, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Damaged() || len(rep.Grids) != 2 {
			t.Fatalf("repair %v: %+v, want damage", repair, rep)
		}
		for _, g := range rep.Grids {
			a := strings.Contains(g.Dir, "coord-a")
			if g.Refused != a || g.OK() == a || (a && !errors.Is(g.Err, tier.ErrCorrupt)) {
				t.Errorf("repair %v: grid %s refused %v ok %v err %v", repair, g.Dir, g.Refused, g.OK(), g.Err)
			}
			if want := ""; a && repair {
				want, _ = filepath.Rel(dirs[0], QuarantineName(gridDir, now))
				if g.MovedTo != want {
					t.Errorf("moved to %q, want %q", g.MovedTo, want)
				}
			} else if g.MovedTo != want {
				t.Errorf("repair %v: grid %s moved to %q", repair, g.Dir, g.MovedTo)
			}
		}
	}
	if _, err := os.Stat(gridDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused grid is still at %s after repair: %v", gridDir, err)
	}
	rep, err = VerifyDataDir(ctx, dirs[0], VerifyConfig{})
	if err != nil || rep.Damaged() || len(rep.Grids) != 1 || len(rep.Quarantined) != 1 {
		t.Fatalf("after repair: %+v, %v: want one ok grid, one quarantined", rep, err)
	}
	// A server opens the repaired grid fresh: nothing to quarantine.
	nodes = start()
	clients, eng = openCP2(t, ec, wc, nodes, "coord-a/2/1")
	defer eng.Close()
	if len(moved) != 0 {
		t.Errorf("the server quarantined %v after repair", moved)
	}
	if rec := clients[0].Recovered(); len(rec) != 0 {
		t.Errorf("node 0 recovered %+v from its repaired directory", rec)
	}
	if rec := clients[1].Recovered(); len(rec) != 2 {
		t.Errorf("node 1 recovered %d sequences, want 2", len(rec))
	}
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatal(err)
	}
}
