package worker

import (
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestOwnedMatchesCount: the O(1) token counts equal a count position by
// position, for both placements, several page sizes and CP degrees.
func TestOwnedMatchesCount(t *testing.T) {
	for _, pl := range []plan.Placement{plan.Striped, plan.Contiguous} {
		for _, cp := range []int{1, 2, 3, 5} {
			for _, S := range []int{1, 4, 16} {
				lay := plan.Layout{CP: cp, TP: 1, Placement: pl, BlockPages: 3}
				for r := range cp {
					p := lay.Place(r)
					want := 0
					for n := range 200 {
						if got := owned(p, S, n); got != want {
							t.Fatalf("%v cp %d S %d rank %d: owned(%d) = %d, want %d", pl, cp, S, r, n, got, want)
						}
						if lay.Owner(n/S) == r {
							want++
						}
					}
				}
			}
		}
	}
}
