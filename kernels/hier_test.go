package kernels

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/questrt/questrt/plan"
)

// hierFixture is a batch of sequences over a pool of pages whose
// summaries are the min/max of the fixture's own keys.
type hierFixture struct {
	s     Shape
	keys  [][]float32 // per physical page: [KVHeads][PageSize][D]
	l     Layer
	b     Batch
	q     []float32
	trees []*BoxTree
}

// newHierFixture draws a pool of random pages and sequences of the given
// page counts. kind picks the data: "normal" keys; "needles": small keys
// with a few pages far out along random directions (prunable);
// "dups": page tables that repeat physical pages (exact ties); "ulp":
// summaries one float32 ulp apart (near-ties).
func newHierFixture(rng *rand.Rand, s Shape, seqPages []int, kind string, group int) *hierFixture {
	d, S := s.HeadDim, s.PageSize
	total := 0
	for _, n := range seqPages {
		total += n
	}
	pool := total + 3
	f := &hierFixture{s: s}
	rec := 2 * d
	f.l.Summary = make([]float32, pool*s.KVHeads*rec)
	base := make([]float32, d) // one shared page for the ulp kind
	for j := range base {
		base[j] = float32(rng.NormFloat64())
	}
	for p := range pool {
		keys := make([]float32, s.KVHeads*S*d)
		for i := range keys {
			switch kind {
			case "needles":
				keys[i] = float32(rng.NormFloat64() * 0.1)
			case "ulp":
				keys[i] = base[i%d]
			default:
				keys[i] = float32(rng.NormFloat64())
			}
		}
		if kind == "needles" && rng.IntN(40) == 0 {
			for i := range keys {
				keys[i] += float32(rng.NormFloat64() * 3)
			}
		}
		if kind == "ulp" {
			// Nudge a few elements up or down by one ulp.
			for range 3 {
				i := rng.IntN(len(keys))
				if rng.IntN(2) == 0 {
					keys[i] = math.Nextafter32(keys[i], float32(math.Inf(1)))
				} else {
					keys[i] = math.Nextafter32(keys[i], float32(math.Inf(-1)))
				}
			}
		}
		f.keys = append(f.keys, keys)
		for kvh := range s.KVHeads {
			r := f.l.Summary[(p*s.KVHeads+kvh)*rec:][:rec]
			for j := range d {
				r[j], r[d+j] = float32(math.Inf(1)), float32(math.Inf(-1))
			}
			for tok := range S {
				k := keys[(kvh*S+tok)*d:][:d]
				for j, x := range k {
					r[j] = min(r[j], x)
					r[d+j] = max(r[d+j], x)
				}
			}
		}
	}
	perm := rng.Perm(pool)
	f.b.Indptr = []int32{0}
	at := 0
	for _, n := range seqPages {
		for i := range n {
			p := int32(perm[at+i])
			if kind == "dups" && i > 0 && rng.IntN(3) == 0 {
				p = f.b.Pages[len(f.b.Pages)-1-rng.IntN(min(i, 5))]
			}
			f.b.Pages = append(f.b.Pages, p)
		}
		at += n
		f.b.Indptr = append(f.b.Indptr, int32(len(f.b.Pages)))
		f.b.LastLen = append(f.b.LastLen, int32(S))
	}
	f.q = make([]float32, len(seqPages)*s.QHeads*d)
	for i := range f.q {
		f.q[i] = float32(rng.NormFloat64())
	}
	for i := range seqPages {
		t, err := NewBoxTree(group)
		if err != nil {
			panic(err)
		}
		if err := t.Sync(s, f.l.Summary, f.pages(i), 0); err != nil {
			panic(err)
		}
		f.trees = append(f.trees, t)
	}
	return f
}

func (f *hierFixture) pages(i int) []int32 { return f.b.Pages[f.b.Indptr[i]:f.b.Indptr[i+1]] }

// plan ranks, for every row of every sequence, the candidates between
// sink and local forced pages with a random K (sometimes K >= N).
func (f *hierFixture) plan(rng *rand.Rand, mode GQAMode, sink, local int) (*TopKPlan, int) {
	var p TopKPlan
	rows := f.s.Rows(mode)
	out := 0
	for i := range f.b.Len() {
		np := f.b.NumPages(i)
		lo, hi := min(sink, np), max(np-local, min(sink, np))
		n := hi - lo
		for r := range rows {
			k := 1 + rng.IntN(max(n/3, 1))
			if rng.IntN(6) == 0 {
				k = n + rng.IntN(3)
			}
			p.Add(f.b.ScoreOffset(i, rows)+r*np+lo, n, lo, k, out)
			out += min(k, n)
		}
	}
	return &p, out
}

// TestHierRankEqualsFlat is the property test of issue 32: over random
// pages, queries, K, groups and both GQA modes, HierRank returns the same
// pages and the same (bit-identical) scores as flat Quest (Score + TopK
// through Rank), forced sink and local pages excluded from the ranking
// as the shard plans them; duplicate pages, near-ties and zero queries
// included.
func TestHierRankEqualsFlat(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	c := NewCPU(CPUConfig{Workers: 2})
	defer c.Close()
	rng := rand.New(rand.NewPCG(32, 1))
	shapes := []Shape{
		{QHeads: 4, KVHeads: 1, HeadDim: 16, PageSize: 4},
		{QHeads: 6, KVHeads: 2, HeadDim: 8, PageSize: 3},  // g = 3: dot only
		{QHeads: 8, KVHeads: 1, HeadDim: 12, PageSize: 2}, // generic dot4 (d%8 != 0)
		{QHeads: 20, KVHeads: 1, HeadDim: 8, PageSize: 2}, // two score chunks of heads
		{QHeads: 2, KVHeads: 2, HeadDim: 16, PageSize: 4}, // g = 1
	}
	kinds := []string{"normal", "needles", "dups", "ulp"}
	cfgs := []HierConfig{{MinRatio: 1, FlatAfter: 100}, DefaultHierConfig(), {MinRatio: 1, FlatAfter: 0.05}}
	var fell HierStats
	searched := map[string]*HierStats{}
	for _, k := range kinds {
		searched[k] = &HierStats{}
	}
	for iter := range 160 {
		s := shapes[iter%len(shapes)]
		kind := kinds[(iter/len(shapes))%len(kinds)]
		group := []int{2, 4, 8, 16}[rng.IntN(4)]
		seqs := []int{1 + rng.IntN(700), 1 + rng.IntN(60)}
		f := newHierFixture(rng, s, seqs, kind, group)
		if iter%7 == 3 {
			clear(f.q) // zero query: every score 0, ties everywhere
		}
		for _, mode := range []GQAMode{GroupMax, PerHead} {
			sink, local := rng.IntN(3), rng.IntN(3)
			pl, n := f.plan(rng, mode, sink, local)
			want, wantSc := make([]int32, n), make([]float32, n)
			if err := c.Rank(ctx, s, f.l, &f.b, f.q, mode, pl, want, wantSc); err != nil {
				t.Fatal(err)
			}
			if iter%2 == 1 {
				// Best first: Rank's own rows come in Compare order, the
				// same sets; the search must give exactly those.
				asc := want
				pl.BestFirst = true
				want, wantSc = make([]int32, n), make([]float32, n)
				if err := c.Rank(ctx, s, f.l, &f.b, f.q, mode, pl, want, wantSc); err != nil {
					t.Fatal(err)
				}
				for r := range pl.Rows() {
					oo, m := int(pl.OutOff[r]), min(int(pl.K[r]), int(pl.N[r]))
					row := make([]plan.Candidate, m)
					for j := range m {
						row[j] = plan.Candidate{Score: wantSc[oo+j], Page: want[oo+j]}
					}
					if !slices.IsSortedFunc(row, plan.Compare) || !slices.Equal(slices.Sorted(slices.Values(want[oo:oo+m])), asc[oo:oo+m]) {
						t.Fatalf("iter %d row %d: best first %v, ascending %v", iter, r, row, asc[oo:oo+m])
					}
				}
			}
			for ci, cfg := range cfgs {
				got, gotSc := make([]int32, n), make([]float32, n)
				rows := make([]HierStats, pl.Rows())
				if err := c.HierRank(ctx, cfg, s, f.l, &f.b, f.trees, f.q, mode, pl, got, gotSc, rows); err != nil {
					t.Fatal(err)
				}
				st := sumRows(rows)
				if !slices.Equal(got, want) || !slices.Equal(gotSc, wantSc) {
					t.Fatalf("iter %d %s G=%d %v shape %+v cfg %d sink %d local %d: hier pages %v scores %v\nflat pages %v scores %v",
						iter, kind, group, mode, s, ci, sink, local, got, gotSc, want, wantSc)
				}
				switch ci {
				case 0:
					searched[kind].Add(st)
				case 2:
					fell.Add(st)
				}
			}
		}
	}
	// The search must have pruned somewhere and fallen back somewhere, or
	// the test did not exercise it.
	for _, k := range kinds {
		st := searched[k]
		t.Logf("%s: %+v (records %.3f of flat)", k, *st, float64(st.Records())/float64(st.Candidates))
	}
	if fell.Fallbacks == 0 {
		t.Fatalf("no fallback with FlatAfter 0.05: %+v", fell)
	}
	t.Logf("with fallbacks: %+v", fell)
}

// TestBoxTreeBounds checks invariant 1 at every level against a naive
// float64 reference: for every box, every page under it and every query
// head, the box's float32 bound >= the page's float32 flat score (no
// margin: see BoxTree), and the float64 box score >= the page's float64
// score >= every key's float64 dot product. The "ulp" data put boxes and
// pages one ulp apart, where a bound computed differently could round
// below a member's score.
func TestBoxTreeBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 2))
	for iter := range 24 {
		s := Shape{QHeads: 4, KVHeads: 2, HeadDim: 16, PageSize: 4}
		kind := []string{"normal", "needles", "ulp", "dups"}[iter%4]
		group := []int{2, 4, 8, 16}[iter%4]
		f := newHierFixture(rng, s, []int{1 + rng.IntN(300)}, kind, group)
		tree := f.trees[0]
		pages := f.pages(0)
		d, g, rec := s.HeadDim, s.Group(), 2*s.HeadDim
		w := make([]float32, s.QHeads*rec)
		for i, x := range f.q {
			h, j := i/d, i%d
			w[h*rec+j], w[h*rec+d+j] = min(x, 0), max(x, 0)
		}
		span := 1
		for li := range tree.Levels() {
			span *= group
			for node := range tree.Nodes(li + 1) {
				for kvh := range s.KVHeads {
					mins, maxs := tree.Box(li+1, node, kvh)
					for h := range g {
						qh := f.q[(kvh*g+h)*d:][:d]
						e := rowEval{w: w[kvh*g*rec:][:g*rec], head: h, g: g, rec: rec, kvh: kvh, kvHeads: s.KVHeads,
							sum: f.l.Summary, pages: pages, u: new([maxScoreGroup]float32)}
						bound := e.bound(tree, li, node)
						ub := naiveU(qh, mins, maxs)
						for lp := node * span; lp < min((node+1)*span, len(pages)); lp++ {
							phys := int(pages[lp])
							r := f.l.Summary[(phys*s.KVHeads+kvh)*rec:][:rec]
							up := naiveU(qh, r[:d], r[d:])
							if flat := e.page(lp); float64(flat) > bound {
								t.Fatalf("level %d box %d head %d: page %d float32 score %v above the box bound %v", li+1, node, h, lp, flat, bound)
							}
							if up > ub {
								t.Fatalf("level %d box %d head %d: page %d float64 score %v above the box's %v", li+1, node, h, lp, up, ub)
							}
							for tok := range s.PageSize {
								k := f.keys[phys][(kvh*s.PageSize+tok)*d:][:d]
								var dp float64
								for j, x := range qh {
									dp += float64(x) * float64(k[j])
								}
								if dp > up+1e-12*math.Abs(up) {
									t.Fatalf("page %d token %d: q.k %v above the page bound %v", lp, tok, dp, up)
								}
							}
						}
					}
				}
			}
		}
	}
}

// naiveU is the Quest bound sum_j max(q_j*min_j, q_j*max_j) in float64.
func naiveU(q, mins, maxs []float32) float64 {
	var u float64
	for j, x := range q {
		u += max(float64(x)*float64(mins[j]), float64(x)*float64(maxs[j]))
	}
	return u
}

// TestBoxTreeSyncIncremental: syncing after appends and after a tail page
// changes (from = the old tail) gives the same boxes as a fresh build.
func TestBoxTreeSyncIncremental(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 3))
	s := Shape{QHeads: 2, KVHeads: 2, HeadDim: 8, PageSize: 2}
	f := newHierFixture(rng, s, []int{900}, "normal", 4)
	all := f.pages(0)
	inc, _ := NewBoxTree(4)
	n := 0
	for n < len(all) {
		from := max(n-1, 0) // the old tail may have changed
		n = min(n+1+rng.IntN(40), len(all))
		// Change the summary of the old tail in place, as an append does.
		if from > 0 {
			r := f.l.Summary[int(all[from])*s.KVHeads*2*s.HeadDim:][:2*s.HeadDim]
			r[0] = min(r[0], float32(rng.NormFloat64()*4))
		}
		if err := inc.Sync(s, f.l.Summary, all[:n], from); err != nil {
			t.Fatal(err)
		}
		fresh, _ := NewBoxTree(4)
		if err := fresh.Sync(s, f.l.Summary, all[:n], 0); err != nil {
			t.Fatal(err)
		}
		if inc.Levels() != fresh.Levels() || inc.Pages() != n {
			t.Fatalf("%d pages: %d levels, fresh %d", n, inc.Levels(), fresh.Levels())
		}
		for li := range inc.levels {
			if !slices.Equal(inc.levels[li], fresh.levels[li]) {
				t.Fatalf("%d pages: level %d differs from a fresh build", n, li+1)
			}
		}
	}
	// Shrinking (a rollback) then regrowing from 0 also matches.
	if err := inc.Sync(s, f.l.Summary, all[:10], 0); err != nil {
		t.Fatal(err)
	}
	if inc.Pages() != 10 || inc.Levels() != 1 || inc.Nodes(1) != 3 {
		t.Fatalf("after shrink: %d pages %d levels %d boxes, want 10, 1 and 3", inc.Pages(), inc.Levels(), inc.Nodes(1))
	}
}

// TestHierRankBadInput: a tree that does not cover its sequence is an
// error that writes nothing.
func TestHierRankBadInput(t *testing.T) {
	c := NewCPU(CPUConfig{Workers: 1})
	defer c.Close()
	rng := rand.New(rand.NewPCG(32, 4))
	s := Shape{QHeads: 2, KVHeads: 1, HeadDim: 8, PageSize: 2}
	f := newHierFixture(rng, s, []int{50}, "normal", 4)
	pl, n := f.plan(rng, GroupMax, 0, 1)
	out, sc := make([]int32, n), make([]float32, n)
	for i := range out {
		out[i] = -7
	}
	if err := f.trees[0].Sync(s, f.l.Summary, f.pages(0)[:20], 0); err != nil {
		t.Fatal(err)
	}
	err := c.HierRank(context.Background(), HierConfig{}, s, f.l, &f.b, f.trees, f.q, GroupMax, pl, out, sc, nil)
	if err == nil {
		t.Fatal("stale tree accepted")
	}
	for _, x := range out {
		if x != -7 {
			t.Fatalf("output written on error: %v", out)
		}
	}
	if _, err := NewBoxTree(1); err == nil {
		t.Fatal("group 1 accepted")
	}
}

// TestHierRankPrunes: on data the bound can separate (a few pages far out
// along random directions among small keys) and K below the number of
// such pages, the search reads well under half the records of a flat
// score, and still returns flat Quest's pages.
func TestHierRankPrunes(t *testing.T) {
	ctx := context.Background()
	c := NewCPU(CPUConfig{Workers: 1})
	defer c.Close()
	rng := rand.New(rand.NewPCG(32, 5))
	s := Shape{QHeads: 4, KVHeads: 2, HeadDim: 16, PageSize: 4}
	for _, group := range []int{2, 4, 8, 16} {
		f := newHierFixture(rng, s, []int{4000}, "needles", group)
		for _, mode := range []GQAMode{GroupMax, PerHead} {
			var pl TopKPlan
			rows := s.Rows(mode)
			for r := range rows {
				pl.Add(r*4000, 3999, 0, 8, r*8)
			}
			want, wantSc := make([]int32, 8*rows), make([]float32, 8*rows)
			got, gotSc := make([]int32, 8*rows), make([]float32, 8*rows)
			if err := c.Rank(ctx, s, f.l, &f.b, f.q, mode, &pl, want, wantSc); err != nil {
				t.Fatal(err)
			}
			per := make([]HierStats, pl.Rows())
			if err := c.HierRank(ctx, HierConfig{}, s, f.l, &f.b, f.trees, f.q, mode, &pl, got, gotSc, per); err != nil {
				t.Fatal(err)
			}
			st := sumRows(per)
			if !slices.Equal(got, want) || !slices.Equal(gotSc, wantSc) {
				t.Fatalf("G=%d %v: hier %v %v, flat %v %v", group, mode, got, gotSc, want, wantSc)
			}
			if st.Flat+st.Fallbacks > 0 || 2*st.Records() >= st.Candidates {
				t.Fatalf("G=%d %v: read %d records of %d: %+v", group, mode, st.Records(), st.Candidates, st)
			}
			t.Logf("G=%d %v: %d boxes + %d pages of %d candidates (%.3f)", group, mode, st.Boxes, st.Pages, st.Candidates, float64(st.Records())/float64(st.Candidates))
		}
	}
}

// sumRows sums per-row stats.
func sumRows(rows []HierStats) HierStats {
	var st HierStats
	for _, r := range rows {
		st.Add(r)
	}
	return st
}

// TestHierRankFallbackMemory: a row whose search fell back scores flat
// without searching for the next 16 rankings, then 32, 64 and at most
// MaxSkip after further fallbacks in a row; a search that completes
// forgets it; MaxSkip < 0 searches every time. Every ranking returns
// flat Quest's pages and scores.
func TestHierRankFallbackMemory(t *testing.T) {
	ctx := context.Background()
	c := NewCPU(CPUConfig{Workers: 2})
	defer c.Close()
	rng := rand.New(rand.NewPCG(32, 9))
	s := Shape{QHeads: 4, KVHeads: 2, HeadDim: 16, PageSize: 4}
	const pages, k = 3000, 8
	rank := func(f *hierFixture, cfg HierConfig) []HierStats {
		t.Helper()
		var pl TopKPlan
		for r := range s.KVHeads {
			pl.Add(r*pages, pages-1, 0, k, r*k)
		}
		want, wantSc := make([]int32, k*s.KVHeads), make([]float32, k*s.KVHeads)
		got, gotSc := make([]int32, k*s.KVHeads), make([]float32, k*s.KVHeads)
		if err := c.Rank(ctx, s, f.l, &f.b, f.q, GroupMax, &pl, want, wantSc); err != nil {
			t.Fatal(err)
		}
		per := make([]HierStats, pl.Rows())
		if err := c.HierRank(ctx, cfg, s, f.l, &f.b, f.trees, f.q, GroupMax, &pl, got, gotSc, per); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) || !slices.Equal(gotSc, wantSc) {
			t.Fatalf("hier %v %v, flat %v %v", got, gotSc, want, wantSc)
		}
		return per
	}
	// way returns "search" (a fallback), "done" (a completed search) or
	// "skip" for a row, failing on anything else.
	way := func(st HierStats) string {
		switch {
		case st.Rows != 1 || st.Candidates != pages-1 || st.Flat != 0:
			t.Fatalf("row stats %+v", st)
		case st.Skipped == 1 && st.Fallbacks == 0 && st.Pages == pages-1 && st.Boxes == 0:
			return "skip"
		case st.Skipped == 0 && st.Fallbacks == 1:
			return "search"
		case st.Skipped == 0 && st.Fallbacks == 0 && st.Records() < st.Candidates:
			return "done"
		}
		t.Fatalf("row stats %+v", st)
		return ""
	}
	schedule := func(name string, f *hierFixture, cfg HierConfig, calls int, searches []int) {
		t.Helper()
		for call := range calls {
			want := "skip"
			if slices.Contains(searches, call) {
				want = "search"
			}
			for r, st := range rank(f, cfg) {
				if got := way(st); got != want {
					t.Fatalf("%s: call %d row %d: %s, want %s (%+v)", name, call, r, got, want, st)
				}
			}
		}
	}
	random := newHierFixture(rng, s, []int{pages}, "normal", 4)
	// Fallback, 16 skips, fallback, 32, fallback, 64, fallback, 128,
	// fallback, 256 (MaxSkip), fallback, 256.
	schedule("default", random, HierConfig{}, 1100, []int{0, 17, 50, 115, 244, 501, 758, 1015})
	random = newHierFixture(rng, s, []int{pages}, "normal", 4)
	// Fallback, 16 skips, fallback, 24 (MaxSkip), fallback, 24.
	schedule("MaxSkip 24", random, HierConfig{MaxSkip: 24}, 80, []int{0, 17, 42, 67})
	random = newHierFixture(rng, s, []int{pages}, "normal", 4)
	schedule("MaxSkip 2", random, HierConfig{MaxSkip: 2}, 12, []int{0, 3, 6, 9})
	schedule("MaxSkip -1", random, HierConfig{MaxSkip: -1}, 4, []int{0, 1, 2, 3})

	// Prunable data: a fallback forced by a tiny FlatAfter is skipped
	// over 16 times, then a completed search forgets it.
	needles := newHierFixture(rng, s, []int{pages}, "needles", 4)
	schedule("needles, FlatAfter 0.001", needles, HierConfig{FlatAfter: 0.001}, 17, []int{0})
	for call := range 3 {
		for r, st := range rank(needles, HierConfig{}) {
			if got := way(st); got != "done" {
				t.Fatalf("needles call %d row %d: %s, want a completed search (%+v)", call, r, got, st)
			}
		}
	}
}
