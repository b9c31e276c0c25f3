package kernels_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
)

// TestStepCheck: StepCheck accepts the plan and lists a shard builds and
// refuses each way they can make the lists invalid after the top-K.
func TestStepCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := kernels.Shape{QHeads: 4, KVHeads: 2, HeadDim: 8, PageSize: 4}
	f := backendtest.NewFixture(rng, s, []int{60, 9, 1}) // 15, 3 and 1 pages
	rows := s.KVHeads
	tests := []struct {
		name  string
		edit  func(p *kernels.TopKPlan, l *kernels.Lists)
		error string // "" for valid
	}{
		{"valid", func(*kernels.TopKPlan, *kernels.Lists) {}, ""},
		{"slots across two list rows", func(p *kernels.TopKPlan, l *kernels.Lists) { p.OutOff[0] = l.Indptr[1] - 1 }, "not inside one list row"},
		{"two plan rows into one list row", func(p *kernels.TopKPlan, l *kernels.Lists) {
			p.OutOff[1], p.ScoreOff[1] = p.OutOff[0], p.ScoreOff[0]
		}, "both write"},
		{"another row's scores", func(p *kernels.TopKPlan, l *kernels.Lists) { p.ScoreOff[0] = p.ScoreOff[1] }, "candidates start"},
		{"candidates past the sequence", func(p *kernels.TopKPlan, l *kernels.Lists) { p.N[0] = 15 }, "ranks pages"},
		{"forced page outside the sequence", func(p *kernels.TopKPlan, l *kernels.Lists) { l.Pages[l.Indptr[1]-1] = 15 }, "outside"},
		{"forced page among the candidates", func(p *kernels.TopKPlan, l *kernels.Lists) { l.Pages[l.Indptr[1]-1] = 4 }, "also a top-K candidate"},
		{"forced page twice", func(p *kernels.TopKPlan, l *kernels.Lists) {
			last := len(l.Pages) - 1 // the one-page sequence's last row
			l.Pages = append(l.Pages, l.Pages[last])
			l.Indptr[len(l.Indptr)-1]++
		}, "listed twice"},
		{"short indptr", func(p *kernels.TopKPlan, l *kernels.Lists) { l.Indptr = l.Indptr[:len(l.Indptr)-1] }, "indptr"},
	}
	plan, _ := backendtest.StepLists(f, kernels.GroupMax, 1, []int{3, 3, 3})
	if err := new(kernels.StepCheck).Check(&f.Batch, rows, plan, &kernels.Lists{All: true}); err == nil || !strings.Contains(err.Error(), "every page") {
		t.Fatalf("top-K rows with lists of every page: got %v", err)
	}
	if err := new(kernels.StepCheck).Check(&f.Batch, rows, &kernels.TopKPlan{}, &kernels.Lists{All: true}); err != nil {
		t.Fatalf("lists of every page without top-K rows refused: %v", err)
	}
	for _, bad := range [][]int32{nil, {1, 15}, {0, 15, 3, 4}} { // malformed batches: an error, no panic
		plan, l := backendtest.StepLists(f, kernels.GroupMax, 1, []int{3, 3, 3})
		b := kernels.Batch{Indptr: bad}
		if err := new(kernels.StepCheck).Check(&b, rows, plan, l); err == nil || !strings.Contains(err.Error(), "indptr") {
			t.Fatalf("batch indptr %v: got %v, want an indptr error", bad, err)
		}
	}
	var c kernels.StepCheck
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, l := backendtest.StepLists(f, kernels.GroupMax, 1, []int{3, 3, 3})
			if plan.Rows() != 4 {
				t.Fatalf("fixture: %d plan rows, want 4 (the one-page sequence lists its page)", plan.Rows())
			}
			tc.edit(plan, l)
			err := c.Check(&f.Batch, rows, plan, l)
			switch {
			case tc.error == "" && err != nil:
				t.Fatalf("valid step refused: %v", err)
			case tc.error != "" && (err == nil || !strings.Contains(err.Error(), tc.error)):
				t.Fatalf("got %v, want an error containing %q", err, tc.error)
			}
		})
	}
}
