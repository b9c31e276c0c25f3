package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/questrt/questrt/cluster/client"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// ErrMismatch: the cluster's geometry or policy is not the case's.
var ErrMismatch = errors.New("the cluster does not run this case")

// RunCluster runs the case through a questd cluster: one sequence created
// through cl's node, the case's tokens appended to layer 0, one step with
// diagnostics. The cluster's geometry and policy must be the case's (its
// layer 0 sparse: --dense-layers 0), and its selector sel; a mismatch is
// refused naming each field. The result is the in-process one's: the
// pages read, scores, recall, attention mass and output error all come
// from the cluster's diagnostics.
func RunCluster(ctx context.Context, c *Case, sel plan.Selector, placement plan.Placement, cl *client.Client) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	g := cl.Geometry()
	want := c.Policy(sel)
	var bad []string
	check := func(name string, have, want any) {
		if have != want {
			bad = append(bad, fmt.Sprintf("%s %v (the case needs %v)", name, have, want))
		}
	}
	check("q-heads", g.QHeads, c.QHeads)
	check("kv-heads", g.KVHeads, c.KVHeads)
	check("head-dim", g.HeadDim, c.HeadDim)
	check("page-size", g.PageSize, c.PageSize)
	check("dense-layers", g.Policy.DenseLayers, 0)
	check("sink-pages", g.Policy.SinkPages, want.SinkPages)
	check("local-pages", g.Policy.LocalPages, want.LocalPages)
	check("gqa", g.Policy.GQA, want.GQA)
	check("selector", g.Policy.Selector, want.Selector)
	if len(bad) > 0 {
		return nil, fmt.Errorf("replay: %w: %s", ErrMismatch, strings.Join(bad, ", "))
	}
	seq, _, err := cl.Create(ctx, placement)
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
	res, err := cl.Step(ctx, 0, []client.Item{{Seq: seq, Q: q, BudgetTokens: c.BudgetTokens}}, client.StepOptions{Diagnostics: true})
	if err != nil {
		return nil, fmt.Errorf("replay: step: %w", err)
	}
	cd := res.Diag[0]
	pages := c.Pages()
	dg := shard.Diagnostics{Selected: cd.Selected, Scores: cd.Scores, RelL2: cd.RelL2, AbsL2: cd.AbsL2,
		Recall: cd.Recall, MassRecall: cd.MassRecall, MinMassRecall: cd.MinMassRecall}
	dg.CountPages(c.QHeads/c.KVHeads, pages)
	return NewResult(sel, c.QHeads, c.HeadDim, pages, res.O, res.LSE, dg), nil
}
