package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/plan"
)

// selectCase is one random selection problem: per rank, per row, the
// candidates the rank proposes; and per row the budget.
type selectCase struct {
	n     int
	k     []int
	local [][][]collective.Candidate // [rank][row]
}

// tieScores makes ties frequent (including infinities).
var tieScores = []float32{0, 1, 1, -1, 0.5, float32(math.Inf(1)), float32(math.Inf(-1)), -0.0}

func randomSelectCase(rng *rand.Rand, n int) selectCase {
	rows := 1 + rng.IntN(6)
	c := selectCase{n: n, k: make([]int, rows), local: make([][][]collective.Candidate, n)}
	silent := make([]bool, n) // ranks that propose nothing at all
	for r := range n {
		silent[r] = rng.IntN(4) == 0
		c.local[r] = make([][]collective.Candidate, rows)
	}
	for row := range rows {
		k := rng.IntN(20)
		if rng.IntN(8) == 0 {
			k = 0
		}
		c.k[row] = k
		pages := 1 + rng.IntN(200)
		perm := rng.Perm(pages) // global page ids, striped: page p lives on rank p mod n
		for r := range n {
			if silent[r] {
				continue
			}
			cnt := rng.IntN(k + 1) // often fewer than k in total
			var mine []collective.Candidate
			for _, p := range perm {
				if p%n != r || len(mine) == cnt {
					continue
				}
				var s float32
				if rng.IntN(2) == 0 {
					s = tieScores[rng.IntN(len(tieScores))]
				} else {
					s = float32(rng.IntN(5)) / 4
				}
				mine = append(mine, collective.Candidate{Score: s, Page: int32(p)})
			}
			c.local[r][row] = mine
		}
	}
	return c
}

// bruteForce sorts the union of a row's candidates by score descending,
// page ascending, and returns the first k pages in ascending order.
func (c selectCase) bruteForce(row int) []int32 {
	var all []collective.Candidate
	for r := range c.n {
		all = append(all, c.local[r][row]...)
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].Score != all[j].Score {
			return all[i].Score > all[j].Score
		}
		return all[i].Page < all[j].Page
	})
	out := []int32{}
	for _, x := range all[:min(len(all), c.k[row])] {
		out = append(out, x.Page)
	}
	slices.Sort(out)
	return out
}

func TestSelectExactMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 1 + trial%8
		c := randomSelectCase(rng, n)
		gs, done := newGroups(n, nil)
		tag := collective.MakeTag(uint64(trial), 3, collective.OpSelect)
		res := runRanks(n, func(r int) ([][]int32, error) {
			return gs[r].SelectExact(bg(), tag, c.local[r], c.k, nil)
		})
		done()
		for r, o := range res {
			if o.err != nil {
				t.Fatalf("trial %d rank %d: %v", trial, r, o.err)
			}
			if len(o.val) != len(c.k) {
				t.Fatalf("trial %d rank %d: %d rows, want %d", trial, r, len(o.val), len(c.k))
			}
			for row := range c.k {
				want := c.bruteForce(row)
				if got := o.val[row]; !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
					t.Fatalf("trial %d n=%d rank %d row %d k=%d: got %v, want %v", trial, n, r, row, c.k[row], got, want)
				}
			}
		}
	}
}

func TestSelectExactTieRule(t *testing.T) {
	// Four ranks propose equal scores; the lower page indices win, and the
	// one higher score wins over all of them.
	local := [][][]collective.Candidate{
		{{{Score: 1, Page: 8}, {Score: 1, Page: 4}, {Score: 1, Page: 0}}},
		{{{Score: 1, Page: 9}, {Score: 1, Page: 5}, {Score: 1, Page: 1}}},
		{{{Score: 1, Page: 2}, {Score: 2, Page: 10}}},
		{{}},
	}
	gs, done := newGroups(4, nil)
	defer done()
	res := runRanks(4, func(r int) ([][]int32, error) {
		return gs[r].SelectExact(bg(), 1, local[r], []int{3}, nil)
	})
	for r, o := range res {
		if o.err != nil || !slices.Equal(o.val[0], []int32{0, 1, 10}) {
			t.Errorf("rank %d: %v %v, want [0 1 10]", r, o.val, o.err)
		}
	}
}

func TestSelectExactReusesDst(t *testing.T) {
	gs, done := newGroups(2, nil)
	defer done()
	local := [][][]collective.Candidate{
		{{{Score: 3, Page: 0}, {Score: 1, Page: 2}}, {{Score: 5, Page: 4}}},
		{{{Score: 2, Page: 1}}, {{Score: 6, Page: 3}, {Score: 7, Page: 5}}},
	}
	k := []int{2, 2}
	dst := make([][][]int32, 2)
	for i := range dst {
		dst[i] = [][]int32{make([]int32, 0, 8), make([]int32, 0, 8)}
	}
	for step := range 3 {
		res := runRanks(2, func(r int) ([][]int32, error) {
			return gs[r].SelectExact(bg(), uint64(step), local[r], k, dst[r])
		})
		for r, o := range res {
			if o.err != nil {
				t.Fatal(o.err)
			}
			if !slices.Equal(o.val[0], []int32{0, 1}) || !slices.Equal(o.val[1], []int32{3, 5}) {
				t.Errorf("step %d rank %d: %v", step, r, o.val)
			}
			if &o.val[0][:1][0] != &dst[r][0][:1][0] {
				t.Errorf("rank %d: result row not built in dst's storage", r)
			}
		}
	}
}

func TestSelectExactErrors(t *testing.T) {
	nan := float32(math.NaN())
	ok := [][]collective.Candidate{{{Score: 1, Page: 0}}}
	tests := []struct {
		name     string
		local    func(r int) [][]collective.Candidate
		k        func(r int) []int
		bad      int   // rank whose input is bad (-1: the exchange itself fails everywhere)
		wantBad  error // error of the bad rank (nil: any)
		wantPeer error // error of the others
	}{
		{"nan score", func(r int) [][]collective.Candidate {
			if r == 1 {
				return [][]collective.Candidate{{{Score: nan, Page: 1}}}
			}
			return ok
		}, func(int) []int { return []int{2} }, 1, nil, collective.ErrAborted},
		{"over budget", func(r int) [][]collective.Candidate {
			if r == 2 {
				return [][]collective.Candidate{{{Score: 1, Page: 2}, {Score: 1, Page: 5}, {Score: 1, Page: 8}}}
			}
			return ok
		}, func(int) []int { return []int{2} }, 2, nil, collective.ErrAborted},
		{"negative page", func(r int) [][]collective.Candidate {
			if r == 0 {
				return [][]collective.Candidate{{{Score: 1, Page: -3}}}
			}
			return ok
		}, func(int) []int { return []int{2} }, 0, nil, collective.ErrAborted},
		{"rows and budgets differ", func(r int) [][]collective.Candidate { return ok },
			func(r int) []int {
				if r == 1 {
					return []int{2, 2}
				}
				return []int{2}
			}, 1, nil, collective.ErrAborted},
		{"budgets disagree", func(r int) [][]collective.Candidate { return ok },
			func(r int) []int { return []int{2 + r%2} }, -1, collective.ErrBadMessage, collective.ErrBadMessage},
		{"rows disagree", func(r int) [][]collective.Candidate {
			if r == 1 {
				return [][]collective.Candidate{{}, {}}
			}
			return ok
		}, func(r int) []int {
			if r == 1 {
				return []int{2, 2}
			}
			return []int{2}
		}, -1, collective.ErrBadMessage, collective.ErrBadMessage},
		{"duplicate page", func(r int) [][]collective.Candidate {
			return [][]collective.Candidate{{{Score: float32(r), Page: 7}}}
		}, func(int) []int { return []int{2} }, -1, collective.ErrDuplicatePage, collective.ErrDuplicatePage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			gs, done := newGroups(n, nil)
			defer done()
			ctx, cancel := context.WithTimeout(bg(), promptDeadline)
			defer cancel()
			res := runRanks(n, func(r int) ([][]int32, error) {
				return gs[r].SelectExact(ctx, 9, tc.local(r), tc.k(r), nil)
			})
			for r, o := range res {
				if o.err == nil || o.val != nil {
					t.Errorf("rank %d: %v, %v; want an error and no result", r, o.val, o.err)
					continue
				}
				want := tc.wantPeer
				if r == tc.bad || tc.bad < 0 {
					want = tc.wantBad
				}
				if want != nil && !errors.Is(o.err, want) {
					t.Errorf("rank %d: %v, want %v", r, o.err, want)
				}
				if o.elapsed >= promptBound {
					t.Errorf("rank %d took %v, want < %v: a bad input must fail the others before the %v deadline", r, o.elapsed, promptBound, promptDeadline)
				}
			}
		})
	}
}

func TestCompare(t *testing.T) {
	inf := float32(math.Inf(1))
	sorted := []collective.Candidate{{Score: inf, Page: 3}, {Score: 2, Page: 0}, {Score: 2, Page: 1}, {Score: 1, Page: 0}, {Score: 0, Page: 5}, {Score: float32(math.Inf(-1)), Page: 0}}
	for i := range sorted {
		for j := range sorted {
			got := plan.Compare(sorted[i], sorted[j])
			if (got < 0) != (i < j) || (got == 0) != (i == j) {
				t.Errorf("Compare(%v, %v) = %d", sorted[i], sorted[j], got)
			}
		}
	}
}

func TestUnionQuota(t *testing.T) {
	for _, tc := range []struct{ k, n, want int }{
		{128, 1, 128}, {128, 2, 64}, {128, 3, 43}, {127, 4, 32}, {1, 16, 1}, {0, 4, 0}, {-1, 4, 0}, {5, 0, 5},
	} {
		if got := plan.UnionQuota(tc.k, tc.n); got != tc.want {
			t.Errorf("UnionQuota(%d, %d) = %d, want %d", tc.k, tc.n, got, tc.want)
		}
	}
}

func TestMakeTag(t *testing.T) {
	seen := map[uint64]string{}
	for step := range uint64(4) {
		for layer := range 40 {
			for _, op := range []collective.Op{collective.OpGather, collective.OpSelect, collective.OpReduce, collective.OpAllReduce} {
				tag := collective.MakeTag(step, layer, op)
				key := fmt.Sprint(step, layer, op)
				if prev, dup := seen[tag]; dup {
					t.Fatalf("tag %#x of %s collides with %s", tag, key, prev)
				}
				seen[tag] = key
			}
		}
	}
}
