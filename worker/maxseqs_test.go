package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestMaxSequences: a grid of CP 2 x 600 pages per rank holds 1200
// sequences (CP x Capacity) and one of CP 2 x 64 pages the floor of
// 1024; on every worker (the ranks on one Local each) the next Create
// and any Fork fail with ErrTooManySequences naming the count, and change
// nothing; after a Release one Create and then one Fork fit again.
func TestMaxSequences(t *testing.T) {
	for _, tc := range []struct{ capacity, want int }{{600, 1200}, {64, 1024}} {
		t.Run(fmt.Sprint(tc.capacity), func(t *testing.T) {
			cfg := testConfig(plan.Exact)
			cfg.Capacity = tc.capacity
			if got := cfg.MaxSequences(); got != tc.want {
				t.Fatalf("MaxSequences %d, want %d", got, tc.want)
			}
			g := newGrid(t, cfg, true)
			ctx := context.Background()
			for id := range uint64(tc.want) {
				g.create(id, plan.Striped)
			}
			lay := g.layouts[0]
			for i, w := range g.workers {
				l := w.(*Local)
				err := w.Create(ctx, CreateRequest{Seq: 1 << 40, Layout: lay})
				if !errors.Is(err, ErrTooManySequences) || !strings.Contains(err.Error(), fmt.Sprintf("holds %d sequences", tc.want)) {
					t.Errorf("worker %d: create past the limit: %v, want ErrTooManySequences naming %d", i, err, tc.want)
				}
				if err := w.Fork(ctx, ForkRequest{Parent: 0, Child: 1 << 40}); !errors.Is(err, ErrTooManySequences) {
					t.Errorf("worker %d: fork past the limit: %v, want ErrTooManySequences", i, err)
				}
				if n := len(l.seqs); n != tc.want {
					t.Errorf("worker %d holds %d sequences after the refusals, want %d", i, n, tc.want)
				}
				for _, rk := range l.ranks {
					if n := rk.sh.Store().Stats().Sequences; n != tc.want {
						t.Errorf("worker %d rank %v: %d store sequences after the refusals, want %d", i, rk.id, n, tc.want)
					}
				}
			}
			g.release(0)
			g.create(1<<40, plan.Striped)
			g.release(1)
			g.fork(2, 1<<41)
		})
	}
}
