package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// reopen closes g's workers (gracefully: persisting workers persist every
// sequence) and builds them again on new transports, worker w persisting
// in dirs[w] ("" for none).
func (g *grid) reopen(dirs []string) {
	g.t.Helper()
	for _, w := range g.workers {
		g.must(w.(*Local).Close())
	}
	for _, tr := range g.trs {
		tr.Close()
	}
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	g.t.Cleanup(func() { be.Close() })
	g.trs = collective.NewInprocGroup(g.cfg.CP)
	specs := make([][]RankSpec, len(g.workers))
	for cp := range g.cfg.CP {
		w := g.host[cp]
		specs[w] = append(specs[w], RankSpec{Rank: Rank{CP: cp}, Backend: be, Transport: g.trs[cp]})
	}
	for w := range g.workers {
		cfg := g.cfg
		cfg.DataDir = dirs[w]
		l, err := NewLocal(cfg, specs[w])
		g.must(err)
		g.t.Cleanup(func() { l.Close() })
		g.workers[w] = l
	}
}

// summaries returns every hosted rank's summary records of the pages of
// seqs, every layer and KV head, as float32 bits.
func (g *grid) summaries(seqs ...uint64) []uint32 {
	g.t.Helper()
	var out []uint32
	for _, w := range g.workers {
		l := w.(*Local)
		for _, r := range l.Ranks() {
			st := l.Shard(r).Store()
			for _, id := range seqs {
				sid, err := l.StoreSeq(id, r)
				g.must(err)
				table, err := st.AppendPageTable(nil, sid)
				g.must(err)
				out = append(out, uint32(len(table)))
				for layer := range g.cfg.Layers {
					for _, p := range table {
						for h := range g.cfg.KVHeadsPerRank() {
							mn, mx := st.PageSummary(layer, int(p), h)
							for _, x := range append(append([]float32(nil), mn...), mx...) {
								out = append(out, math.Float32bits(x))
							}
						}
					}
				}
			}
		}
	}
	return out
}

func equalBits(a, b []float32) bool {
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

// TestPersistRestart: persisting workers (their ranks on one worker or
// one each) take creates, appends that seal and fill pages, decode steps
// with new tokens, a fork that shares pages, a rollback and a release;
// they close gracefully and open again on the same directories. Every
// sequence comes back (parked, then claimed under its id) with its
// lengths in every layer, no lost tokens, the same summary records bit
// for bit and the same pages in use (the fork's sharing kept), and the
// next steps give the same outputs, bit for bit, as a grid of the same
// workers that never stopped, fed the same data. On f32 and fp8 pages;
// the fp8 grid with offload too (recovered pages come back into the
// device pool from the tier). Also with pagestore.VerifyOnRead (the
// pages read at first use, the summaries from the persisted records):
// the same, and the open read no page payload.
func TestPersistRestart(t *testing.T) {
	for _, tc := range []struct {
		split  bool
		dt     plan.DType
		budget int
		verify pagestore.Verify
	}{{false, plan.Float32, 0, pagestore.VerifyAtOpen}, {true, plan.Float32, 0, pagestore.VerifyAtOpen}, {false, plan.FP8, 0, pagestore.VerifyAtOpen}, {true, plan.FP8, 20, pagestore.VerifyAtOpen},
		{false, plan.Float32, 0, pagestore.VerifyOnRead}, {true, plan.Float32, 0, pagestore.VerifyOnRead}, {true, plan.FP8, 20, pagestore.VerifyOnRead}} {
		split := tc.split
		t.Run(fmt.Sprintf("split%v_%v_budget%d_verify-%v", split, tc.dt, tc.budget, tc.verify), func(t *testing.T) {
			cfg := testConfig(Exact)
			cfg.DType, cfg.DeviceBudgetPages = tc.dt, tc.budget
			cfg.Verify, cfg.ScrubRate = tc.verify, -1
			g, live := newGrid(t, cfg, split), newGrid(t, cfg, split)
			var dirs []string
			for range g.workers {
				dirs = append(dirs, t.TempDir())
			}
			g.reopen(dirs)
			rg, rl := rand.New(rand.NewPCG(3, 5)), rand.New(rand.NewPCG(3, 5))
			both := func(f func(g *grid, rng *rand.Rand)) { f(g, rg); f(live, rl) }
			both(func(g *grid, rng *rand.Rand) {
				g.create(1, plan.Striped)
				g.create(2, plan.Contiguous)
				g.create(3, plan.Striped)
				g.appendAll(rng, 1, 300)
				g.appendAll(rng, 2, 17)
				g.appendAll(rng, 3, 32)
				g.stepAndCompare(rng, []uint64{1, 2, 3}, []int{64, 0, 32}, 0, 2, true)
				g.fork(1, 4)
				g.appendAll(rng, 4, 5)
				g.rollback(2, 3)
				g.release(3)
			})
			ids := []uint64{1, 2, 4}
			sums := g.summaries(ids...)
			used := g.snapshotPages()
			g.reopen(dirs)

			// Each worker knows its own ranks: the lengths all of them
			// agree on are the smallest, the length before the stop the
			// largest.
			lens, had := map[uint64]int{}, map[uint64]int{}
			for _, wk := range g.workers {
				for _, r := range wk.(*Local).Recovery().Sequences {
					if n, ok := lens[r.Seq]; !ok || maxLen(wk.(*Local), r) < n {
						lens[r.Seq] = maxLen(wk.(*Local), r)
					}
					had[r.Seq] = max(had[r.Seq], r.Had)
				}
			}
			for _, id := range ids {
				if lens[id] != g.lens[id] || had[id] != g.lens[id] {
					t.Fatalf("sequence %d: recovered %d tokens of %d, want %d of %d", id, lens[id], had[id], g.lens[id], g.lens[id])
				}
			}
			for w, wk := range g.workers {
				l := wk.(*Local)
				rep := l.Recovery()
				if rep.Dir != dirs[w] || len(rep.Damaged) != 0 || rep.OrphanSeqs != 0 || rep.CorruptSlots() != 0 {
					t.Fatalf("worker %d: recovery %+v", w, rep)
				}
				if len(rep.Sequences) != len(ids) {
					t.Fatalf("worker %d: recovered %d sequences, want %d: %+v", w, len(rep.Sequences), len(ids), rep.Sequences)
				}
				for _, r := range l.Ranks() {
					st := l.Shard(r).Store()
					sr, sc := st.Recovery(), st.Scrub()
					if lazy := tc.verify == pagestore.VerifyOnRead; lazy != (sr.PayloadBytesRead == 0) || lazy != (sr.Pending == sr.Pages && sr.Pages > 0) {
						t.Fatalf("worker %d rank %v, verify %v: the open read %d payload bytes, %d of %d pages pending", w, r, tc.verify, sr.PayloadBytesRead, sr.Pending, sr.Pages)
					}
					// Nor did the worker's recovery (the sequences'
					// lengths, the cuts) read a page since.
					if tc.verify == pagestore.VerifyOnRead && (sc.BytesRead != 0 || sc.Pending != sr.Pending) {
						t.Fatalf("worker %d rank %v: the worker's recovery read %d payload bytes, %d of %d pages pending", w, r, sc.BytesRead, sc.Pending, sr.Pending)
					}
				}
				for i, r := range rep.Sequences {
					if r.Seq != ids[i] || r.LostTokens() != 0 || r.Layout != g.layouts[r.Seq] {
						t.Fatalf("worker %d: recovered %+v, want sequence %d, layout %+v, no lost tokens", w, r, ids[i], g.layouts[ids[i]])
					}
					// A worker reports the end of its own tokens (never
					// past the length), consistent with the length.
					bound := MaxLens(r.Layout, cfg.PageSize, l.Ranks(), r.Lens)
					for layer, n := range r.Lens {
						if n > g.lens[r.Seq] || bound[layer] < g.lens[r.Seq] || !split && n != g.lens[r.Seq] {
							t.Fatalf("worker %d: sequence %d layer %d recovered %d tokens (consistent up to %d), want %d", w, r.Seq, layer, n, bound[layer], g.lens[r.Seq])
						}
					}
					if err := l.Create(context.Background(), CreateRequest{Seq: r.Seq, Layout: r.Layout}); err != nil {
						t.Fatalf("a parked sequence must not hold its id: create %d: %v", r.Seq, err)
					}
					g.must(l.Release(context.Background(), ReleaseRequest{Seq: r.Seq}))
					if err := l.Append(context.Background(), AppendRequest{Seq: r.Seq}); !errors.Is(err, ErrUnknownSequence) {
						t.Fatalf("append to parked sequence %d: %v, want ErrUnknownSequence", r.Seq, err)
					}
					g.must(l.Claim(context.Background(), r.Key, r.Seq))
				}
				if err := l.Claim(context.Background(), rep.Sequences[0].Key, 99); !errors.Is(err, ErrUnknownSequence) {
					t.Fatalf("second claim: %v, want ErrUnknownSequence", err)
				}
			}
			if got := g.summaries(ids...); fmt.Sprint(got) != fmt.Sprint(sums) {
				t.Fatal("summary records differ after the restart")
			}
			if got := g.snapshotPages(); fmt.Sprint(got) != fmt.Sprint(used) {
				t.Fatalf("pages in use %v after the restart, %v before", got, used)
			}
			step := func(ids []uint64, budgets []int, first, layers int, fresh bool) {
				t.Helper()
				a := g.stepAndCompare(rg, ids, budgets, first, layers, fresh)
				b := live.stepAndCompare(rl, ids, budgets, first, layers, fresh)
				if !equalBits(a, b) {
					t.Fatalf("step over %v: outputs differ from the grid that never stopped", ids)
				}
			}
			step(ids, []int{64, 16, 48}, 0, 2, true)
			step(ids, []int{32, 0, 64}, 1, 1, false)
			both(func(g *grid, rng *rand.Rand) { g.appendAll(rng, 4, 40) })
			step([]uint64{4, 1}, []int{64, 64}, 0, 2, true)

			// A restart after the restart: the claimed sequences are in
			// the table under their ids.
			g.reopen(dirs)
			for _, wk := range g.workers {
				l := wk.(*Local)
				for _, r := range l.Recovery().Sequences {
					if r.Lens[0] > g.lens[r.Seq] || maxLen(l, r) < g.lens[r.Seq] || r.Had > g.lens[r.Seq] || r.LostTokens() != 0 {
						t.Fatalf("second restart: sequence %d has %d tokens, want %d", r.Seq, r.Lens[0], g.lens[r.Seq])
					}
					g.must(l.Claim(context.Background(), r.Key, r.Seq))
				}
			}
			step(ids, []int{48, 48, 48}, 0, 2, true)
			if tc.budget > 0 {
				for _, wk := range g.workers {
					l := wk.(*Local)
					for _, r := range l.Ranks() {
						if st := l.Shard(r).OffloadStats(); st.Misses == 0 || st.MultiPass != 0 {
							t.Fatalf("rank %v: recalls of recovered pages not exercised, or several passes: %+v", r, st)
						}
					}
				}
			}
		})
	}
}

// snapshotPages returns each hosted rank's pages in use.
func (g *grid) snapshotPages() []int {
	var out []int
	for _, w := range g.workers {
		l := w.(*Local)
		for _, r := range l.Ranks() {
			out = append(out, l.Shard(r).Store().Stats().UsedPages)
		}
	}
	return out
}

// TestPersistInUse: a second worker on an open data directory is refused
// with pagestore.ErrInUse and an error naming the directory; a worker
// for other ranks or another geometry is refused with ErrInvalidConfig.
func TestPersistInUse(t *testing.T) {
	cfg := testConfig(Exact)
	cfg.CP = 1
	cfg.DataDir = t.TempDir()
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer be.Close()
	spec := func() []RankSpec {
		tr := collective.NewInprocGroup(1)
		t.Cleanup(func() { tr[0].Close() })
		return []RankSpec{{Rank: Rank{}, Backend: be, Transport: tr[0]}}
	}
	l, err := NewLocal(cfg, spec())
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewLocal(cfg, spec())
	if !errors.Is(err, pagestore.ErrInUse) || !strings.Contains(err.Error(), cfg.DataDir) {
		t.Fatalf("second open: %v, want ErrInUse naming %s", err, cfg.DataDir)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.HeadDim = 32
	if _, err := NewLocal(other, spec()); !errors.Is(err, pagestore.ErrInvalidConfig) {
		t.Fatalf("another geometry: %v, want ErrInvalidConfig", err)
	}
	l, err = NewLocal(cfg, spec())
	if err != nil {
		t.Fatalf("open again after the refusals: %v", err)
	}
	g := cfg
	g.Mode = Replicated
	if err := g.Validate(); err == nil {
		t.Fatal("replicated selection with a data dir: no error")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPersistOrphansAndDamage: store sequences no table entry names are
// released at recovery (counted as orphans, their pages freed), and a
// table entry whose store sequence is gone is reported damaged, deleted,
// and does not stop the others from coming back.
func TestPersistOrphansAndDamage(t *testing.T) {
	cfg := testConfig(Exact)
	cfg.CP = 1
	cfg.DataDir = t.TempDir()
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer be.Close()
	open := func() *Local {
		tr := collective.NewInprocGroup(1)
		t.Cleanup(func() { tr[0].Close() })
		l, err := NewLocal(cfg, []RankSpec{{Rank: Rank{}, Backend: be, Transport: tr[0]}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	l := open()
	lay := plan.Layout{CP: 1, TP: 1}
	tok := cfg.KVHeads * cfg.HeadDim
	for seq := uint64(1); seq <= 3; seq++ {
		if err := l.Create(ctx, CreateRequest{Seq: seq, Layout: lay}); err != nil {
			t.Fatal(err)
		}
		for layer := range cfg.Layers {
			n := 16 * int(seq)
			if err := l.Append(ctx, AppendRequest{Seq: seq, Layer: layer, Tokens: n, K: randVec(rng, n*tok), V: randVec(rng, n*tok)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	keys := map[uint64]uint64{}
	for seq := uint64(1); seq <= 3; seq++ {
		keys[seq] = l.seqs[seq].key
	}
	l.Close()
	// Drop sequence 2's entry (an orphan, as after a crash between the
	// stores' create and the table's commit) and make sequence 3's name
	// a store sequence that does not exist.
	db, err := bolt.Open(filepath.Join(cfg.DataDir, tableName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bkWorkerSeqs)
		if err := b.Delete(entryKey(keys[2])); err != nil {
			return err
		}
		v := strings.Replace(string(b.Get(entryKey(keys[3]))), `"store":3`, `"store":77`, 1)
		return b.Put(entryKey(keys[3]), []byte(v))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	l = open()
	defer l.Close()
	rep := l.Recovery()
	if len(rep.Sequences) != 1 || rep.Sequences[0].Seq != 1 || rep.Sequences[0].Len() != 16 {
		t.Fatalf("recovered %+v, want sequence 1 with 16 tokens", rep.Sequences)
	}
	if len(rep.Damaged) != 1 || rep.Damaged[0].Seq != 3 || !strings.Contains(rep.Damaged[0].Err.Error(), "not persisted") {
		t.Fatalf("damaged %+v, want sequence 3 (store sequence 77 not persisted)", rep.Damaged)
	}
	// Sequences 2 and 3's store sequences, named by no entry now, were
	// released: only sequence 1's page is in use.
	if rep.OrphanSeqs != 2 || l.Shard(Rank{}).Store().Stats().UsedPages != 1 {
		t.Fatalf("orphans %d, pages in use %d; want 2 and 1", rep.OrphanSeqs, l.Shard(Rank{}).Store().Stats().UsedPages)
	}
}

// TestGlobalLengths checks the length arithmetic of recovery against
// brute force: globalMax(k) is the longest global length of which a rank
// owns at most k tokens, globalEnd(k) the shortest of which it owns k.
func TestGlobalLengths(t *testing.T) {
	const S = 4
	for _, p := range []plan.Place{{}, {Ranks: 2, Rank: 0, Block: 1}, {Ranks: 2, Rank: 1, Block: 1}, {Ranks: 3, Rank: 2, Block: 2}, {Ranks: 3, Rank: 0, Block: 3}} {
		for k := range 40 {
			mx, end := -1, -1
			for n := range 1000 {
				o := owned(p, S, n)
				if o <= k {
					mx = n
				}
				if o == k && end < 0 {
					end = n
				}
			}
			if got := globalMax(p, S, k); got != mx {
				t.Fatalf("%+v: globalMax(%d) = %d, want %d", p, k, got, mx)
			}
			if got := globalEnd(p, S, k); got != end {
				t.Fatalf("%+v: globalEnd(%d) = %d, want %d", p, k, got, end)
			}
		}
	}
}

// copyDir copies the files under src to dst: what a kill -9 of the
// process leaves on disk, taken while the workers are quiet (every
// write of theirs is a completed system call).
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

// appendData appends the given tokens (per layer, n tokens of all KV
// heads) to one sequence of g's workers, from position g.lens[id], as
// appendAll does; with ref it feeds the reference shard too.
func (g *grid) appendData(id uint64, n int, k, v [][]float32, ref bool) {
	g.t.Helper()
	c, ctx := g.cfg, context.Background()
	tok := c.KVHeads * c.HeadDim
	start := g.lens[id]
	lay := g.layouts[id]
	for layer := range c.Layers {
		for _, w := range g.workers {
			g.must(w.Check(ctx, CheckRequest{Seq: id, Layer: layer, Len: start, Append: n}))
		}
		for t0 := 0; t0 < n; {
			p := (start + t0) / c.PageSize
			t1 := min(n, (p+1)*c.PageSize-start)
			cp := lay.Owner(p)
			g.must(g.worker(cp).Append(ctx, AppendRequest{Seq: id, Rank: Rank{CP: cp}, Layer: layer, Start: start + t0, Tokens: t1 - t0,
				K: k[layer][t0*tok : t1*tok], V: v[layer][t0*tok : t1*tok]}))
			t0 = t1
		}
		if ref {
			g.must(g.ref.Append(g.refIDs[id], layer, k[layer], v[layer]))
		}
	}
	g.lens[id] += n
}

// TestPersistCrash: periodic durability, and a crash (the data
// directories as a kill -9 leaves them) after rank 0 flushed its sealed
// pages and rank 1 had flushed only the sequence's creation: rank 0
// holds pages rank 1 lost, so recovery (on one worker: its own
// reconciliation; on two: the coordinator's Rollback of the worker that
// holds more) brings both ranks back to the longest length they share,
// and reports the tokens lost since, exactly. Re-appending those tokens
// gives a grid whose next steps match, bit for bit, a grid that never
// stopped.
func TestPersistCrash(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("split%v", split), func(t *testing.T) {
			ctx := context.Background()
			cfg := testConfig(Exact)
			cfg.Durability, cfg.SyncInterval = pagestore.SyncPeriodic, time.Hour
			g, live := newGrid(t, cfg, split), newGrid(t, cfg, split)
			var dirs, crashed []string
			for range g.workers {
				dirs, crashed = append(dirs, t.TempDir()), append(crashed, t.TempDir())
			}
			g.reopen(dirs)
			rng := rand.New(rand.NewPCG(8, 8))
			const n = 100 // 6 full pages of 16 and 4 tokens on page 6 (rank 0)
			tok := cfg.KVHeads * cfg.HeadDim
			var k, v [][]float32
			for range cfg.Layers {
				k, v = append(k, randVec(rng, n*tok)), append(v, randVec(rng, n*tok))
			}
			for _, x := range []*grid{g, live} {
				x.create(1, plan.Striped)
			}
			rank := func(g *grid, cp int) *Local { return g.worker(cp).(*Local) }
			g.must(rank(g, 1).Shard(Rank{CP: 1}).Store().Sync(ctx)) // the creation, on rank 1
			for _, x := range []*grid{g, live} {
				x.appendData(1, n, k, v, true)
			}
			g.must(rank(g, 0).Shard(Rank{CP: 0}).Store().Sync(ctx)) // pages 0, 2 and 4, on rank 0
			for w := range g.workers {
				copyDir(t, dirs[w], crashed[w])
			}
			g.reopen(crashed)

			// Rank 1 kept nothing: 16 tokens (page 0, on rank 0) are
			// what both hold; rank 0 had 52 tokens (up to position
			// 100), rank 1 48 (up to 96).
			lens, had := -1, 0
			for _, wk := range g.workers {
				rep := wk.(*Local).Recovery()
				if len(rep.Sequences) != 1 || len(rep.Damaged) != 0 {
					t.Fatalf("recovery %+v", rep)
				}
				r := rep.Sequences[0]
				if m := maxLen(wk.(*Local), r); lens < 0 || m < lens {
					lens = m
				}
				had = max(had, r.Had)
			}
			if lens != 16 || had != n {
				t.Fatalf("recovered %d tokens of %d, want 16 of %d", lens, had, n)
			}
			for _, wk := range g.workers {
				l := wk.(*Local)
				r := l.Recovery().Sequences[0]
				g.must(l.Claim(ctx, r.Key, 1))
				if !split && r.LostTokens() != n-16 {
					t.Fatalf("lost %d tokens, want %d", r.LostTokens(), n-16)
				}
				// Each worker reports the end of the tokens it holds:
				// split, rank 0 holds pages 0, 2 and 4 (up to 80),
				// rank 1 none; together, 16.
				want := 16
				if split {
					want = map[bool]int{true: 80, false: 0}[l == rank(g, 0)]
				}
				if r.Len() != want {
					t.Fatalf("a worker recovered %d tokens, want %d", r.Len(), want)
				}
				if r.Len() > lens { // the coordinator's part: roll back to the common length
					for _, rk := range l.Ranks() {
						_, err := l.Rollback(ctx, RollbackRequest{Seq: 1, Rank: rk, Len: r.Len(), Drop: r.Len() - lens})
						g.must(err)
					}
				}
			}
			g.lens[1] = lens
			if got, err := rank(g, 0).Shard(Rank{CP: 0}).Store().Len(mustStoreSeq(t, rank(g, 0), 1, Rank{CP: 0})); err != nil || got != 16 {
				t.Fatalf("rank 0 holds %d tokens (%v), want 16 (it had 48 sealed)", got, err)
			}
			for _, w := range g.workers {
				g.must(w.Check(ctx, CheckRequest{Seq: 1, Layer: 0, Len: lens, Append: 1}))
			}
			// Re-append the lost tokens: the grid is the one that never
			// stopped again.
			var kl, vl [][]float32
			for layer := range cfg.Layers {
				kl, vl = append(kl, k[layer][lens*tok:]), append(vl, v[layer][lens*tok:])
			}
			g.appendData(1, n-lens, kl, vl, false)
			rg, rl := rand.New(rand.NewPCG(1, 1)), rand.New(rand.NewPCG(1, 1))
			for _, b := range [][]int{{64}, {32}, {128}} {
				a := g.stepAndCompare(rg, []uint64{1}, b, 0, 2, true)
				w := live.stepAndCompare(rl, []uint64{1}, b, 0, 2, true)
				if !equalBits(a, w) {
					t.Fatalf("budget %v: outputs after the crash and the re-append differ from the grid that never stopped", b)
				}
			}
		})
	}
}

func mustStoreSeq(t *testing.T, l *Local, seq uint64, r Rank) pagestore.SeqID {
	t.Helper()
	id, err := l.StoreSeq(seq, r)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// maxLen is the longest global length the tokens that worker l
// recovered of r are consistent with (what a coordinator takes the
// smallest of over its workers).
func maxLen(l *Local, r RecoveredSeq) int {
	return slices.Min(MaxLens(r.Layout, l.Config().PageSize, l.Ranks(), r.Lens))
}

// TestPersistVerifyOnReadDamage: a persisting worker with
// pagestore.VerifyOnRead whose slab bytes are flipped after a graceful
// close opens without reading a payload and recovers every sequence
// (the damage is not seen yet); the first append to a damaged
// sequence returns an error wrapping pagestore.ErrDamaged and
// tier.ErrCorrupt, and so does every later one. With VerifyAtOpen the
// same directory's damage is found at open instead.
func TestPersistVerifyOnReadDamage(t *testing.T) {
	cfg := testConfig(Exact)
	cfg.CP, cfg.Verify, cfg.ScrubRate = 1, pagestore.VerifyOnRead, -1
	cfg.DataDir = t.TempDir()
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer be.Close()
	open := func(c Config) *Local {
		tr := collective.NewInprocGroup(1)
		t.Cleanup(func() { tr[0].Close() })
		l, err := NewLocal(c, []RankSpec{{Rank: Rank{}, Backend: be, Transport: tr[0]}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(4, 4))
	l := open(cfg)
	tok := cfg.KVHeads * cfg.HeadDim
	for seq := uint64(1); seq <= 2; seq++ {
		if err := l.Create(ctx, CreateRequest{Seq: seq, Layout: plan.Layout{CP: 1, TP: 1}}); err != nil {
			t.Fatal(err)
		}
		for layer := range cfg.Layers {
			if err := l.Append(ctx, AppendRequest{Seq: seq, Layer: layer, Tokens: 40, K: randVec(rng, 40*tok), V: randVec(rng, 40*tok)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Flip one byte in every slot of the rank's slab.
	slab := filepath.Join(RankDir(cfg.DataDir, Rank{}), "slab-000000")
	b, err := os.ReadFile(slab)
	if err != nil {
		t.Fatal(err)
	}
	slot := (cfg.Store().PayloadBytes() + 4095) / 4096 * 4096
	for off := 5; off < len(b); off += slot {
		b[off] ^= 0x40
	}
	if err := os.WriteFile(slab, b, 0o600); err != nil {
		t.Fatal(err)
	}
	l = open(cfg)
	rep := l.Recovery()
	if len(rep.Sequences) != 2 || len(rep.Damaged) != 0 {
		t.Fatalf("lazy open of damaged slabs: recovered %+v, damaged %+v; want both, none damaged yet", rep.Sequences, rep.Damaged)
	}
	st := l.Shard(Rank{}).Store()
	if sr := st.Recovery(); sr.PayloadBytesRead != 0 || sr.Pending == 0 {
		t.Fatalf("lazy open read %d payload bytes, %d pages pending", sr.PayloadBytesRead, sr.Pending)
	}
	for _, r := range rep.Sequences {
		if err := l.Claim(ctx, r.Key, r.Seq); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		err := l.Append(ctx, AppendRequest{Seq: 1, Layer: 0, Start: 40, Tokens: 1, K: randVec(rng, tok), V: randVec(rng, tok)})
		if !errors.Is(err, pagestore.ErrDamaged) || !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("append to damaged sequence 1: %v, want ErrDamaged and tier.ErrCorrupt", err)
		}
	}
	l.Close()

	// The same damage, verified at open: found there for sequence 2.
	// Sequence 1 was dropped when its damage was found: its tombstone
	// says so, with the checksum's failure as the reason.
	cfg.Verify = pagestore.VerifyAtOpen
	l = open(cfg)
	defer l.Close()
	rep = l.Recovery()
	if len(rep.Sequences) != 0 || len(rep.Damaged) != 2 || rep.Damaged[0].Seq != 1 || rep.Damaged[1].Seq != 2 || !errors.Is(rep.Damaged[1].Err, tier.ErrCorrupt) {
		t.Fatalf("open verifying at open: recovered %+v, damaged %+v; want both damaged, 2 corrupt", rep.Sequences, rep.Damaged)
	}
	if e := rep.Damaged[0].Err; !errors.Is(e, pagestore.ErrDamaged) || !strings.Contains(e.Error(), "checksum") || strings.Contains(e.Error(), "not persisted") {
		t.Fatalf("sequence 1 damaged after the earlier open: %v, want ErrDamaged with its checksum failure", e)
	}
}

// flipKeys flips one bit of the slab bytes that hold k (a token's keys,
// as appended: float32) in rank r's slab of a worker data directory,
// and fails unless they appear exactly once.
func flipKeys(t *testing.T, dir string, r Rank, k []float32) {
	t.Helper()
	slab := filepath.Join(RankDir(dir, r), "slab-000000")
	b, err := os.ReadFile(slab)
	if err != nil {
		t.Fatal(err)
	}
	pat := make([]byte, 0, 4*len(k))
	for _, x := range k {
		pat = binary.LittleEndian.AppendUint32(pat, math.Float32bits(x))
	}
	i := bytes.Index(b, pat)
	if i < 0 || bytes.Index(b[i+1:], pat) >= 0 {
		t.Fatalf("keys found at %d in %s (and again: %v)", i, slab, i >= 0)
	}
	b[i+1] ^= 0x40
	if err := os.WriteFile(slab, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// seqKeys reads every page's keys of seq, layer by layer, on rank r.
func seqKeys(t *testing.T, l *Local, seq uint64, r Rank, pages int) [][]float32 {
	t.Helper()
	var out [][]float32
	for layer := range l.Config().Layers {
		var rep KeysReply
		if err := l.Keys(context.Background(), KeysRequest{Seq: seq, Rank: r, Layer: layer, From: 0, Count: pages}, &rep); err != nil {
			t.Fatalf("keys of sequence %d layer %d: %v", seq, layer, err)
		}
		out = append(out, slices.Clone(rep.K))
	}
	return out
}

// TestPersistDamagedDropped: with pagestore.VerifyOnRead, a sequence
// whose page fails its check after the open is dropped by the worker:
// from its table (a tombstone naming the failure), from the live
// sequences (every later call fails with pagestore.ErrDamaged) or the
// parked ones (found by the scrub: Claim fails so, Parked omits it).
// The next open reports it damaged with the check's failure as the
// reason (not "store sequence N was not persisted"), and the undamaged
// sequences' keys read back bit for bit after every open. Release and
// DropRecovered forget a dropped sequence and its tombstone.
func TestPersistDamagedDropped(t *testing.T) {
	cfg := testConfig(Exact)
	cfg.CP, cfg.Verify, cfg.ScrubRate = 1, pagestore.VerifyOnRead, -1
	cfg.DataDir = t.TempDir()
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer be.Close()
	open := func(c Config) *Local {
		tr := collective.NewInprocGroup(1)
		t.Cleanup(func() { tr[0].Close() })
		l, err := NewLocal(c, []RankSpec{{Rank: Rank{}, Backend: be, Transport: tr[0]}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 5))
	tok := cfg.KVHeads * cfg.HeadDim
	const n, pages = 40, 3 // 40 tokens: two full pages of 16 and a tail
	l := open(cfg)
	first := map[uint64][]float32{} // each sequence's first token's keys in layer 0, head 0
	for seq := uint64(1); seq <= 5; seq++ {
		if err := l.Create(ctx, CreateRequest{Seq: seq, Layout: plan.Layout{CP: 1, TP: 1}}); err != nil {
			t.Fatal(err)
		}
		for layer := range cfg.Layers {
			k := randVec(rng, n*tok)
			if layer == 0 {
				first[seq] = k[:cfg.HeadDim] // head 0 (a page holds each head's tokens together)
			}
			if err := l.Append(ctx, AppendRequest{Seq: seq, Layer: layer, Tokens: n, K: k, V: randVec(rng, n*tok)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[uint64][][]float32{}
	for _, seq := range []uint64{2, 4} {
		want[seq] = seqKeys(t, l, seq, Rank{}, pages)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	flipKeys(t, cfg.DataDir, Rank{}, first[1])
	flipKeys(t, cfg.DataDir, Rank{}, first[3])
	flipKeys(t, cfg.DataDir, Rank{}, first[5])
	same := func(l *Local, seq uint64) {
		t.Helper()
		got := seqKeys(t, l, seq, Rank{}, pages)
		for layer := range got {
			if !equalBits(got[layer], want[seq][layer]) {
				t.Fatalf("sequence %d layer %d: keys differ from those before the restart", seq, layer)
			}
		}
	}
	keyOf := func(rep RecoveryReport, seq uint64) uint64 {
		for _, r := range rep.Sequences {
			if r.Seq == seq {
				return r.Key
			}
		}
		t.Fatalf("sequence %d not recovered: %+v", seq, rep.Sequences)
		return 0
	}

	// Open 1, no scrub: sequence 1 claimed and found damaged by its
	// first append; 3 stays parked, its damage unseen.
	l = open(cfg)
	rep := l.Recovery()
	if len(rep.Sequences) != 5 || len(rep.Damaged) != 0 {
		t.Fatalf("lazy open: recovered %+v, damaged %+v; want all 5, none damaged yet", rep.Sequences, rep.Damaged)
	}
	for _, seq := range []uint64{1, 2, 4, 5} {
		if err := l.Claim(ctx, keyOf(rep, seq), seq); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		err := l.Append(ctx, AppendRequest{Seq: 1, Layer: 0, Start: n, Tokens: 1, K: randVec(rng, tok), V: randVec(rng, tok)})
		if !errors.Is(err, pagestore.ErrDamaged) || !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("append to damaged sequence 1: %v, want ErrDamaged and tier.ErrCorrupt", err)
		}
	}
	// Sequence 5, damaged too, is released by its client: forgotten,
	// tombstone and all.
	if err := l.Append(ctx, AppendRequest{Seq: 5, Layer: 0, Start: n, Tokens: 1, K: randVec(rng, tok), V: randVec(rng, tok)}); !errors.Is(err, pagestore.ErrDamaged) {
		t.Fatalf("append to damaged sequence 5: %v, want ErrDamaged", err)
	}
	if err := l.Release(ctx, ReleaseRequest{Seq: 5}); err != nil {
		t.Fatalf("release of damaged sequence 5: %v", err)
	}
	if err := l.Append(ctx, AppendRequest{Seq: 5, Layer: 0, Start: n, Tokens: 1, K: randVec(rng, tok), V: randVec(rng, tok)}); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("append to released sequence 5: %v, want ErrUnknownSequence", err)
	}
	if d := l.Damaged(); len(d) != 2 || d[0].Seq != 1 || d[1].Seq != 5 || !errors.Is(d[0].Err, pagestore.ErrDamaged) {
		t.Fatalf("damaged since the open: %+v, want sequences 1 and 5", d)
	}
	same(l, 2)
	same(l, 4)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// Open 2, with a scrub: sequence 1's tombstone is reported with
	// its reason; the scrub finds parked sequence 3 damaged, during the
	// recovery (which reports it) or after (the worker drops it).
	cfg.ScrubRate = 1 << 30
	l = open(cfg)
	rep = l.Recovery()
	atOpen := len(rep.Damaged) == 2 && rep.Damaged[1].Seq == 3 && len(rep.Sequences) == 2
	if !atOpen && (len(rep.Damaged) != 1 || len(rep.Sequences) != 3) || rep.Damaged[0].Seq != 1 || rep.OrphanSeqs != 0 {
		t.Fatalf("second open: recovered %+v, damaged %+v, %d orphans; want 2, 3 and 4 (or 2 and 4, 3 damaged), 1 damaged, none", rep.Sequences, rep.Damaged, rep.OrphanSeqs)
	}
	for _, d := range rep.Damaged {
		if e := d.Err; !errors.Is(e, pagestore.ErrDamaged) || !strings.Contains(e.Error(), "checksum") || strings.Contains(e.Error(), "not persisted") {
			t.Fatalf("sequence %d after the restart: %v, want ErrDamaged naming the failed checksum", d.Seq, e)
		}
	}
	st := l.Shard(Rank{}).Store()
	deadline := time.Now().Add(10 * time.Second)
	for st.Scrub().Running && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if sr := st.Scrub(); sr.Running || len(sr.Damaged) != 1 {
		t.Fatalf("scrub: %+v, want done with one damaged sequence", sr)
	}
	if !atOpen {
		key3 := keyOf(rep, 3)
		if slices.Contains(l.Parked(), key3) {
			t.Fatalf("parked %v still holds damaged sequence 3 (key %d)", l.Parked(), key3)
		}
		if d := l.Damaged(); len(d) != 1 || d[0].Seq != 3 || !errors.Is(d[0].Err, tier.ErrCorrupt) {
			t.Fatalf("damaged since the open: %+v, want sequence 3", d)
		}
		if err := l.Claim(ctx, key3, 3); !errors.Is(err, pagestore.ErrDamaged) {
			t.Fatalf("claim of damaged sequence 3: %v, want ErrDamaged", err)
		}
	}
	t.Logf("the scrub found sequence 3 damaged during the recovery: %v", atOpen)
	for _, seq := range []uint64{2, 4} {
		if err := l.Claim(ctx, keyOf(rep, seq), seq); err != nil {
			t.Fatal(err)
		}
		same(l, seq)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// Open 3, verifying at open: 3 reported with its reason (when
	// the worker dropped it after the recovery), 2 and 4 recovered
	// whole.
	cfg.Verify, cfg.ScrubRate = pagestore.VerifyAtOpen, -1
	l = open(cfg)
	rep = l.Recovery()
	if len(rep.Sequences) != 2 || rep.Sequences[0].Seq != 2 || rep.Sequences[1].Seq != 4 || atOpen != (len(rep.Damaged) == 0) {
		t.Fatalf("third open: recovered %+v, damaged %+v; want 2 and 4, 3 damaged unless reported already", rep.Sequences, rep.Damaged)
	}
	if !atOpen {
		if e := rep.Damaged[0].Err; len(rep.Damaged) != 1 || rep.Damaged[0].Seq != 3 || !errors.Is(e, pagestore.ErrDamaged) || !strings.Contains(e.Error(), "checksum") || strings.Contains(e.Error(), "not persisted") {
			t.Fatalf("sequence 3 after the restart: %+v, want ErrDamaged naming the failed checksum", rep.Damaged)
		}
	}
	if rep.OrphanSeqs != 0 {
		t.Fatalf("third open released %d orphans, want 0", rep.OrphanSeqs)
	}
	for _, seq := range []uint64{2, 4} {
		if err := l.Claim(ctx, keyOf(rep, seq), seq); err != nil {
			t.Fatal(err)
		}
		same(l, seq)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
