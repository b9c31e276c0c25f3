package collective_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/plan"
)

// propScore draws a score from one of several distributions: a few values
// that tie often (with infinities and both zeros), a handful of quarter
// steps, normal floats, floats in a narrow cluster, huge and tiny
// magnitudes.
func propScore(rng *rand.Rand, dist int) float32 {
	switch dist {
	case 0:
		return tieScores[rng.IntN(len(tieScores))]
	case 1:
		return float32(rng.IntN(5)) / 4
	case 2:
		return float32(rng.NormFloat64())
	case 3:
		return 1 + float32(rng.IntN(1<<10))*0x1p-23 // ties and neighbours
	case 4:
		return float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(70)-35)))
	default:
		return math.Float32frombits(rng.Uint32() &^ (0xff << 23)) // subnormals and zeros
	}
}

// propCase is a random selection problem with unique pages: rows 1..9,
// budgets 0..300 with many small ones, each rank proposing up to k
// candidates from its own pages, in Compare order, in page order or
// shuffled.
func propCase(rng *rand.Rand, n int) selectCase {
	rows := 1 + rng.IntN(9)
	c := selectCase{n: n, k: make([]int, rows), local: make([][][]collective.Candidate, n)}
	for r := range n {
		c.local[r] = make([][]collective.Candidate, rows)
	}
	for row := range rows {
		k := rng.IntN(20)
		switch rng.IntN(4) {
		case 0:
			k = rng.IntN(301)
		case 1:
			k = 0
		}
		c.k[row] = k
		dist := rng.IntN(6)
		// Page ranges: dense (the bitmap), sparse (the sort) or mixed.
		var spread int
		switch rng.IntN(3) {
		case 0:
			spread = 1
		case 1:
			spread = 1 + rng.IntN(64)
		default:
			spread = math.MaxInt32 / (n * 1300)
		}
		base := rng.IntN(1000)
		for r := range n {
			cnt := rng.IntN(k + 1)
			if rng.IntN(3) == 0 {
				cnt = k
			}
			seen := map[int32]bool{}
			var mine []collective.Candidate
			for len(mine) < cnt {
				// Page p lives on rank p mod n.
				p := int32((base+rng.IntN(4*k+8)*spread)*n + r)
				if seen[p] {
					continue
				}
				seen[p] = true
				mine = append(mine, collective.Candidate{Score: propScore(rng, dist), Page: p})
			}
			switch rng.IntN(3) {
			case 0:
				slices.SortFunc(mine, plan.Compare)
			case 1:
				slices.SortFunc(mine, func(a, b collective.Candidate) int { return int(a.Page - b.Page) })
			}
			c.local[r][row] = mine
		}
	}
	return c
}

// TestSelectExactMatchesMergeTopK: on random problems (many ties, random
// budgets, 1 to 6 ranks, 1 to 9 rows) every rank's SelectExact returns
// exactly plan.MergeTopK of the same candidates, reusing its dst, whether
// it views the frames' keys in place or copies them; SelectExactUnordered
// returns the same sets, in one order on every rank.
func TestSelectExactMatchesMergeTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	dstAny := make([][][][]int32, 6)
	for n := 1; n <= 6; n++ {
		dstAny[n-1] = make([][][]int32, n)
		gs, done := newGroups(n, nil)
		dst := make([][][]int32, n)
		trials := 150
		if testing.Short() {
			trials = 30
		}
		for trial := range trials {
			c := propCase(rng, n)
			for r, g := range gs {
				// Some members copy the keys instead of viewing the frames.
				collective.SetCopyKeys(g, (trial+r)%3 == 0)
			}
			tag := collective.MakeTag(uint64(trial), 1, collective.OpSelect)
			res := runRanks(n, func(r int) ([][]int32, error) {
				return gs[r].SelectExact(bg(), tag, c.local[r], c.k, dst[r])
			})
			for row, k := range c.k {
				ranks := make([][]collective.Candidate, n)
				for r := range n {
					ranks[r] = c.local[r][row]
				}
				want, err := plan.MergeTopK(nil, k, ranks...)
				if err != nil {
					t.Fatal(err)
				}
				for r, o := range res {
					if o.err != nil {
						t.Fatalf("n=%d trial %d rank %d: %v", n, trial, r, o.err)
					}
					if got := o.val[row]; !slices.Equal(got, want) {
						t.Fatalf("n=%d trial %d rank %d row %d k=%d: got %v, want %v", n, trial, r, row, k, got, want)
					}
				}
			}
			for r, o := range res {
				dst[r] = o.val
			}
			// The unordered variant: the same sets, one order on every
			// member, each rank's taken pages best first in rank order
			// (ascending for rows too wide for its bitmap).
			tag = collective.MakeTag(uint64(trial), 2, collective.OpSelect)
			unord := runRanks(n, func(r int) ([][]int32, error) {
				return gs[r].SelectExactUnordered(bg(), tag, c.local[r], c.k, dstAny[n-1][r])
			})
			for row := range c.k {
				want := res[0].val[row]
				for r, o := range unord {
					if o.err != nil {
						t.Fatalf("n=%d trial %d rank %d unordered: %v", n, trial, r, o.err)
					}
					got := o.val[row]
					if !slices.Equal(slices.Sorted(slices.Values(got)), want) {
						t.Fatalf("n=%d trial %d rank %d row %d: unordered %v, ordered %v", n, trial, r, row, got, want)
					}
					if !slices.Equal(got, unord[0].val[row]) {
						t.Fatalf("n=%d trial %d row %d: rank %d has %v, rank 0 %v", n, trial, row, r, got, unord[0].val[row])
					}
				}
				if got := unord[0].val[row]; !slices.IsSorted(got) && !slices.Equal(got, rankOrder(c, row, want)) {
					t.Fatalf("n=%d trial %d row %d: unordered %v neither ascending nor in rank order %v", n, trial, row, got, rankOrder(c, row, want))
				}
			}
			for r, o := range unord {
				dstAny[n-1][r] = o.val
			}
		}
		done()
	}
}

// rankOrder returns the pages of set (a row's selection) in rank order,
// each rank's best first: SelectExactUnordered's order.
func rankOrder(c selectCase, row int, set []int32) []int32 {
	out := []int32{}
	for r := range c.n {
		for _, x := range slices.SortedFunc(slices.Values(c.local[r][row]), plan.Compare) {
			if _, ok := slices.BinarySearch(set, x.Page); ok {
				out = append(out, x.Page)
			}
		}
	}
	return out
}

// TestSelectExactDuplicateInSelection: a page that two ranks propose with
// the same score, and that makes the global top-k, fails every rank with
// ErrDuplicatePage whatever the path that orders the pages (dense or
// sparse page ranges), in SelectExact and SelectExactUnordered (whose
// bitmap covers the middle range that SelectExact sorts); a duplicate
// that misses the top-k goes unnoticed, as it always did.
func TestSelectExactDuplicateInSelection(t *testing.T) {
	for _, spread := range []int32{1, 1 << 10, 1 << 20} {
		for _, v := range []struct {
			selected, ordered bool
		}{{true, true}, {false, true}, {true, false}, {false, false}} {
			selected := v.selected
			t.Run(fmt.Sprintf("spread=%d/selected=%v/ordered=%v", spread, selected, v.ordered), func(t *testing.T) {
				const n, k = 3, 100
				local := make([][][]collective.Candidate, n)
				for r := range n {
					var row []collective.Candidate
					for i := range k {
						row = append(row, collective.Candidate{Score: float32(i%7) + float32(r)/8, Page: int32(i*n+r) * spread})
					}
					local[r] = [][]collective.Candidate{row}
				}
				score := float32(100)
				if !selected {
					score = -100
				}
				dup := local[1][0][5].Page
				local[1][0][5].Score = score
				local[2][0][7] = collective.Candidate{Score: score, Page: dup}
				gs, done := newGroups(n, nil)
				defer done()
				res := runRanks(n, func(r int) ([][]int32, error) {
					if !v.ordered {
						return gs[r].SelectExactUnordered(bg(), 1, local[r], []int{k}, nil)
					}
					return gs[r].SelectExact(bg(), 1, local[r], []int{k}, nil)
				})
				for r, o := range res {
					if selected && !errors.Is(o.err, collective.ErrDuplicatePage) {
						t.Errorf("rank %d: %v, want ErrDuplicatePage", r, o.err)
					}
					if !selected && (o.err != nil || len(o.val[0]) != k) {
						t.Errorf("rank %d: %d pages, %v; want %d and no error", r, len(o.val[0]), o.err, k)
					}
				}
			})
		}
	}
}

// TestSelectExactDuplicateCandidate: a rank that proposes one candidate
// twice, its row shuffled or in Compare order (the two copies side by
// side), sends a frame that every rank rejects, itself included.
func TestSelectExactDuplicateCandidate(t *testing.T) {
	const n = 2
	for _, sorted := range []bool{false, true} {
		var row []collective.Candidate
		for i := range 40 {
			row = append(row, collective.Candidate{Score: float32(i % 5), Page: int32(2 * i)})
		}
		row = append(row, row[17])
		if sorted {
			slices.SortFunc(row, plan.Compare)
		}
		local := [][][]collective.Candidate{{row}, {{{Score: 1, Page: 1}}}}
		gs, done := newGroups(n, nil)
		res := runRanks(n, func(r int) ([][]int32, error) {
			return gs[r].SelectExact(bg(), 1, local[r], []int{len(row)}, nil)
		})
		done()
		for r, o := range res {
			var re *collective.RankError
			if !errors.Is(o.err, collective.ErrBadMessage) || !errors.As(o.err, &re) || re.Rank != 0 {
				t.Errorf("sorted %v: rank %d: %v, want ErrBadMessage from rank 0", sorted, r, o.err)
			}
		}
	}
}
