package shard

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/plan"
)

// recordGroup is a one-member Group that keeps the candidates its
// SelectExact is given and answers each row's best k of them.
type recordGroup struct {
	local [][]Candidate
}

func (g *recordGroup) Rank() int { return 0 }
func (g *recordGroup) Size() int { return 1 }
func (g *recordGroup) SelectExact(_ context.Context, local [][]Candidate, k []int, dst [][]int32) ([][]int32, error) {
	g.local = g.local[:0]
	dst = dst[:0]
	for row, c := range local {
		g.local = append(g.local, slices.Clone(c))
		s := slices.SortedFunc(slices.Values(c), plan.Compare)
		var pages []int32
		for _, x := range s[:min(k[row], len(s))] {
			pages = append(pages, x.Page)
		}
		dst = append(dst, pages)
	}
	return dst, nil
}
func (g *recordGroup) AllGather(_ context.Context, msg []byte) ([][]byte, error) {
	return [][]byte{msg}, nil
}
func (g *recordGroup) Reduce(context.Context, []float32, []float32) error { return nil }

// TestExactCandidatesBestFirst: on the CPU backend the candidates a step
// program hands to the exact exchange come best first (plan.Compare's
// order, strictly), the set its local selection picks, for the quest
// selector by one ranking call, phased (score, top-K) and by the
// hierarchical search, and for the recent selector.
func TestExactCandidatesBestFirst(t *testing.T) {
	rng := rand.New(rand.NewPCG(30, 2))
	cases := []struct {
		name   string
		pol    plan.Policy
		phased bool
	}{
		{"quest", plan.Policy{BudgetTokens: 64, Selector: plan.Quest, LocalPages: 1}, false},
		{"quest phased", plan.Policy{BudgetTokens: 64, Selector: plan.Quest, LocalPages: 1}, true},
		{"quest hier", plan.Policy{BudgetTokens: 64, Selector: plan.Quest, LocalPages: 1, HierGroup: 4}, false},
		{"recent", plan.Policy{BudgetTokens: 64, Selector: plan.Recent, LocalPages: 1}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const qh, kvh, d, s = 4, 2, 8, 4
			sh := newTestShard(t, 1, qh, kvh, d, s, 512, tc.pol)
			var parts []SeqPart
			for _, tokens := range []int{300, 97} {
				id := sh.Store().Create()
				fill(t, rng, sh, id, &refSeq{}, tokens)
				pl, err := sh.Config().Policy.Plan(0, sh.Config().Store.Pages(tokens), 16*s)
				if err != nil {
					t.Fatal(err)
				}
				parts = append(parts, SeqPart{Seq: id, Plan: pl, Q: randVec(rng, qh*d, 1)})
			}
			var ls LocalStep
			var local, exact Chosen
			if err := sh.Begin(&ls, 0, parts); err != nil {
				t.Fatal(err)
			}
			if _, err := sh.Run(context.Background(), &ls, &local, &Program{Selection: SelectLocal, Phased: tc.phased}); err != nil {
				t.Fatal(err)
			}
			g := &recordGroup{}
			if err := sh.Begin(&ls, 0, parts); err != nil {
				t.Fatal(err)
			}
			if _, err := sh.Run(context.Background(), &ls, &exact, &Program{Group: g, Selection: SelectExact, Phased: tc.phased}); err != nil {
				t.Fatal(err)
			}
			if len(g.local) != len(local.Indptr)-1 {
				t.Fatalf("%d exchanged rows, %d local rows", len(g.local), len(local.Indptr)-1)
			}
			ranked := 0
			for row, c := range g.local {
				for j := 1; j < len(c); j++ {
					if plan.Compare(c[j-1], c[j]) >= 0 {
						t.Fatalf("row %d: candidates %v not best first at %d", row, c, j)
					}
				}
				var pages []int32
				for _, x := range c {
					pages = append(pages, x.Page)
				}
				slices.Sort(pages)
				want := slices.Sorted(slices.Values(local.Pages[local.Indptr[row]:local.Indptr[row+1]]))
				if !slices.Equal(pages, want) {
					t.Fatalf("row %d: exchanged pages %v, local selection %v", row, pages, want)
				}
				ranked += len(c)
			}
			if ranked == 0 {
				t.Fatal("no candidates: the test ranks nothing")
			}
		})
	}
}
