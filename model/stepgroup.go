package model

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

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
	// what needs a step of its own per layer, such as diagnostics), and
	// then s still names the Stepper those per-layer steps run on (nil:
	// none), so that no step of it is held open meanwhile.
	DecodeRow() (s decode.Stepper, row decode.Row, opt decode.Options, ok bool)
	// Decoded records that a batched step ran layer for this sequence:
	// q, k and v were its inputs, out is its output, pl its page plan and
	// t the layer's times (the whole batch's).
	Decoded(layer int, q, k, v, out []float32, pl plan.Plan, t decode.Times)
}

// stepGroup is the sequences of one DecodeBatch that share a Stepper:
// one decode step for them all.
type stepGroup struct {
	s     decode.Stepper
	opt   decode.Options
	idx   []int // batch indices, ascending
	attns []BatchAttention
	rows  []decode.Row
	step  decode.Step
	err   error // the step's failure (a layer's, or Begin's)
	// Layer scratch: the group's rows gathered from the batch (nil when
	// the group is the whole batch in order).
	q, k, v, o []float32
	whole      bool
	res        decode.Result
}

// groupRows splits a batch into step groups, one per Stepper, and the
// indices that decode alone (layer by layer through Attention.Decode).
// Every row of a Stepper goes alone when one of them must (it asks for a
// step per layer) or when their options differ: a Stepper runs one step
// at a time, so its rows cannot be split between a step and per-layer
// calls or two steps of one token. A Stepper whose type is not
// comparable decodes its rows alone.
func (m *Model) groupRows(attns []Attention) (groups []*stepGroup, alone []int) {
	by := map[decode.Stepper]*stepGroup{}
	split := map[decode.Stepper]bool{} // Steppers whose rows go alone
	type entry struct {
		s   decode.Stepper
		row decode.Row
		opt decode.Options
		ok  bool
	}
	entries := make([]entry, len(attns))
	for i, a := range attns {
		ba, ok := a.(BatchAttention)
		if !ok {
			continue
		}
		s, row, opt, ok := ba.DecodeRow()
		if s == nil || !reflect.TypeOf(s).Comparable() {
			continue
		}
		entries[i] = entry{s, row, opt, ok}
		g := by[s]
		switch {
		case !ok:
			split[s] = true
		case g == nil:
			g = &stepGroup{s: s, opt: opt}
			by[s] = g
			groups = append(groups, g)
		case g.opt != opt:
			split[s] = true
		}
	}
	for i, a := range attns {
		e := entries[i]
		if e.s == nil || split[e.s] {
			alone = append(alone, i)
			continue
		}
		g := by[e.s]
		g.idx = append(g.idx, i)
		g.attns = append(g.attns, a.(BatchAttention))
		g.rows = append(g.rows, e.row)
	}
	groups = slices.DeleteFunc(groups, func(g *stepGroup) bool { return split[g.s] })
	for _, g := range groups {
		g.whole = len(g.idx) == len(attns)
	}
	return groups, alone
}

// begin opens the group's step. A refusal that is not a busy Stepper
// (ErrStepOpen) returns false: nothing changed, and the caller decodes
// the group's rows alone, which names the rows at fault. A busy Stepper
// fails every row at the first layer.
func (g *stepGroup) begin(ctx context.Context) bool {
	st, err := g.s.Begin(ctx, decode.Batch{Rows: g.rows, Options: g.opt})
	switch {
	case err == nil:
		g.step = st
	case errors.Is(err, decode.ErrStepOpen):
		g.err = fmt.Errorf("begin step: %w", err)
	default:
		return false
	}
	return true
}

// refusedAhead reports whether err, a group's first Layer error, is its
// Begin's refusal learnt there (decode.ErrBeginRefused: a Stepper that
// sends its begin ahead of the first layer) other than a busy Stepper:
// nothing ran, and the group's rows decode alone from that layer on, as
// after a Begin that refused them.
func refusedAhead(err error) bool {
	return errors.Is(err, decode.ErrBeginRefused) && !errors.Is(err, decode.ErrStepFailed) && !errors.Is(err, decode.ErrStepOpen)
}

// beginGroups opens every group's step; the rows of the groups whose
// Begin refused the batch join alone (kept ascending).
func beginGroups(ctx context.Context, groups []*stepGroup, alone []int) ([]*stepGroup, []int) {
	kept := groups[:0]
	for _, g := range groups {
		if g.begin(ctx) {
			kept = append(kept, g)
			continue
		}
		alone = append(alone, g.idx...)
	}
	slices.Sort(alone)
	return kept, alone
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
		// End it now: the open step holds its Stepper (other callers
		// wait for it) for nothing.
		g.step.End(ctx)
		g.step = nil
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
