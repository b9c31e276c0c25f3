package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/decode/decodetest"
	"github.com/questrt/questrt/plan"
)

// TestStepperConformance runs the decode.Stepper suite on the in-process
// engine over CP x TP layouts and both exact selection modes, with both
// GQA modes: every layout equals the host reference.
func TestStepperConformance(t *testing.T) {
	for _, l := range []struct {
		cp, tp int
		sel    Selection
		gqa    plan.GQAMode
	}{
		{1, 1, Exact, plan.GroupMax}, {1, 1, Exact, plan.PerHead}, {2, 1, Exact, plan.GroupMax},
		{3, 2, Exact, plan.PerHead}, {2, 2, Replicated, plan.GroupMax},
	} {
		t.Run(fmt.Sprintf("cp%d-tp%d-%v-%v", l.cp, l.tp, l.sel, l.gqa), func(t *testing.T) {
			decodetest.Run(t, func(t *testing.T) decodetest.Subject {
				dc := decodetest.SuggestedConfig()
				dc.Policy.GQA = l.gqa
				cfg := DefaultConfig()
				cfg.Layers, cfg.Geometry, cfg.Policy = dc.Layers, dc.Geometry, dc.Policy
				cfg.CP, cfg.TP, cfg.Selection, cfg.CapacityPages = l.cp, l.tp, l.sel, 64
				e, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close() })
				return decodetest.Subject{Stepper: e, Config: dc,
					Create: func(context.Context) (decode.SeqID, error) { return e.Create(plan.Striped) },
					Append: func(_ context.Context, id decode.SeqID, layer int, k, v []float32) error {
						return e.Append(id, layer, k, v)
					},
					Len: func(_ context.Context, id decode.SeqID) (int, error) { return e.Len(id) },
				}
			})
		})
	}
}
