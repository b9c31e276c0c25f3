// Package clusterseq drives a questd cluster's sequence through the Go
// client (cluster/client) as model.EngineAttention drives a sequence of
// the in-process engine: a model.StepperSequence whose decode steps run
// batched through the client's Stepper, and whose one-layer steps (the
// diagnostics and comparisons that take a step of their own per layer)
// take and fill the engine's types. It is the per-sequence adapter that
// issue 24 keeps for one release, outside cluster/client, which imports
// no engine.
package clusterseq

import (
	"context"

	"github.com/questrt/questrt/cluster/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
)

// Sequence is a cluster sequence as model.EngineAttention drives it.
type Sequence struct{ client.Sequence }

var _ model.StepperSequence = Sequence{}

// Step runs one layer for this sequence alone (r.Seq and r.DenseLayers
// are ignored; of opt, ForceDense, Phased and Diagnostics travel) and
// fills res as engine.Step does: outputs, plan, phase times (Total: the
// coordinator's), diagnostics (pages read counted from the selection)
// and the dense reference's LSE.
func (s Sequence) Step(ctx context.Context, layer int, r engine.Request, opt engine.StepOptions, res *engine.Result) error {
	out, err := s.C.Step(ctx, layer, []client.Item{{Seq: s.ID, Q: r.Q, K: r.K, V: r.V, BudgetTokens: r.BudgetTokens}},
		client.StepOptions{ForceDense: opt.ForceDense, Phased: opt.Phased, Diagnostics: opt.Diagnostics})
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

// ForkSequence implements model.Sequence: a child sharing the parent's
// pages.
func (s Sequence) ForkSequence(ctx context.Context) (model.Sequence, error) {
	c, err := s.Fork(ctx)
	return Sequence{c}, err
}
