package demo

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/cluster/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model/clusterseq"
	"github.com/questrt/questrt/plan"
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
	s     clusterseq.Sequence
	nodes []string
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
	return &clusterDecoder{s: clusterseq.Sequence{Sequence: client.Sequence{C: c, ID: seq}}, nodes: nodes}, nil
}

func (d *clusterDecoder) append(ctx context.Context, layer int, k, v []float32) error {
	return d.s.Append(ctx, layer, k, v)
}

func (d *clusterDecoder) step(ctx context.Context, layer int, q, k, v []float32, opt engine.StepOptions, res *engine.Result) error {
	return d.s.Step(ctx, layer, engine.Request{Q: q, K: k, V: v}, opt, res)
}

func (d *clusterDecoder) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5e9)
	defer cancel()
	_ = d.s.Release(ctx)
}
