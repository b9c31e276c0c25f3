package backendtest

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
)

// StepLists builds the plan and lists of a fused step over f, as a shard
// holding every page does: per (sequence, row) the first sink pages, then
// k top-K slots ranking pages [sink, np-1), then the tail page; sequences
// too short to rank list every page. ks[i] is sequence i's k (clamped to
// the candidates). Slots hold -1 until the step fills them.
func StepLists(f *Fixture, mode kernels.GQAMode, sink int, ks []int) (*kernels.TopKPlan, *kernels.Lists) {
	rows := f.Shape.Rows(mode)
	plan := &kernels.TopKPlan{}
	l := &kernels.Lists{Mode: mode, Indptr: []int32{0}}
	for i := range f.Lens {
		np := f.Batch.NumPages(i)
		for r := range rows {
			if np <= sink+1 {
				for p := range np {
					l.Pages = append(l.Pages, int32(p))
				}
				l.Indptr = append(l.Indptr, int32(len(l.Pages)))
				continue
			}
			for p := range sink {
				l.Pages = append(l.Pages, int32(p))
			}
			n := np - 1 - sink
			k := min(ks[i], n)
			plan.Add(f.Batch.ScoreOffset(i, rows)+r*np+sink, n, sink, k, len(l.Pages))
			for range k {
				l.Pages = append(l.Pages, -1)
			}
			l.Pages = append(l.Pages, int32(np-1))
			l.Indptr = append(l.Indptr, int32(len(l.Pages)))
		}
	}
	return plan, l
}

// testStep checks a kernels.Stepper: the pages it picks are the top-K of
// the backend's own Score output (ties to the lower page), the forced
// pages stay, and the output is attention over the final lists; a plan
// that would make a list repeat a page is refused with nothing written.
func testStep(t *testing.T, nb NewBackend, opt Options) {
	be := nb(t)
	defer be.Close()
	st, ok := be.(kernels.Stepper)
	if !ok {
		t.Skipf("backend %s does not fuse steps", be.Name())
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(21, 22))
	for _, s := range shapes {
		f := opt.fixture(rng, s, tailLens(s.PageSize))
		for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			for _, sink := range []int{0, 1} {
				ks := make([]int, len(f.Lens))
				for i := range ks {
					ks[i] = 1 + rng.IntN(8)
				}
				plan, l := StepLists(f, mode, sink, ks)
				forced := slices.Clone(l.Pages)
				o := make([]float32, len(f.Q))
				lse := make([]float32, len(f.Lens)*s.QHeads)
				if err := st.Step(ctx, s, f.Layer, &f.Batch, f.Q, plan, l, o, lse); err != nil {
					t.Fatalf("%+v %v sink %d: %v", s, mode, sink, err)
				}
				scores := make([]float32, len(f.Batch.Pages)*s.Rows(mode))
				if err := be.Score(ctx, s, f.Layer, &f.Batch, f.Q, mode, scores); err != nil {
					t.Fatal(err)
				}
				for pr := range plan.Rows() {
					n, k, base, oo := int(plan.N[pr]), int(plan.K[pr]), plan.Base[pr], int(plan.OutOff[pr])
					want := RefTopK(scores[plan.ScoreOff[pr]:][:n], k)
					for j, w := range want {
						if got := l.Pages[oo+j]; got != w+base {
							t.Fatalf("%+v %v sink %d: top-K row %d picked %v, want %v (+%d)", s, mode, sink, pr, l.Pages[oo:oo+k], want, base)
						}
						forced[oo+j] = w + base
					}
				}
				if !slices.Equal(forced, l.Pages) {
					t.Fatalf("%+v %v sink %d: the step changed forced list entries", s, mode, sink)
				}
				checkAttend(t, f, l, o, lse, 2e-5*opt.Tol)
			}
		}
	}
	// A forced page inside the candidates would be listed twice.
	s := shapes[1]
	f := opt.fixture(rng, s, []int{200, 90})
	plan, l := StepLists(f, kernels.GroupMax, 0, []int{3, 3})
	l.Pages[l.Indptr[1]-1] = 5 // row 0's tail slot now names candidate page 5
	before := slices.Clone(l.Pages)
	o := make([]float32, len(f.Q))
	lse := make([]float32, len(f.Lens)*s.QHeads)
	if err := st.Step(ctx, s, f.Layer, &f.Batch, f.Q, plan, l, o, lse); err == nil {
		t.Fatal("a forced page among the candidates: no error")
	}
	if !slices.Equal(before, l.Pages) || slices.ContainsFunc(o, func(x float32) bool { return x != 0 }) {
		t.Fatal("a refused step wrote its outputs")
	}
}

// testRank checks a kernels.Ranker: the pages it picks are the top-K of
// the backend's own Score output, each output score is that page's score,
// and entries outside the plan's output ranges stay as they were.
func testRank(t *testing.T, nb NewBackend, opt Options) {
	be := nb(t)
	defer be.Close()
	rk, ok := be.(kernels.Ranker)
	if !ok {
		t.Skipf("backend %s does not rank in one call", be.Name())
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(23, 24))
	for _, s := range shapes {
		f := opt.fixture(rng, s, tailLens(s.PageSize))
		for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			for _, prefix := range []bool{false, true} {
				// prefix: every row ranks a prefix of its score row (from page
				// 0; whole rows and rows without the tail), which lets a
				// backend use per-tile maxima of the scores.
				rows := s.Rows(mode)
				var plan kernels.TopKPlan
				off := 0
				for i := range f.Lens {
					np := f.Batch.NumPages(i)
					for r := range rows {
						lo := min(rng.IntN(2), np)
						n := max(np-1-lo, 0)
						if prefix {
							lo, n = 0, max(np-rng.IntN(2), 0)
						}
						k := 1 + rng.IntN(9)
						plan.Add(f.Batch.ScoreOffset(i, rows)+r*np+lo, n, lo, k, off)
						off += min(k, n) + 1 // one untouched entry between rows
					}
				}
				out := make([]int32, off)
				outScores := make([]float32, off)
				for j := range out {
					out[j], outScores[j] = -7, -7
				}
				if err := rk.Rank(ctx, s, f.Layer, &f.Batch, f.Q, mode, &plan, out, outScores); err != nil {
					t.Fatalf("%+v %v: %v", s, mode, err)
				}
				scores := make([]float32, len(f.Batch.Pages)*rows)
				if err := be.Score(ctx, s, f.Layer, &f.Batch, f.Q, mode, scores); err != nil {
					t.Fatal(err)
				}
				written := make([]bool, off)
				for pr := range plan.Rows() {
					n, k, base, oo := int(plan.N[pr]), int(plan.K[pr]), plan.Base[pr], int(plan.OutOff[pr])
					want := RefTopK(scores[plan.ScoreOff[pr]:][:n], k)
					for j, w := range want {
						if out[oo+j] != w+base {
							t.Fatalf("%+v %v: row %d picked %v, want %v (+%d)", s, mode, pr, out[oo:oo+len(want)], want, base)
						}
						if got := outScores[oo+j]; got != scores[int(plan.ScoreOff[pr])+int(w)] {
							t.Fatalf("%+v %v: row %d page %d: score %v, Score gave %v", s, mode, pr, w+base, got, scores[int(plan.ScoreOff[pr])+int(w)])
						}
						written[oo+j] = true
					}
				}
				for j, w := range written {
					if !w && (out[j] != -7 || outScores[j] != -7) {
						t.Fatalf("%+v %v: entry %d outside every output range changed to %d / %v", s, mode, j, out[j], outScores[j])
					}
				}
			}
		}
	}
}
