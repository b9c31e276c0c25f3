package remote

import (
	"context"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestRecoverUnevenAdopt: a CP = 2 grid over two persisting nodes (pages
// striped: even ones node 0's). The sequence takes 18 tokens in both
// layers, then 6 in layer 0 alone (acknowledged appends of one layer, as
// a step's that reached layer 0 only). Node 0 crashes (its directory as
// kill -9 leaves it): its tail page 4, full in layer 0 only, was never
// sealed; it keeps pages 0 and 2. Node 1 stops gracefully and keeps
// pages 1 and 3 in both layers and page 5 in layer 0. Adopting it needs
// node 1 cut back by different amounts per layer (a per-layer Rollback
// over gRPC): the sequence is adopted, not freed, at 16 tokens, the
// lost tokens of every layer exactly those above them (8 and 2: node
// 0's per-layer length record knows layer 1's), and after they are appended
// again a decode step equals, bit for bit, a grid that never stopped.
func TestRecoverUnevenAdopt(t *testing.T) {
	ec := engineConfig(2, 1, plan.Exact)
	wc := workerConfig(ec)
	ctx := context.Background()
	kv := ec.KVHeads * ec.HeadDim
	draw := func(seed uint64, n int) ([]float32, []float32) {
		rng := rand.New(rand.NewPCG(seed, 7))
		k, v := make([]float32, n*kv), make([]float32, n*kv)
		for i := range k {
			k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		return k, v
	}
	// appendRange appends tokens [from, to) of the draws (seed per layer)
	// to the given layers.
	appendRange := func(eng *engine.Engine, id engine.SeqID, layers []int, seed uint64, total, from, to int) {
		t.Helper()
		for _, l := range layers {
			k, v := draw(seed+uint64(l), total)
			if err := eng.Append(id, l, k[from*kv:to*kv], v[from*kv:to*kv]); err != nil {
				t.Fatal(err)
			}
		}
	}
	both, l0 := []int{0, 1}, []int{0}
	step := func(eng *engine.Engine, id engine.SeqID) [][]uint32 {
		t.Helper()
		st, err := eng.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: id, New: true}}})
		if err != nil {
			t.Fatal(err)
		}
		var out [][]uint32
		for l := range ec.Layers {
			rng := rand.New(rand.NewPCG(99, uint64(l)))
			q, k, v := make([]float32, ec.QHeads*ec.HeadDim), make([]float32, kv), make([]float32, kv)
			for _, x := range [][]float32{q, k, v} {
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
			}
			var res decode.Result
			if err := st.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(v), &res); err != nil {
				t.Fatal(err)
			}
			var bits []uint32
			for _, x := range append(slices.Clone(res.O.Data), res.LSE...) {
				bits = append(bits, math.Float32bits(x))
			}
			out = append(out, bits)
		}
		if err := st.End(ctx); err != nil {
			t.Fatal(err)
		}
		return out
	}

	// The reference: the same tokens, no restart.
	refNodes := persistNodes(t, []string{t.TempDir(), t.TempDir()}, nil)
	refClients, ref := openCP2(t, ec, wc, refNodes, "ref/1/1")
	rid, err := ref.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	appendRange(ref, rid, both, 1, 18, 0, 18)
	appendRange(ref, rid, l0, 2, 6, 0, 6)
	appendRange(ref, rid, []int{1}, 2, 6, 0, 6)
	want := step(ref, rid)
	ref.Close()
	if err := CloseGrid(ctx, refClients...); err != nil {
		t.Fatal(err)
	}

	dirs := []string{t.TempDir(), t.TempDir()}
	nodes := persistNodes(t, dirs, nil)
	clients, eng := openCP2(t, ec, wc, nodes, "coord-a/1/1")
	id, err := eng.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	appendRange(eng, id, both, 1, 18, 0, 18)
	appendRange(eng, id, l0, 2, 6, 0, 6)
	// Node 0 crashes: its directory now, before the graceful stop.
	crashed := t.TempDir()
	copyDir(t, dirs[0], crashed)
	eng.Close()
	if err := CloseGrid(ctx, clients...); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.conn.Close()
		n.stop()
	}
	dirs[0] = crashed
	nodes = persistNodes(t, dirs, nil)
	clients, eng = openCP2(t, ec, wc, nodes, "coord-a/2/1")
	defer eng.Close()
	r := engine.Recovered{Seq: id, Parts: make([]engine.RecoveredPart, 2)}
	for i, c := range clients {
		rec := c.Recovered()
		if len(rec) != 1 {
			t.Fatalf("node %d recovered %+v, want 1 sequence", i, rec)
		}
		s := rec[0]
		t.Logf("node %d: lens %v had %d lost %d rolled back %v", i, s.Lens, s.Had, s.LostTokens(), s.RolledBack)
		r.Layout = s.Layout
		r.Parts[i] = engine.RecoveredPart{Key: s.Key, Recovered: s.Recovered}
	}
	if p := r.Parts[1].Lens; p[0] == p[1] {
		t.Fatalf("node 1 recovered even layers %v: the test needs uneven ones", p)
	}
	a, err := eng.Adopt(ctx, r)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	t.Logf("adopted: %+v", a)
	if a.Had != 24 || slices.Min(a.Lens) != slices.Max(a.Lens) {
		t.Fatalf("adopted %+v, want had 24 and even lengths", a)
	}
	// At the stop layer 0 held 24 tokens and layer 1 18 (what was
	// appended above). Node 1 stopped gracefully: it knows layer 0's 24
	// (page 5 is its) exactly; layer 1's end is on node 0 (page 4),
	// whose crash left its per-layer length record (layer 1: 10 of its
	// tokens, global 18): exact too.
	n := a.Lens[0]
	if a.LostTokens() != 24-n || a.Lost()[0] != 24-n || !a.LostExact()[0] || a.RolledBack != nil {
		t.Fatalf("adopted %+v: want lost %d (exact) in layer 0, nothing rolled back", a, 24-n)
	}
	if !a.LostExact()[1] || a.Lost()[1] != 18-n {
		t.Fatalf("adopted %+v: want layer 1's loss exact, %d", a, 18-n)
	}
	for i, c := range clients {
		if err := c.Check(ctx, worker.CheckRequest{Seq: uint64(id), Len: n, Append: 1}); err != nil {
			t.Fatalf("node %d: check of an append at %d: %v", i, n, err)
		}
	}
	// Append again exactly the lost tokens, then the reference's rest.
	if n != 16 {
		t.Fatalf("adopted at %d tokens, want 16 (node 0's pages 0 and 2)", n)
	}
	appendRange(eng, id, both, 1, 18, 16, 18)
	appendRange(eng, id, both, 2, 6, 0, 6)
	got := step(eng, id)
	for l := range want {
		if !slices.Equal(got[l], want[l]) {
			t.Fatalf("layer %d of the step after adoption differs from the reference", l)
		}
	}
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}
