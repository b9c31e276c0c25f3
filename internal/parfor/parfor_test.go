package parfor

import (
	"sync/atomic"
	"testing"
)

// TestRun: every index runs once, on a worker below the bound.
func TestRun(t *testing.T) {
	for _, c := range []struct{ workers, n int }{{0, 100}, {1, 5}, {4, 3}, {8, 1000}, {3, 0}} {
		hits := make([]atomic.Int32, c.n)
		bound := min(Workers(c.workers), c.n)
		var bad atomic.Bool
		Run(c.workers, c.n, func(w, i int) {
			if w < 0 || w >= bound {
				bad.Store(true)
			}
			hits[i].Add(1)
		})
		if bad.Load() {
			t.Errorf("workers %d, n %d: a worker index outside [0, %d)", c.workers, c.n, bound)
		}
		for i := range hits {
			if h := hits[i].Load(); h != 1 {
				t.Errorf("workers %d, n %d: index %d ran %d times", c.workers, c.n, i, h)
			}
		}
	}
}
