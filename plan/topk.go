package plan

import (
	"cmp"
	"fmt"
	"slices"
)

// Candidate is one page proposed for a row's top-K: its score and its
// global logical page index in the sequence (the wire type of the
// selection exchange).
type Candidate struct {
	Score float32
	Page  int32
}

// Compare orders candidates by selection priority: score descending, then
// page ascending (ties go to the lower page index, so every CP rank and
// every backend picks the same set). It returns a negative number when a
// is chosen before b. Scores must not be NaN.
func Compare(a, b Candidate) int {
	if a.Score != b.Score {
		if a.Score > b.Score {
			return -1
		}
		return 1
	}
	return cmp.Compare(a.Page, b.Page)
}

// UnionQuota returns ceil(k/n), the per-rank quota of the union selection
// mode: each of n ranks keeps its local top ceil(k/n) pages of a row with
// no exchange. Union is an approximation of exact selection: it reads up to
// n*ceil(k/n) >= k pages and misses a page of the global top-k whenever one
// rank holds more than its quota of them. k <= 0 gives 0; n < 1 is taken
// as 1.
func UnionQuota(k, n int) int {
	if k <= 0 {
		return 0
	}
	n = max(n, 1)
	return (k + n - 1) / n
}

// MergeTopK is the global top-K rule of exact selection: of every rank's
// candidates for one row (each rank proposes its local best k or fewer),
// the best k by [Compare], returned as global pages in ascending order
// and appended to dst. A page proposed twice is an error: placement gives
// every page one owner. It is the reference the collective's exchange
// implements; both must agree on every input.
func MergeTopK(dst []int32, k int, ranks ...[]Candidate) ([]int32, error) {
	var all []Candidate
	for _, r := range ranks {
		all = append(all, r...)
	}
	slices.SortFunc(all, Compare)
	seen := map[int32]bool{}
	for _, c := range all {
		if seen[c.Page] {
			return dst, fmt.Errorf("plan: page %d proposed twice", c.Page)
		}
		seen[c.Page] = true
	}
	n := len(dst)
	for _, c := range all[:min(max(k, 0), len(all))] {
		dst = append(dst, c.Page)
	}
	slices.Sort(dst[n:])
	return dst, nil
}
