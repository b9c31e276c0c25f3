package demo

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/cluster/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// decoder is what the demo drives: one sequence's appends and steps, on
// the in-process engine or through a questd cluster.
type decoder interface {
	append(ctx context.Context, layer int, k, v []float32) error
	step(ctx context.Context, layer int, q, k, v []float32, opt engine.StepOptions, res *engine.Result) error
	close()
}

// engineDecoder runs on an in-process engine.
type engineDecoder struct {
	e  *engine.Engine
	id engine.SeqID
}

func newEngineDecoder(ec engine.Config) (*engineDecoder, error) {
	e, err := engine.New(ec)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	id, err := e.Create(plan.Striped)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("demo: %w", err)
	}
	return &engineDecoder{e: e, id: id}, nil
}

func (d *engineDecoder) append(_ context.Context, layer int, k, v []float32) error {
	return d.e.Append(d.id, layer, k, v)
}

func (d *engineDecoder) step(ctx context.Context, layer int, q, k, v []float32, opt engine.StepOptions, res *engine.Result) error {
	return d.e.Step(ctx, layer, []engine.Request{{Seq: d.id, Q: q, K: k, V: v}}, opt, res)
}

func (d *engineDecoder) close() { d.e.Close() }

// clusterDecoder runs through a questd cluster's client API (its
// diagnostics computed by the coordinator, the keys read back from the
// nodes).
type clusterDecoder struct {
	c     *client.Client
	seq   string
	nodes []string
	group int // query heads per KV head
}

func newClusterDecoder(ctx context.Context, c *client.Client, cfg Config) (*clusterDecoder, error) {
	g := c.Geometry()
	ec := cfg.engineConfig(nil)
	if g.Layers != ec.Layers || g.QHeads != ec.QHeads || g.KVHeads != ec.KVHeads || g.HeadDim != ec.HeadDim ||
		g.PageSize != ec.PageSize || g.CP != ec.CP || g.TP != ec.TP || g.Selection != ec.Selection ||
		g.Policy.BudgetTokens != ec.Policy.BudgetTokens || g.Policy.DenseLayers != ec.Policy.DenseLayers ||
		g.Policy.Selector != ec.Policy.Selector || g.Policy.GQA != ec.Policy.GQA {
		return nil, fmt.Errorf("demo: the cluster runs another geometry or policy (%+v) than the demo's", g)
	}
	seq, nodes, err := c.Create(ctx, plan.Striped)
	if err != nil {
		return nil, fmt.Errorf("demo: create: %w", err)
	}
	return &clusterDecoder{c: c, seq: seq, nodes: nodes, group: g.QHeads / g.KVHeads}, nil
}

func (d *clusterDecoder) append(ctx context.Context, layer int, k, v []float32) error {
	return d.c.Append(ctx, d.seq, layer, k, v)
}

func (d *clusterDecoder) step(ctx context.Context, layer int, q, k, v []float32, opt engine.StepOptions, res *engine.Result) error {
	r, err := d.c.Step(ctx, layer, []client.Item{{Seq: d.seq, Q: q, K: k, V: v}},
		client.StepOptions{ForceDense: opt.ForceDense, Phased: opt.Phased, Diagnostics: opt.Diagnostics})
	if err != nil {
		return err
	}
	res.O, res.LSE, res.Plans = r.O, r.LSE, r.Plans
	res.Time = engine.Times{Score: r.Time.Score, TopK: r.Time.TopK, Select: r.Time.Select, Attend: r.Time.Attend,
		Merge: r.Time.Merge, Fused: r.Time.Fused, Total: r.Total}
	res.Diag = res.Diag[:0]
	for i, cd := range r.Diag {
		dg := shard.Diagnostics{Selected: cd.Selected, Scores: cd.Scores, RelL2: cd.RelL2, AbsL2: cd.AbsL2,
			Recall: cd.Recall, MassRecall: cd.MassRecall, MinMassRecall: cd.MinMassRecall}
		dg.CountPages(d.group, r.Plans[i].Pages)
		res.Diag = append(res.Diag, dg)
	}
	return nil
}

func (d *clusterDecoder) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5e9)
	defer cancel()
	_ = d.c.Release(ctx, d.seq)
}
