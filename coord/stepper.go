package coord

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Coordinator implements decode.Stepper over its sequences' handles.
var _ decode.Stepper = (*Coordinator)(nil)

// Handle returns the decode.Stepper handle of sequence id: the row id
// that Begin takes for it (the coordinator's Stepper names sequences by
// handles, not by their string ids). A handle is unique in this
// coordinator for as long as it lives and is never reused.
func (c *Coordinator) Handle(id string) (decode.SeqID, error) {
	s, err := c.lookup(id)
	if err != nil {
		return 0, err
	}
	return s.h, nil
}

// lookupHandle returns the sequence of handle h, refusing those of a
// lost grid.
func (c *Coordinator) lookupHandle(h decode.SeqID) (*seq, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	s, ok := c.handles[h]
	if !ok {
		return nil, fmt.Errorf("sequence handle %d: %w", h, ErrUnknownSequence)
	}
	if err := c.aliveLocked(s.g); err != nil {
		return nil, fmt.Errorf("sequence handle %d: %w", h, err)
	}
	return s, nil
}

// Begin implements decode.Stepper: rows name sequences by their handles
// (Handle). The rows of each grid become one engine step of that grid
// (Begin on its engine: one BeginStep per worker), the grids' steps
// opened in a fixed order so that concurrent steps over the same grids
// cannot wait on each other; the step's layers run the grids
// concurrently. A grid that loses a node fails the step with
// ErrGridLost (see Step for the nodes blamed).
func (c *Coordinator) Begin(ctx context.Context, b decode.Batch) (decode.Step, error) {
	if len(b.Rows) == 0 {
		return nil, fmt.Errorf("begin step: %w: no rows", engine.ErrBadInput)
	}
	st := &coordStep{c: c, n: len(b.Rows), start: time.Now(), stats: StepStats{Kind: "steps", Items: len(b.Rows)}}
	by := map[*grid]*gridStep{}
	seen := map[decode.SeqID]bool{}
	nNew := 0
	for i, r := range b.Rows {
		if seen[r.Seq] {
			return nil, fmt.Errorf("begin step: rows[%d]: %w: sequence handle %d appears twice", i, engine.ErrBadInput, r.Seq)
		}
		seen[r.Seq] = true
		s, err := c.lookupHandle(r.Seq)
		if err != nil {
			return nil, fmt.Errorf("begin step: rows[%d]: %w", i, err)
		}
		if len(st.parts) > 0 && s.g.ec.Geometry != st.parts[0].g.ec.Geometry {
			return nil, fmt.Errorf("begin step: rows[%d]: %w: sequence handle %d has another geometry than rows[0]'s", i, engine.ErrBadInput, r.Seq)
		}
		p := by[s.g]
		if p == nil {
			p = &gridStep{g: s.g, b: decode.Batch{FirstLayer: b.FirstLayer, Layers: b.Layers, Options: b.Options}}
			by[s.g] = p
			st.parts = append(st.parts, p)
		}
		row := r
		row.Seq = s.id
		p.idx = append(p.idx, i)
		p.b.Rows = append(p.b.Rows, row)
		at := -1
		if r.New {
			at = nNew
			nNew++
			p.nNew++
		}
		p.kvAt = append(p.kvAt, at)
	}
	st.geo = st.parts[0].g.ec.Geometry
	st.whole = len(st.parts) == 1
	slices.SortFunc(st.parts, func(a, b *gridStep) int { return cmp.Compare(a.g.key, b.g.key) })
	for i, p := range st.parts {
		var es decode.Step
		peers, err := c.onGrid(ctx, p.g, func(ctx context.Context) error {
			var err error
			es, err = p.g.eng.Begin(ctx, p.b)
			return err
		})
		if err != nil {
			if len(p.b.Rows) == 1 {
				c.damageOne(p.g, []engine.SeqID{p.b.Rows[0].Seq}, err)
			}
			for _, q := range st.parts[:i] {
				_ = q.step.End(ctx)
			}
			st.stats.PeerErrors = peers
			st.stats.Time.Total = time.Since(st.start)
			c.observe(ctx, st.stats, err)
			return nil, fmt.Errorf("begin step: %w", err)
		}
		p.step = es
	}
	return st, nil
}

// gridStep is one grid's part of a coordinator step.
type gridStep struct {
	g    *grid
	b    decode.Batch // the grid's rows, with engine ids
	idx  []int        // their indices in the step's rows
	kvAt []int        // per row: its new token's index among the step's (-1: none)
	nNew int
	step decode.Step // the grid engine's open step
	// Layer scratch (unused when the step has one grid).
	q, k, v []float32
	res     decode.Result
	err     error
	peers   []PeerError
}

// coordStep is an open step of a Coordinator.
type coordStep struct {
	c      *Coordinator
	n      int
	geo    plan.Geometry
	parts  []*gridStep
	whole  bool // one grid: inputs and outputs pass through
	failed error
	// abandoned is why the caller ended the step early (outcome).
	abandoned error
	ended     bool
	start     time.Time
	stats     StepStats
}

// Layer implements decode.Step.
func (st *coordStep) Layer(ctx context.Context, layer int, q, k, v decode.Tensor, res *decode.Result) error {
	switch {
	case st.ended:
		return fmt.Errorf("layer %d: %w", layer, decode.ErrStepEnded)
	case st.failed != nil:
		return fmt.Errorf("layer %d: %w: %w", layer, decode.ErrStepFailed, st.failed)
	}
	if st.whole {
		p := st.parts[0]
		var peers []PeerError
		var err error
		peers, err = st.c.onGrid(ctx, p.g, func(ctx context.Context) error { return p.step.Layer(ctx, layer, q, k, v, res) })
		if err != nil {
			st.fail(err, peers)
			return err
		}
		st.layerDone(res.Plans, res.Time, p.g.ec.KVHeads)
		return nil
	}
	// Several grids: the inputs split by grid, the outputs gathered in
	// row order. Every input is checked first, so that a bad one fails
	// before any grid took a token.
	qr, kr := st.geo.QRow(), st.geo.KVRow()
	qd, kd, vd, err := decode.HostInputs(q, k, v)
	if err != nil {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	nNew := 0
	for _, p := range st.parts {
		nNew += p.nNew
	}
	if len(qd) != st.n*qr || len(kd) != nNew*kr || len(vd) != len(kd) || !kernels.Finite(qd) || !kernels.Finite(kd) || !kernels.Finite(vd) {
		return fmt.Errorf("layer %d: %w: q, k and v must be [%d][%d], [%d][%d] and [%d][%d] finite floats", layer, engine.ErrBadInput, st.n, qr, nNew, kr, nNew, kr)
	}
	for _, x := range []struct {
		what string
		v    []float32
	}{{"q", qd}, {"k", kd}} {
		if err := decode.CheckMagnitude(x.what, x.v, st.geo.HeadDim); err != nil {
			return fmt.Errorf("layer %d: %w", layer, err)
		}
	}
	out, err := res.Output(st.n * qr)
	if err != nil {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	var wg sync.WaitGroup
	for _, p := range st.parts {
		p.q, p.k, p.v = p.q[:0], p.k[:0], p.v[:0]
		for j, i := range p.idx {
			p.q = append(p.q, qd[i*qr:(i+1)*qr]...)
			if x := p.kvAt[j]; x >= 0 {
				p.k = append(p.k, kd[x*kr:(x+1)*kr]...)
				p.v = append(p.v, vd[x*kr:(x+1)*kr]...)
			}
		}
		p.res.O = decode.Tensor{}
		wg.Go(func() {
			p.peers, p.err = st.c.onGrid(ctx, p.g, func(ctx context.Context) error {
				return p.step.Layer(ctx, layer, decode.Host(p.q), decode.Host(p.k), decode.Host(p.v), &p.res)
			})
		})
	}
	wg.Wait()
	var first, beginRefused error
	ran, nrefused := 0, 0
	var peers []PeerError
	for _, p := range st.parts {
		switch {
		case p.err == nil:
			ran++
		case refused(p.err):
			nrefused++
		case errors.Is(p.err, decode.ErrBeginRefused) && !errors.Is(p.err, decode.ErrStepFailed):
			nrefused++
			beginRefused = cmp.Or(beginRefused, p.err)
		}
		if p.err != nil && first == nil {
			first = p.err
		}
		if p.err != nil && len(p.b.Rows) == 1 {
			st.c.damageOne(p.g, []engine.SeqID{p.b.Rows[0].Seq}, p.err)
		}
		for _, pe := range p.peers {
			peers = appendPeer(peers, pe)
		}
	}
	if first != nil {
		if ran == 0 && nrefused == len(st.parts) && beginRefused != nil {
			// A grid's step did not open (learnt now: its begin went
			// ahead of the layer) and no grid ran the layer: nothing
			// changed, and the step is over.
			st.failed = beginRefused
			return fmt.Errorf("layer %d: %w", layer, beginRefused)
		}
		if ran == 0 && nrefused == len(st.parts) {
			// Every grid refused with nothing changed: the step goes on.
			return fmt.Errorf("layer %d: %w", layer, first)
		}
		// Some grid took the layer's tokens (another refused what this
		// coordinator could not check: a sequence whose layers differ
		// in length) or failed running it: the step cannot go on.
		st.failed = first
		for _, pe := range peers {
			st.stats.PeerErrors = appendPeer(st.stats.PeerErrors, pe)
		}
		return fmt.Errorf("layer %d: %w: %w", layer, decode.ErrStepFailed, first)
	}
	res.LSE = resize(res.LSE, st.n*st.geo.QHeads)
	res.Plans = append(res.Plans[:0], make([]plan.Plan, st.n)...)
	for pi, p := range st.parts {
		o := p.res.O.Data
		for j, i := range p.idx {
			copy(out[i*qr:(i+1)*qr], o[j*qr:(j+1)*qr])
			copy(res.LSE[i*st.geo.QHeads:(i+1)*st.geo.QHeads], p.res.LSE[j*st.geo.QHeads:])
			res.Plans[i] = p.res.Plans[j]
		}
		if pi == 0 {
			res.Time = p.res.Time
		}
		st.stats.addPlans(p.res.Plans, p.g.ec.KVHeads)
	}
	st.stats.Layers++
	st.addTimes(res.Time)
	return nil
}

// layerDone counts a layer that came back in the step's stats.
func (st *coordStep) layerDone(plans []plan.Plan, t decode.Times, kvHeads int) {
	st.stats.Layers++
	st.stats.addPlans(plans, kvHeads)
	st.addTimes(t)
}

func (st *coordStep) addTimes(t decode.Times) {
	s := &st.stats.Time
	s.Score += t.Score
	s.TopK += t.TopK
	s.Select += t.Select
	s.Attend += t.Attend
	s.Merge += t.Merge
	s.Fused += t.Fused
}

// fail records the step's failure, unless it is bad input the grid
// refused with nothing changed.
func (st *coordStep) fail(err error, peers []PeerError) {
	if refused(err) {
		return
	}
	st.failed = err
	for _, pe := range peers {
		st.stats.PeerErrors = appendPeer(st.stats.PeerErrors, pe)
	}
}

// refused reports whether a grid's step refused err's layer with nothing
// changed (bad input, a device tensor): the step goes on.
func refused(err error) bool {
	return (errors.Is(err, engine.ErrBadInput) || errors.Is(err, decode.ErrDeviceTensor)) && !errors.Is(err, decode.ErrStepFailed)
}

// outcome records why the caller ends the step early (nil: it ran as
// the caller wanted), for the stats End reports.
func (st *coordStep) outcome(err error) {
	if err != nil && st.failed == nil {
		st.abandoned = err
	}
}

// End implements decode.Step: every grid's step ends, and the step's
// stats go to Config.Observe (Kind "steps") with the step's failure, or
// the reason its caller gave up (see outcome).
func (st *coordStep) End(ctx context.Context) error {
	if st.ended {
		return decode.ErrStepEnded
	}
	st.ended = true
	var first error
	for _, p := range st.parts {
		if err := p.step.End(ctx); err != nil && first == nil {
			first = err
		}
	}
	st.stats.Time.Total = time.Since(st.start)
	st.c.observe(ctx, st.stats, cmp.Or(st.failed, st.abandoned, first))
	return first
}
