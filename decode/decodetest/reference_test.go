package decodetest

import (
	"context"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
)

// TestReference runs the suite on the reference itself (per_head and
// group_max).
func TestReference(t *testing.T) {
	for _, gqa := range []plan.GQAMode{plan.GroupMax, plan.PerHead} {
		t.Run(gqa.String(), func(t *testing.T) {
			Run(t, func(t *testing.T) Subject {
				c := SuggestedConfig()
				c.Policy.GQA = gqa
				r := NewReference(c)
				return Subject{Stepper: r, Config: c, Create: r.Create, Append: r.Append, Len: r.Len}
			})
		})
	}
}

// TestReferenceHandWorked checks the reference's selection and attention
// against values worked by hand: one KV head, two query heads, pages of
// 2 tokens, keys chosen so that the bound ranks the pages 2 > 0 > 1.
func TestReferenceHandWorked(t *testing.T) {
	p := plan.DefaultPolicy()
	p.PageSize, p.BudgetTokens, p.LocalPages, p.SinkPages, p.DenseLayers = 2, 4, 1, 0, 0
	c := Config{Layers: 1, Geometry: plan.Geometry{QHeads: 2, KVHeads: 1, HeadDim: 2, PageSize: 2}, Policy: p}
	r := NewReference(c)
	ctx := context.Background()
	id, _ := r.Create(ctx)
	// Pages: 0 = {(1,0),(0,1)}, 1 = {(-1,0),(0,-1)}, 2 = {(2,0),(0,0)}, 3 (tail) = {(0,0)}.
	k := []float32{1, 0, 0, 1, -1, 0, 0, -1, 2, 0, 0, 0, 0, 0}
	v := []float32{1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7}
	if err := r.Append(ctx, id, 0, k, v); err != nil {
		t.Fatal(err)
	}
	// q head 0 = (1, 0): bounds page 0: 1, page 1: 0, page 2: 2. Head 1 = (0, 1):
	// page 0: 1, page 1: 0, page 2: 0. group_max: 0: 1, 1: 0, 2: 2.
	// K = 2 pages, local 1 (page 3): one ranked page, page 2.
	st, err := r.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: id}}})
	if err != nil {
		t.Fatal(err)
	}
	var res decode.Result
	if err := st.Layer(ctx, 0, decode.Host([]float32{1, 0, 0, 1}), decode.Host(nil), decode.Host(nil), &res); err != nil {
		t.Fatal(err)
	}
	st.End(ctx)
	if want := (plan.Plan{Pages: 4, K: 2, Local: 1, Rank: 1}); res.Plans[0] != want {
		t.Fatalf("plan %+v, want %+v", res.Plans[0], want)
	}
	// Head 0 attends tokens 4 (k=(2,0)), 5 (0,0), 6 (0,0): logits 2/sqrt2, 0, 0.
	// Head 1 attends the same tokens: logits 0, 0, 0 -> v mean (6,6).
	e := float32(4.1132503787829275) // exp(sqrt 2)
	o0 := (5*e + 6 + 7) / (e + 2)
	want := []float32{o0, o0, 6, 6}
	if i, g, w := far(res.O.Data, want, 1e-6); i >= 0 {
		t.Fatalf("output %d: %v, want %v (all %v)", i, g, w, res.O.Data)
	}
}
