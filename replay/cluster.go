package replay

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
)

// RunCluster runs the case through a questd cluster: one sequence created
// through cl's node with the case's own config (its geometry, one sparse
// layer, the case's policy with opt.Selector, opt's CP x TP grid and
// selection mode, each rank's share of the pages), the case's tokens
// appended, one step with diagnostics. The cluster's own defaults do not
// matter. The result is the in-process one's: the pages read, scores,
// recall, attention mass and output error all come from the cluster's
// diagnostics.
func RunCluster(ctx context.Context, c *Case, opt Options, cl *client.Client) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	cp, tp := max(opt.CP, 1), max(opt.TP, 1)
	cfg := worker.Config{Layers: 1, Geometry: c.PlanGeometry(), CP: cp, TP: tp,
		Capacity: rankCapacity(c.Pages(), cp, opt.Placement, engine.DefaultConfig().BlockPages),
		Policy:   c.Policy(opt.Selector), Mode: opt.Selection}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	seq, _, err := cl.CreateWith(ctx, opt.Placement, remote.GridConfigProto(cfg))
	if err != nil {
		return nil, fmt.Errorf("replay: create: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5e9)
		defer cancel()
		_ = cl.Release(rctx, seq)
	}()
	if err := cl.Append(ctx, seq, 0, TokenMajor(c.Keys, c.HeadDim), TokenMajor(c.Values, c.HeadDim)); err != nil {
		return nil, fmt.Errorf("replay: append: %w", err)
	}
	q := flatten(c.Query)
	res, err := cl.Step(ctx, 0, []client.Item{{Seq: seq, Q: q}}, client.StepOptions{Diagnostics: true})
	if err != nil {
		return nil, fmt.Errorf("replay: step: %w", err)
	}
	return NewResult(opt.Selector, c.QHeads, c.HeadDim, c.Pages(), res.O, res.LSE, res.Diag[0].Diagnostics), nil
}
