package coord

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// StepItem is one sequence's part of a step.
type StepItem struct {
	Seq string
	engine.Request
}

// Step runs one decode step of one layer for a batch of sequences: the
// items of each grid as one engine step, the grids concurrently; res
// gets the outputs in item order (Plans, O, LSE, DenseLSE and Diag as
// engine.Result), Time of the first grid.
func (c *Coordinator) Step(ctx context.Context, layer int, items []StepItem, opt engine.StepOptions, res *engine.Result) (err error) {
	st := StepStats{Kind: "step", Items: len(items)}
	defer func() { c.observe(ctx, st, err) }()
	return c.step(ctx, layer, items, opt, res, &st)
}

// step is Step; it fills st once the step ran.
func (c *Coordinator) step(ctx context.Context, layer int, items []StepItem, opt engine.StepOptions, res *engine.Result, st *StepStats) error {
	if len(items) == 0 {
		return fmt.Errorf("step: %w: no items", engine.ErrBadInput)
	}
	type part struct {
		g     *grid
		idx   []int
		reqs  []engine.Request
		res   engine.Result
		err   error
		peers []PeerError
		start time.Time
	}
	var parts []*part
	by := map[*grid]*part{}
	seen := map[string]bool{}
	for i, it := range items {
		if seen[it.Seq] {
			return fmt.Errorf("step: items[%d]: %w: sequence %q appears twice", i, engine.ErrBadInput, it.Seq)
		}
		seen[it.Seq] = true
		s, err := c.lookup(it.Seq)
		if err != nil {
			return fmt.Errorf("step: items[%d]: %w", i, err)
		}
		if len(parts) > 0 && (s.g.ec.QHeads != parts[0].g.ec.QHeads || s.g.ec.HeadDim != parts[0].g.ec.HeadDim) {
			return fmt.Errorf("step: items[%d]: %w: sequence %q has another geometry than items[0]'s", i, engine.ErrBadInput, it.Seq)
		}
		p := by[s.g]
		if p == nil {
			p = &part{g: s.g}
			by[s.g] = p
			parts = append(parts, p)
		}
		r := it.Request
		r.Seq = s.id
		p.idx = append(p.idx, i)
		p.reqs = append(p.reqs, r)
	}
	start := time.Now()
	defer func() {
		if st.Layers == 0 {
			st.Time.Total = time.Since(start) // failed: how long until it did
		}
	}()
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(func() {
			p.peers, p.err = c.onGrid(ctx, p.g, func(ctx context.Context) error { return p.g.eng.Step(ctx, layer, p.reqs, opt, &p.res) })
		})
	}
	wg.Wait()
	var failed error
	for _, p := range parts {
		if p.err != nil && failed == nil {
			failed = p.err
		}
		if p.err != nil && len(p.reqs) == 1 {
			c.damageOne(p.g, []engine.SeqID{p.reqs[0].Seq}, p.err)
		}
		for _, pe := range p.peers {
			st.PeerErrors = appendPeer(st.PeerErrors, pe)
		}
	}
	if failed != nil {
		return failed
	}
	cfg := parts[0].g.ec
	qd, qh := cfg.QHeads*cfg.HeadDim, cfg.QHeads
	n := len(items)
	res.O = resize(res.O, n*qd)
	res.LSE = resize(res.LSE, n*qh)
	res.Plans = append(res.Plans[:0], make([]plan.Plan, n)...)
	res.Diag = res.Diag[:0]
	res.DenseLSE = res.DenseLSE[:0]
	if opt.Diagnostics {
		res.Diag = append(res.Diag, make([]shard.Diagnostics, n)...)
		res.DenseLSE = resize(res.DenseLSE, n*qh)
	}
	for pi, p := range parts {
		for j, i := range p.idx {
			copy(res.O[i*qd:(i+1)*qd], p.res.O[j*qd:])
			copy(res.LSE[i*qh:(i+1)*qh], p.res.LSE[j*qh:])
			res.Plans[i] = p.res.Plans[j]
			if opt.Diagnostics {
				res.Diag[i] = p.res.Diag[j]
				copy(res.DenseLSE[i*qh:(i+1)*qh], p.res.DenseLSE[j*qh:])
			}
		}
		if pi == 0 {
			res.Time = p.res.Time
		}
		st.addPlans(p.res.Plans, p.g.ec.KVHeads)
	}
	st.Time, st.Layers = res.Time, 1
	return nil
}

// onGrid runs f on grid g with a context that ends with ctx or when g is
// lost (the steps in flight end at once), and returns f's error naming
// the loss of the grid when there was one, and the nodes to blame for it
// (see [blame]).
func (c *Coordinator) onGrid(ctx context.Context, g *grid, f func(ctx context.Context) error) ([]PeerError, error) {
	gctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(g.ctx, func() { cancel(context.Cause(g.ctx)) })
	log := &peerLog{}
	err := f(context.WithValue(gctx, peerLogKey{}, log))
	stop()
	cause := context.Cause(gctx) // before cancel(nil): nil unless ctx or g ended it
	cancel(nil)
	if err == nil {
		return nil, nil
	}
	log.mu.Lock()
	peers := blame(cause, log.fails)
	log.mu.Unlock()
	return peers, c.check(g, err)
}

func resize(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
