package plan

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPlaceProperties checks the O(1) placement against a naive walk over
// the pages for random rank counts, ranks and blocks: every page has one
// owner, Local and Global are inverse, local indices are dense and in
// global order, and Count/LocalRange agree with counting.
func TestPlaceProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		n, blk, pages := 1+rng.IntN(7), 1+rng.IntN(5), rng.IntN(90)
		lay := Layout{CP: n, TP: 1, Placement: Contiguous, BlockPages: blk}
		if rng.IntN(2) == 0 {
			lay.Placement, blk = Striped, 1
		}
		owned := make([][]int, n) // naive: rank -> its global pages in order
		for g := range pages {
			r := (g / blk) % n
			if got := lay.Owner(g); got != r {
				t.Fatalf("%+v: owner(%d) = %d, want %d", lay, g, got, r)
			}
			owned[r] = append(owned[r], g)
		}
		for r := range n {
			p := lay.Place(r)
			if got := p.Count(pages); got != len(owned[r]) {
				t.Fatalf("%+v rank %d: Count(%d) = %d, want %d", lay, r, pages, got, len(owned[r]))
			}
			for l, g := range owned[r] {
				if p.Local(g) != l || p.Global(l) != g {
					t.Fatalf("%+v rank %d: page %d local %d: Local %d Global %d", lay, r, g, l, p.Local(g), p.Global(l))
				}
			}
			for g := range pages {
				if lay.Owner(g) != r && p.Local(g) != -1 {
					t.Fatalf("%+v rank %d: Local(%d) = %d for another rank's page", lay, r, g, p.Local(g))
				}
			}
			lo, hi := rng.IntN(pages+1), rng.IntN(pages+1)
			a, b := p.LocalRange(lo, hi)
			var want []int
			for l, g := range owned[r] {
				if g >= lo && g < hi {
					want = append(want, l)
				}
			}
			var got []int
			for l := a; l < b; l++ {
				got = append(got, l)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%+v rank %d: LocalRange(%d, %d) = [%d,%d), want %v", lay, r, lo, hi, a, b, want)
			}
		}
	}
}

// TestMergeTopKMatchesBruteForce: the merge of each rank's best k equals
// the best k of all candidates (score descending, lower page on ties),
// with many equal scores.
func TestMergeTopKMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		n, k := 1+rng.IntN(5), rng.IntN(12)
		ranks := make([][]Candidate, n)
		var all []Candidate
		for g := range rng.IntN(60) {
			c := Candidate{Score: float32(rng.IntN(5)), Page: int32(g)}
			ranks[g%n] = append(ranks[g%n], c)
			all = append(all, c)
		}
		props := make([][]Candidate, n)
		for r := range n {
			props[r] = slices.Clone(ranks[r])
			slices.SortFunc(props[r], Compare)
			props[r] = props[r][:min(k, len(props[r]))]
		}
		got, err := MergeTopK(nil, k, props...)
		if err != nil {
			t.Fatal(err)
		}
		// Brute force: pick the best remaining candidate k times.
		var want []int32
		left := slices.Clone(all)
		for range min(k, len(all)) {
			best := 0
			for i, c := range left {
				if c.Score > left[best].Score || (c.Score == left[best].Score && c.Page < left[best].Page) {
					best = i
				}
			}
			want = append(want, left[best].Page)
			left = slices.Delete(left, best, best+1)
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("n %d k %d: got %v, want %v", n, k, got, want)
		}
	}
	if _, err := MergeTopK(nil, 2, []Candidate{{1, 3}}, []Candidate{{2, 3}}); err == nil {
		t.Fatal("a page proposed by two ranks was accepted")
	}
}
