package evalengine

import (
	"strings"
	"testing"

	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// TestNewRunner: the engine is laid out and sized as the harness asked,
// its attentions are of the model's geometry (another is refused), and
// a fresh engine has counted no hierarchical search.
func TestNewRunner(t *testing.T) {
	g := model.Geometry{Layers: 3, Heads: 8, KVHeads: 2, HeadDim: 16}
	p := plan.DefaultPolicy()
	p.PageSize, p.BudgetTokens = 16, 64
	c := eval.RunnerConfig{Geometry: g, Policy: p, CapacityPages: 40, CP: 2, TP: 2, Selection: plan.Replicated, MemoryLimit: -1, KVDType: plan.FP8}
	r, err := NewRunner(c)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ec := r.(runner).e.Config()
	want := plan.Geometry{QHeads: 8, KVHeads: 2, HeadDim: 16, PageSize: 16, DType: plan.FP8}
	if ec.Layers != 3 || ec.Geometry != want || ec.CapacityPages != 40 || ec.CP != 2 || ec.TP != 2 ||
		ec.Selection != plan.Replicated || ec.MemoryLimit != -1 || ec.Policy.BudgetTokens != 64 {
		t.Fatalf("engine config: %d layers, %+v, %d pages, cp %d tp %d, %v, limit %d, budget %d",
			ec.Layers, ec.Geometry, ec.CapacityPages, ec.CP, ec.TP, ec.Selection, ec.MemoryLimit, ec.Policy.BudgetTokens)
	}
	a, err := r.NewAttention(g)
	if err != nil {
		t.Fatal(err)
	}
	if a.Len() != 0 {
		t.Fatalf("new attention holds %d tokens", a.Len())
	}
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	other := g
	other.KVHeads = 4
	if _, err := r.NewAttention(other); err == nil || !strings.Contains(err.Error(), "for a model of 3 layers, 8/4 heads") {
		t.Fatalf("attention of another geometry: %v, want a refusal", err)
	}
	h := r.HierCounts()
	if h.Rows != 0 || h.Pages != 0 || len(h.Hist) == 0 {
		t.Fatalf("fresh engine's counts: %+v", h)
	}
	bad := c
	bad.CP = 0
	if _, err := NewRunner(bad); err == nil {
		t.Fatal("a runner of CP 0 was built")
	}
}
