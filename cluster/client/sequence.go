package client

import (
	"context"
	"math"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/shard"
)

// Sequence is one sequence of a cluster with the in-process engine's
// types: model.EngineAttention and the demo drive it as they drive an
// engine sequence.
type Sequence struct {
	C  *Client
	ID string
}

// Append appends tokens to one layer.
func (s Sequence) Append(ctx context.Context, layer int, k, v []float32) error {
	return s.C.Append(ctx, s.ID, layer, k, v)
}

// Step runs one layer for this sequence (r.Seq is ignored) and fills res
// as engine.Step does: outputs, plan, phase times (Total: the
// coordinator's), diagnostics (pages read counted from the selection).
func (s Sequence) Step(ctx context.Context, layer int, r engine.Request, opt engine.StepOptions, res *engine.Result) error {
	out, err := s.C.Step(ctx, layer, []Item{{Seq: s.ID, Q: r.Q, K: r.K, V: r.V, BudgetTokens: r.BudgetTokens}},
		StepOptions{ForceDense: opt.ForceDense, Phased: opt.Phased, Diagnostics: opt.Diagnostics})
	if err != nil {
		return err
	}
	res.O, res.LSE, res.Plans = out.O, out.LSE, out.Plans
	res.Time = engine.Times{Score: out.Time.Score, TopK: out.Time.TopK, Select: out.Time.Select, Attend: out.Time.Attend,
		Merge: out.Time.Merge, Fused: out.Time.Fused, Total: out.Total}
	res.Diag, res.DenseLSE = res.Diag[:0], res.DenseLSE[:0]
	g := s.C.geoOf(s.ID)
	for i, d := range out.Diag {
		dg := shard.Diagnostics{Selected: d.Selected, Scores: d.Scores, RelL2: d.RelL2, AbsL2: d.AbsL2,
			Recall: d.Recall, MassRecall: d.MassRecall, MinMassRecall: d.MinMassRecall,
			// The client API does not carry the page slack yet.
			SlackP50: math.NaN(), SlackP90: math.NaN(), SlackMax: math.NaN()}
		dg.CountPages(g.QHeads/max(g.KVHeads, 1), out.Plans[i].Pages)
		res.Diag = append(res.Diag, dg)
		res.DenseLSE = append(res.DenseLSE, d.DenseLSE...)
	}
	return nil
}

// Stepper is the client (model.StepperSequence: the sequence's decode
// steps run batched through its Steps stream); SeqID its handle there.
func (s Sequence) Stepper() decode.Stepper { return s.C }

// SeqID returns the sequence's handle in the client's Stepper.
func (s Sequence) SeqID() decode.SeqID { return s.C.Handle(s.ID) }

// Fork makes a child sharing the parent's pages.
func (s Sequence) Fork(ctx context.Context) (Sequence, error) {
	id, err := s.C.Fork(ctx, s.ID)
	return Sequence{s.C, id}, err
}

// Release frees the sequence.
func (s Sequence) Release(ctx context.Context) error { return s.C.Release(ctx, s.ID) }
