package model

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
)

// BatchAttention is an [Attention] whose decode steps can join a batch
// that runs through a decode.Stepper: [Model.DecodeBatch] makes the
// sequences of one Stepper (and step options) one step per token, with
// one Layer call per layer for all of them, instead of one step per
// sequence and layer.
type BatchAttention interface {
	Attention
	// DecodeRow returns the Stepper the sequence's next decode step runs
	// on, its row (the sequence with a new token) and the step's options;
	// ok false makes DecodeBatch call Decode layer by layer instead (for
	// what needs a step of its own per layer, such as diagnostics).
	DecodeRow() (s decode.Stepper, row decode.Row, opt decode.Options, ok bool)
	// Decoded records that a batched step ran layer for this sequence:
	// q, k and v were its inputs, out is its output, pl its page plan and
	// t the layer's times (the whole batch's).
	Decoded(layer int, q, k, v, out []float32, pl plan.Plan, t decode.Times)
}

// stepGroup is the sequences of one DecodeBatch that share a Stepper and
// options: one decode step for them all.
type stepGroup struct {
	key   groupKey
	idx   []int // batch indices, ascending
	attns []BatchAttention
	rows  []decode.Row
	step  decode.Step
	err   error // Begin's failure
	// Layer scratch: the group's rows gathered from the batch (nil when
	// the group is the whole batch in order).
	q, k, v, o []float32
	whole      bool
	res        decode.Result
}

type groupKey struct {
	s   decode.Stepper
	opt decode.Options
}

// groupRows splits a batch into step groups and the indices that decode
// alone.
func (m *Model) groupRows(attns []Attention) (groups []*stepGroup, alone []int) {
	by := map[groupKey]*stepGroup{}
	for i, a := range attns {
		ba, ok := a.(BatchAttention)
		if !ok {
			alone = append(alone, i)
			continue
		}
		s, row, opt, ok := ba.DecodeRow()
		if !ok || s == nil {
			alone = append(alone, i)
			continue
		}
		key := groupKey{s, opt}
		g := by[key]
		if g == nil {
			g = &stepGroup{key: key}
			by[key] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.attns = append(g.attns, ba)
		g.rows = append(g.rows, row)
	}
	for _, g := range groups {
		g.whole = len(g.idx) == len(attns)
	}
	return groups, alone
}

// begin opens the group's step; a failure fails every row at the first
// layer.
func (g *stepGroup) begin(ctx context.Context) {
	g.step, g.err = g.key.s.Begin(ctx, decode.Batch{Rows: g.rows, Options: g.key.opt})
	if g.err != nil {
		g.err = fmt.Errorf("begin step: %w", g.err)
	}
}

// layer runs layer li for the group's rows of the batch's q, k, v (rows
// of qd and kvd floats) and writes their outputs into o.
func (g *stepGroup) layer(ctx context.Context, li int, q, k, v, o []float32, qd, kvd int) error {
	if g.err != nil {
		return g.err
	}
	gq, gk, gv, gout := q, k, v, o
	if !g.whole {
		n := len(g.idx)
		g.q, g.k, g.v = grow(g.q, n*qd), grow(g.k, n*kvd), grow(g.v, n*kvd)
		g.o = grow(g.o, n*qd)
		for j, i := range g.idx {
			copy(g.q[j*qd:(j+1)*qd], q[i*qd:(i+1)*qd])
			copy(g.k[j*kvd:(j+1)*kvd], k[i*kvd:(i+1)*kvd])
			copy(g.v[j*kvd:(j+1)*kvd], v[i*kvd:(i+1)*kvd])
		}
		gq, gk, gv, gout = g.q, g.k, g.v, g.o
	}
	g.res.O = decode.Host(gout)
	if err := g.step.Layer(ctx, li, decode.Host(gq), decode.Host(gk), decode.Host(gv), &g.res); err != nil {
		g.err = err
		return err
	}
	for j, i := range g.idx {
		out := o[i*qd : (i+1)*qd]
		if !g.whole {
			copy(out, g.o[j*qd:(j+1)*qd])
		}
		g.attns[j].Decoded(li, q[i*qd:(i+1)*qd], k[i*kvd:(i+1)*kvd], v[i*kvd:(i+1)*kvd], out, g.res.Plans[j], g.res.Time)
	}
	return nil
}

// end closes the group's step once; its error is End's when every layer
// ran.
func (g *stepGroup) end(ctx context.Context) error {
	if g.step == nil {
		return nil
	}
	st := g.step
	g.step = nil
	err := st.End(ctx)
	if g.err != nil {
		return nil // the layer's failure already failed the rows
	}
	if err != nil {
		return fmt.Errorf("end step: %w", err)
	}
	return nil
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
