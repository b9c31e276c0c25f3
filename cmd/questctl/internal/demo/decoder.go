package demo

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
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
	s     client.Sequence
	res   decode.Result
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
	return &clusterDecoder{s: client.Sequence{C: c, ID: seq}, nodes: nodes}, nil
}

func (d *clusterDecoder) append(ctx context.Context, layer int, k, v []float32) error {
	return d.s.Append(ctx, layer, k, v)
}

// step runs a step of one layer through the client's Stepper (with
// diagnostics, a Step call that the coordinator measures). Times are
// the coordinator's with diagnostics, else the client's (the round trip
// included).
func (d *clusterDecoder) step(ctx context.Context, layer int, q, k, v []float32, opt engine.StepOptions, res *engine.Result) error {
	st, err := d.s.Stepper().Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: d.s.SeqID(), New: k != nil}}, FirstLayer: layer, Layers: 1, Options: opt})
	if err != nil {
		return err
	}
	err = st.Layer(ctx, layer, decode.Host(q), decode.Host(k), decode.Host(v), &d.res)
	if eerr := st.End(ctx); err == nil {
		err = eerr
	}
	if err != nil {
		return err
	}
	res.O, res.LSE = append(res.O[:0], d.res.O.Data...), append(res.LSE[:0], d.res.LSE...)
	res.Plans, res.Time = append(res.Plans[:0], d.res.Plans...), d.res.Time
	res.Diag = res.Diag[:0]
	if opt.Diagnostics {
		res.Diag = append(res.Diag, d.res.Diag...)
	}
	return nil
}

func (d *clusterDecoder) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5e9)
	defer cancel()
	_ = d.s.Release(ctx)
}
