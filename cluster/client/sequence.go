package client

import (
	"context"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
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
	for _, d := range out.Diag {
		res.Diag = append(res.Diag, d.Diagnostics)
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
