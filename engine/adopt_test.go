package engine

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// persistGrid is a CP = 2 grid of two persisting workers (one CP rank
// each) and an engine opened over them.
type persistGrid struct {
	t      *testing.T
	cfg    Config
	be     kernels.Backend
	dirs   []string
	trs    []collective.Transport
	locals []*worker.Local
	eng    *Engine
	// onWrite persists on every write (pagestore.SyncOnWrite) instead of
	// periodically.
	onWrite bool
}

func adoptConfig(be kernels.Backend) Config {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 4, 2, 8, 4
	cfg.CP, cfg.CapacityPages = 2, 64
	cfg.Policy.PageSize, cfg.Policy.BudgetTokens, cfg.Policy.DenseLayers = 4, 12, 1
	cfg.Backend, cfg.MemoryLimit = be, memlimit.NoLimit
	return cfg
}

// open builds the workers on dirs (periodic durability: nothing
// reaches the disk but what a test syncs) and the engine.
func (g *persistGrid) open(dirs []string) {
	g.t.Helper()
	g.dirs = dirs
	g.trs = collective.NewInprocGroup(g.cfg.CP)
	var hosts []Host
	g.locals = nil
	for cp := range g.cfg.CP {
		wc := g.cfg.WorkerConfig()
		wc.DataDir, wc.GridID = dirs[cp], "coord/1/1"
		wc.Durability, wc.SyncInterval = pagestore.SyncPeriodic, time.Hour
		if g.onWrite {
			wc.Durability = pagestore.SyncOnWrite
		}
		r := worker.Rank{CP: cp}
		l, err := worker.NewLocal(wc, []worker.RankSpec{{Rank: r, Backend: g.be, Transport: g.trs[cp]}})
		if err != nil {
			g.t.Fatal(err)
		}
		g.locals = append(g.locals, l)
		hosts = append(hosts, Host{Worker: l, Ranks: []worker.Rank{r}})
	}
	e, err := Open(g.cfg, hosts)
	if err != nil {
		g.t.Fatal(err)
	}
	g.eng = e
}

// close closes the engine, the workers (gracefully) and the transports.
func (g *persistGrid) close() {
	g.eng.Close()
	for _, l := range g.locals {
		l.Close()
	}
	for _, tr := range g.trs {
		tr.Close()
	}
}

// recovered returns the engine's Recovered sequences from the workers'
// reports, matched by (grid, seq), in increasing seq order.
func (g *persistGrid) recovered() []Recovered {
	by := map[uint64]*Recovered{}
	var ids []uint64
	for w, l := range g.locals {
		for _, s := range l.Recovery().Sequences {
			r := by[s.Seq]
			if r == nil {
				r = &Recovered{Seq: SeqID(s.Seq), Layout: s.Layout, Parts: make([]RecoveredPart, len(g.locals))}
				for i := range r.Parts {
					r.Parts[i].Missing = true
				}
				by[s.Seq] = r
				ids = append(ids, s.Seq)
			}
			r.Parts[w] = RecoveredPart{Key: s.Key, Recovered: decode.Recovered{Lens: s.Lens, Had: s.Had}}
		}
	}
	slices.Sort(ids)
	var out []Recovered
	for _, id := range ids {
		out = append(out, *by[id])
	}
	return out
}

func copyTree(t *testing.T, src, dst string) {
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

// TestAdoptAfterCrash: an engine over two persisting workers, a crash
// (the data directories as a kill -9 leaves them) after worker 0 synced
// more pages than worker 1, and a second sequence that only worker 0
// persisted. The engine opened over the restarted workers adopts the
// first (the smallest length over the workers, worker 0 rolled back,
// the lost tokens exact) and refuses the second, freeing it on worker
// 0. Re-appending the lost tokens gives steps equal, bit for bit, to an
// engine that never stopped; after a release every pool is empty.
func TestAdoptAfterCrash(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	ctx := context.Background()
	cfg := adoptConfig(be)
	live, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	g := &persistGrid{t: t, cfg: cfg, be: be}
	g.open([]string{t.TempDir(), t.TempDir()})
	rng := rand.New(rand.NewPCG(3, 3))
	const n = 30 // 7 full pages of 4 (0, 2, 4, 6 on rank 0) and 2 tokens on page 7 (rank 1)
	tok := cfg.KVRow()
	var k, v [][]float32
	for range cfg.Layers {
		k, v = append(k, randVec(rng, n*tok)), append(v, randVec(rng, n*tok))
	}
	a, err := g.eng.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := live.Create(plan.Striped)
	sync := func(cp int) {
		t.Helper()
		if err := g.locals[cp].Shard(worker.Rank{CP: cp}).Store().Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Worker 1 persists a's creation and its first 12 tokens (pages 1,
	// hence a global length of 12 as far as rank 1 knows: pages 0..2).
	for l := range cfg.Layers {
		for _, e := range []struct {
			e  *Engine
			id SeqID
		}{{g.eng, a}, {live, ref}} {
			if err := e.e.Append(e.id, l, k[l][:12*tok], v[l][:12*tok]); err != nil {
				t.Fatal(err)
			}
		}
	}
	sync(1)
	b, err := g.eng.Create(plan.Striped) // never persisted on worker 1
	if err != nil {
		t.Fatal(err)
	}
	for l := range cfg.Layers {
		if err := g.eng.Append(b, l, k[l][:8*tok], v[l][:8*tok]); err != nil {
			t.Fatal(err)
		}
		for _, e := range []struct {
			e  *Engine
			id SeqID
		}{{g.eng, a}, {live, ref}} {
			if err := e.e.Append(e.id, l, k[l][12*tok:], v[l][12*tok:]); err != nil {
				t.Fatal(err)
			}
		}
	}
	sync(0) // pages 0, 2, 4 and 6 of a on rank 0, and b
	crashed := []string{t.TempDir(), t.TempDir()}
	for w := range g.dirs {
		copyTree(t, g.dirs[w], crashed[w])
	}
	g.close()

	g.open(crashed)
	defer g.close()
	recs := g.recovered()
	if len(recs) != 2 || recs[0].Seq != a || recs[1].Seq != b {
		t.Fatalf("recovered %+v, want sequences %d and %d", recs, a, b)
	}
	if !recs[1].Parts[1].Missing {
		t.Fatalf("sequence %d recovered on worker 1: %+v", b, recs[1].Parts[1])
	}
	ad, err := g.eng.Adopt(ctx, recs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("adopted %+v from %+v", ad, recs[0].Parts)
	// Rank 1 holds page 1 (tokens 4..7) only: positions up to 12 are
	// what both ranks hold (rank 0 holds pages 0 and 2, and more).
	// Worker 0 holds 32 as far as its rank knows (its pages 0, 2, 4 and
	// 6: every position before page 8 it owns) and is rolled back; rank
	// 1's length record knows the 30 tokens.
	if want := []int{12, 12}; !slices.Equal(ad.Lens, want) || ad.Had != n || ad.LostTokens() != n-12 {
		t.Fatalf("adopted %+v, want lens %v, had %d, lost %d", ad, want, n, n-12)
	}
	if _, err := g.eng.Adopt(ctx, recs[1]); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("adopt a sequence worker 1 lost: %v, want ErrIncomplete", err)
	}
	for w, l := range g.locals {
		if p := l.Parked(); len(p) != 0 {
			t.Fatalf("worker %d: parked %v after the adoptions", w, p)
		}
	}
	if _, err := g.eng.Adopt(ctx, recs[0]); err == nil {
		t.Fatal("adopting a sequence twice succeeded")
	}
	if got, _ := g.eng.Len(a); got != 12 {
		t.Fatalf("adopted length %d, want 12", got)
	}
	// The lost tokens again, then steps on both.
	for l := range cfg.Layers {
		if err := g.eng.Append(a, l, k[l][12*tok:], v[l][12*tok:]); err != nil {
			t.Fatal(err)
		}
	}
	// Later ids do not collide with the adopted one.
	c, err := g.eng.Create(plan.Striped)
	if err != nil || c <= a {
		t.Fatalf("create after adoption: id %d (%v), want one after %d", c, err, a)
	}
	for step := range 3 {
		for l := range cfg.Layers {
			q, nk, nv := randVec(rng, cfg.QHeads*cfg.HeadDim), randVec(rng, tok), randVec(rng, tok)
			var got, want Result
			if err := g.eng.Step(ctx, l, []Request{{Seq: a, Q: q, K: nk, V: nv}}, StepOptions{}, &got); err != nil {
				t.Fatal(err)
			}
			if err := live.Step(ctx, l, []Request{{Seq: ref, Q: q, K: nk, V: nv}}, StepOptions{}, &want); err != nil {
				t.Fatal(err)
			}
			if !bitsEqual(got.O, want.O) || !bitsEqual(got.LSE, want.LSE) {
				t.Fatalf("step %d layer %d: outputs after adoption differ from the engine that never stopped", step, l)
			}
		}
	}
	for _, id := range []SeqID{a, c} {
		if err := g.eng.Release(id); err != nil {
			t.Fatal(err)
		}
	}
	for w, l := range g.locals {
		if u := l.Shard(worker.Rank{CP: w}).Store().Stats().UsedPages; u != 0 {
			t.Fatalf("worker %d: %d pages in use after the release", w, u)
		}
	}
}

// TestAdoptBadInput: parts that do not fit the engine change nothing.
func TestAdoptBadInput(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	cfg := adoptConfig(be)
	g := &persistGrid{t: t, cfg: cfg, be: be}
	g.open([]string{t.TempDir(), t.TempDir()})
	defer g.close()
	ctx := context.Background()
	lay := plan.Layout{CP: 2, TP: 1, Placement: plan.Striped, BlockPages: cfg.BlockPages}
	part := RecoveredPart{Key: 1, Recovered: decode.Recovered{Lens: []int{4, 4}, Had: 4}}
	for _, r := range []Recovered{
		{Seq: 1, Layout: lay, Parts: []RecoveredPart{part}},
		{Seq: 0, Layout: lay, Parts: []RecoveredPart{part, part}},
	} {
		if _, err := g.eng.Adopt(ctx, r); !errors.Is(err, ErrBadInput) {
			t.Errorf("adopt %+v: %v, want ErrBadInput", r, err)
		}
	}
	bad := lay
	bad.CP = 3
	if _, err := g.eng.Adopt(ctx, Recovered{Seq: 1, Layout: bad, Parts: []RecoveredPart{part, part}}); !errors.Is(err, ErrIncomplete) {
		t.Errorf("adopt with another grid's layout: %v, want ErrIncomplete", err)
	}
	// Keys no worker knows: the claim fails, nothing is adopted.
	if _, err := g.eng.Adopt(ctx, Recovered{Seq: 1, Layout: lay, Parts: []RecoveredPart{part, part}}); !errors.Is(err, worker.ErrUnknownSequence) {
		t.Errorf("adopt unknown keys: %v, want worker.ErrUnknownSequence", err)
	}
	if _, err := g.eng.Len(1); !errors.Is(err, ErrUnknownSequence) {
		t.Errorf("after failed adoptions: Len(1) = %v, want ErrUnknownSequence", err)
	}
	if err := g.eng.DropRecovered(ctx, 2, 1); !errors.Is(err, ErrBadInput) {
		t.Errorf("drop recovered on worker 2 of 2: %v, want ErrBadInput", err)
	}
	if err := g.eng.DropRecovered(ctx, 0, 1); !errors.Is(err, worker.ErrUnknownSequence) {
		t.Errorf("drop an unknown recovered key: %v, want worker.ErrUnknownSequence", err)
	}
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestAgreeLostExact: a layer's loss is exact when a worker that knows
// the layer's length at the stop exactly reports the largest one, and an
// upper bound when a worker's estimate (its longest layer's length)
// exceeds every exact one, or when no worker says.
func TestAgreeLostExact(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	cfg := adoptConfig(be)
	g := &persistGrid{t: t, cfg: cfg, be: be}
	g.open([]string{t.TempDir(), t.TempDir()})
	defer g.close()
	lay := plan.Layout{CP: 2, TP: 1, Placement: plan.Striped, BlockPages: cfg.BlockPages}
	// Page size 4, striped over 2 ranks: both hold pages 0..3 (tokens
	// 0..15) of the 16 recovered. Worker 0 survived the step at length
	// 20 that reached layer 0 only (exact: 21 and 20); worker 1 was
	// killed and estimates both layers from its longest (21).
	survived := RecoveredPart{Key: 1, Recovered: decode.Recovered{Lens: []int{16, 16}, Had: 21, HadLens: []int{21, 20}, HadExact: []bool{true, true}}}
	killed := RecoveredPart{Key: 2, Recovered: decode.Recovered{Lens: []int{16, 16}, Had: 21, HadLens: []int{21, 21}, HadExact: []bool{false, false}}}
	silent := killed
	silent.HadExact = nil
	noLens := survived
	noLens.HadLens, noLens.HadExact = nil, nil
	for _, tc := range []struct {
		name  string
		parts []RecoveredPart
		lost  []int
		exact []bool
	}{
		{"survivor and killed", []RecoveredPart{survived, killed}, []int{5, 5}, []bool{true, false}},
		{"killed first", []RecoveredPart{killed, survived}, []int{5, 5}, []bool{true, false}},
		{"a worker that does not say", []RecoveredPart{survived, silent}, []int{5, 5}, []bool{true, false}},
		{"both killed", []RecoveredPart{killed, killed}, []int{5, 5}, []bool{false, false}},
		{"both exact", []RecoveredPart{survived, survived}, []int{5, 4}, []bool{true, true}},
		{"no lengths per layer", []RecoveredPart{noLens, survived}, []int{5, 5}, []bool{false, false}},
	} {
		a, err := g.eng.agree(Recovered{Seq: 1, Layout: lay, Parts: tc.parts})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(a.Lens, []int{16, 16}) || !slices.Equal(a.Lost(), tc.lost) || !slices.Equal(a.LostExact(), tc.exact) {
			t.Errorf("%s: lens %v, lost %v, exact %v; want [16 16], %v, %v", tc.name, a.Lens, a.Lost(), a.LostExact(), tc.lost, tc.exact)
		}
	}
	bad := survived
	bad.HadExact = []bool{true}
	if _, err := g.eng.agree(Recovered{Seq: 1, Layout: lay, Parts: []RecoveredPart{bad, killed}}); !errors.Is(err, ErrIncomplete) {
		t.Errorf("one exact flag for 2 layers: %v, want ErrIncomplete", err)
	}
}
