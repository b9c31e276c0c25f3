package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/worker"
)

// turn is the engine's lock. A call holds it for its duration; an open
// decode step holds it from Begin to End, so that no sequence operation
// or other step reaches the workers between two of its layers. Begin
// waits for it under a context, the other calls without one (as for a
// mutex).
type turn chan struct{}

// Lock waits for the turn.
func (t turn) Lock() { t <- struct{}{} }

// Unlock gives the turn back.
func (t turn) Unlock() { <-t }

// lockCtx waits for the turn until ctx is done.
func (t turn) lockCtx(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case t <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Engine implements decode.Stepper.
var _ decode.Stepper = (*Engine)(nil)

// Begin opens a decode step for batch b (decode.Stepper): it checks the
// batch against the sequence table, plans it at b.FirstLayer and sends
// one BeginStep to every worker carrying the plan. The step then runs
// one parallel round of Layer calls per layer (Step.Layer) and one
// EndStep per worker (Step.End): 2W + L x W worker calls for L layers
// over W workers, whatever the batch. When exactly one worker is across
// a network (worker.AheadWorker, as a node's coordinator has it for a
// CP 2 grid over two nodes), its BeginStep goes ahead without waiting
// and the first Layer learns its answer: the calls are the same, the
// round trips one fewer, and a refusal there is reported by that Layer
// (decode.ErrBeginRefused, nothing changed; see decode.Step). Begin waits for another open step
// or a sequence operation to finish, until ctx's deadline or
// StepTimeout, and then fails with decode.ErrStepOpen. Diagnostics are
// refused (engine.Step measures them one layer at a time).
func (e *Engine) Begin(ctx context.Context, b decode.Batch) (decode.Step, error) {
	// At most StepTimeout: a step that waited that long for another
	// reports the Stepper busy (ErrStepOpen), which a caller may retry.
	wctx, cancel := context.WithTimeout(ctx, e.cfg.StepTimeout)
	err := e.mu.lockCtx(wctx)
	cancel()
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("begin step: %w (the engine stayed busy): %w", decode.ErrStepOpen, err)
	default:
		return nil, fmt.Errorf("begin step: waiting for the engine: %w", context.Cause(ctx))
	}
	st, err := e.open(ctx, b)
	if err != nil {
		e.mu.Unlock()
		return nil, err
	}
	return st, nil
}

// stepState is an open decode step of the engine (it holds e.mu).
type stepState struct {
	e     *Engine
	id    uint64
	opt   decode.Options
	first int
	next  int   // the lowest layer the next Layer call may run
	last  int   // the layer after the step's last (decode.Batch.Layers)
	ran   []int // layers whose Layer calls went out
	reqs  []Request
	seqs  []*seqState
	lens  []int // per row: its length at the first layer, before the step's token
	nNew  int
	err   error // the failure that ended the layer runs
	ended bool
	// queued marks the rows whose new tokens a device layer queued
	// (layerTensor; End waits for them).
	queued []bool
	device bool // a layer ran on device tensors
	// dctx bounds the step's device layers (layerTensor): derived from
	// the first one's context (dparent) with StepTimeout, reused while
	// the layers pass that context; dcancel releases it at End.
	dctx, dparent context.Context
	dcancel       context.CancelFunc
	// tw is the worker of the step's device layers (on twDev), checked
	// is each tensor of layerTensor's checks (q, k, v, output) that the
	// backend took at an earlier layer of the step.
	tw      worker.TensorWorker
	twDev   decode.Device
	checked [4]decode.Tensor
	// ahead is the BeginStep sent ahead of the first layer to the one
	// worker across a network (nil: none, or its answer came).
	ahead *aheadBegin
}

// aheadBegin is a worker's BeginStep whose answer is still to come.
type aheadBegin struct {
	w      int
	wait   func(context.Context) error
	cancel context.CancelFunc // of the call's context, once answered
}

// settle waits for the answer (bounded by the call's own context).
func (a *aheadBegin) settle(ctx context.Context) error {
	err := a.wait(ctx)
	a.cancel()
	return err
}

// aheadWorker returns the index of the one worker whose BeginStep goes
// ahead of the first layer (worker.AheadWorker, across a network), or
// -1 when none or several could: with two or more, a worker that began
// could run the first layer while another refused the step, changing
// what a refused step must leave unchanged.
func (e *Engine) aheadWorker() int {
	w := -1
	for i, wk := range e.workers {
		if aw, ok := wk.(worker.AheadWorker); ok && aw.BeginsAhead() {
			if w >= 0 {
				return -1
			}
			w = i
		}
	}
	return w
}

func (e *Engine) open(ctx context.Context, b decode.Batch) (*stepState, error) {
	c := e.cfg
	switch {
	case e.closed.Load():
		return nil, ErrClosed
	case b.Options.Diagnostics:
		return nil, fmt.Errorf("begin step: %w: diagnostics need engine.Step (one layer at a time)", ErrBadInput)
	case b.FirstLayer < 0 || b.FirstLayer >= c.Layers:
		return nil, fmt.Errorf("begin step: %w: first layer %d outside 0..%d", ErrBadInput, b.FirstLayer, c.Layers-1)
	case b.Layers < 0 || b.FirstLayer+b.Layers > c.Layers:
		return nil, fmt.Errorf("begin step: %w: %d layers from layer %d in a model of %d", ErrBadInput, b.Layers, b.FirstLayer, c.Layers)
	case len(b.Rows) == 0:
		return nil, fmt.Errorf("begin step: %w: empty batch", ErrBadInput)
	}
	st := &stepState{e: e, opt: b.Options, first: b.FirstLayer, next: b.FirstLayer, last: b.LastLayer(c.Layers),
		reqs: make([]Request, len(b.Rows)), lens: make([]int, len(b.Rows)), ran: e.stepRan[:0]}
	seen := make(map[SeqID]bool, len(b.Rows))
	for i, r := range b.Rows {
		sq, err := e.lookup(r.Seq)
		if err != nil {
			return nil, fmt.Errorf("begin step: %w", err)
		}
		switch {
		case seen[r.Seq]:
			return nil, fmt.Errorf("begin step: %w: sequence %d appears twice", ErrBadInput, r.Seq)
		case r.Budget < 0 || (r.Budget > 0 && r.Budget < c.PageSize):
			return nil, fmt.Errorf("begin step: %w: row %d: budget %d tokens is below one page", ErrBadInput, i, r.Budget)
		case r.DenseLayers < 0 || r.DenseLayers > c.Layers:
			return nil, fmt.Errorf("begin step: %w: row %d: dense layers %d outside 0..%d", ErrBadInput, i, r.DenseLayers, c.Layers)
		case !r.New && sq.lens[b.FirstLayer] == 0:
			return nil, fmt.Errorf("begin step: %w: sequence %d has no tokens in layer %d", ErrBadInput, r.Seq, b.FirstLayer)
		}
		seen[r.Seq] = true
		st.seqs = append(st.seqs, sq)
		st.lens[i] = sq.lens[b.FirstLayer]
		st.reqs[i] = Request{Seq: r.Seq, BudgetTokens: r.Budget, DenseLayers: r.DenseLayers}
		if r.New {
			st.nNew++
			// A non-nil K marks the row's new token in the shared
			// helpers (plans, layerRequests, account); Layer sets it.
			st.reqs[i].K, st.reqs[i].V = []float32{}, []float32{}
		}
	}
	if _, err := e.plans(b.FirstLayer, st.reqs, st.seqs, b.Options.ForceDense, nil); err != nil {
		return nil, fmt.Errorf("begin %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.StepTimeout)
	defer cancel()
	e.step++
	st.id = e.step
	m := &e.begin
	*m = worker.BeginRequest{Step: st.id, Layer: b.FirstLayer, Seqs: m.Seqs[:0], Phased: b.Options.Phased, ForceDense: b.Options.ForceDense}
	for i, r := range b.Rows {
		m.Seqs = append(m.Seqs, worker.StepSeq{Seq: uint64(r.Seq), Len: st.lens[i], New: r.New, Budget: r.Budget, DenseLayers: r.DenseLayers})
	}
	// Every worker's BeginStep at once: one round, not W in turn. The
	// one across a network, if one alone is, gets it ahead of the first
	// layer (no round trip in between; Layer reads its answer).
	aw := e.aheadWorker()
	if aw >= 0 {
		// Its own context: Begin's may end once Begin returns.
		actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), c.StepTimeout)
		st.ahead = &aheadBegin{w: aw, cancel: acancel,
			wait: e.workers[aw].(worker.AheadWorker).BeginStepAhead(actx, *m)}
	}
	errs := e.eachWorker(func(wk worker.Worker) error { return wk.BeginStep(ctx, *m) }, aw)
	if aw >= 0 && worker.Cause(errs...) != nil {
		errs[aw] = st.ahead.settle(ctx)
		st.ahead = nil
	}
	if err := worker.Cause(errs...); err != nil {
		// Every worker, also those whose call failed: a worker may have
		// opened the step and lost its answer (a remote one), and an
		// EndStep of a step a worker never began changes nothing there.
		e.end(st.id, true, nil, len(e.workers))
		return nil, fmt.Errorf("begin step at layer %d: %w", b.FirstLayer, err)
	}
	return st, nil
}

// Layer implements decode.Step.
func (st *stepState) Layer(ctx context.Context, layer int, q, k, v decode.Tensor, res *decode.Result) error {
	e, c := st.e, st.e.cfg
	switch {
	case st.ended:
		return fmt.Errorf("layer %d: %w", layer, decode.ErrStepEnded)
	case st.err != nil:
		return fmt.Errorf("layer %d: %w: %w", layer, decode.ErrStepFailed, st.err)
	case e.closed.Load():
		return ErrClosed
	case layer < 0 || layer >= c.Layers:
		return fmt.Errorf("layer %d: %w: outside 0..%d", layer, ErrBadInput, c.Layers-1)
	case layer < st.next && st.next == st.last:
		return fmt.Errorf("layer %d: %w: the step ran its last layer; End it", layer, ErrBadInput)
	case layer >= st.last:
		return fmt.Errorf("layer %d: %w: the step runs layers %d..%d", layer, ErrBadInput, st.first, st.last-1)
	case layer < st.next:
		return fmt.Errorf("layer %d: %w: a step runs its layers in increasing order, each once; the next may be %d..%d", layer, ErrBadInput, st.next, c.Layers-1)
	}
	if onDevice(q, k, v, res) {
		if err := st.settleAhead(ctx, layer); err != nil {
			return err
		}
		return st.layerTensor(ctx, layer, q, k, v, res)
	}
	n := len(st.reqs)
	qd, kd, vd, err := decode.HostInputs(q, k, v)
	if err != nil {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	if err := st.checkLayer(layer, qd, kd, vd); err != nil {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	out, err := res.Output(n * c.QRow())
	if err != nil {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	plans, err := e.plans(layer, st.reqs, st.seqs, st.opt.ForceDense, res.Plans[:0])
	if err != nil {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	// Checked: the layer runs.
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.StepTimeout)
	defer cancel()
	kvd, j := c.KVRow(), 0
	for i := range st.reqs {
		r := &st.reqs[i]
		r.Q = qd[i*c.QRow() : (i+1)*c.QRow()]
		if r.K != nil {
			r.K, r.V = kd[j*kvd:(j+1)*kvd], vd[j*kvd:(j+1)*kvd]
			j++
		}
	}
	e.layerRequests(st.id, layer, st.reqs, st.seqs, true)
	a := st.ahead
	st.ahead = nil
	errs, berr := e.layerCalls(ctx, e.reps, a)
	if berr != nil {
		if werr := errs[a.w]; werr != nil && !errors.Is(werr, worker.ErrChanged) {
			// The worker refused the step, then its layer (no step open
			// there); the others ran nothing: nothing changed.
			return st.refuse(layer, berr)
		}
		// No answer came (or the layer ran after all): the layer went
		// out, and what it did there is unknown.
		if errs[a.w] == nil {
			errs[a.w] = fmt.Errorf("%w: begin step: %w", worker.ErrChanged, berr)
		} else {
			errs[a.w] = fmt.Errorf("begin step: %w; %w", berr, errs[a.w])
		}
	}
	st.next = layer + 1
	st.ran = append(st.ran, layer)
	err = worker.Cause(errs...)
	e.account(layer, st.reqs, st.seqs, e.reps, errs)
	if err != nil {
		st.err = fmt.Errorf("layer %d: %w", layer, err)
		return fmt.Errorf("%w: %w", decode.ErrStepFailed, st.err)
	}
	res.LSE = resize(res.LSE, n*c.QHeads)
	res.Time = e.gatherInto(n, e.reps, out, res.LSE)
	res.Time.Total = time.Since(start)
	res.Plans = plans
	return nil
}

// refuse ends the layer runs of a step whose BeginStep a worker refused
// (berr), learnt at layer: no layer ran, and End closes the step where
// it began.
func (st *stepState) refuse(layer int, berr error) error {
	st.err = fmt.Errorf("begin step at layer %d: %w", st.first, berr)
	return fmt.Errorf("layer %d: %w: %w", layer, decode.ErrBeginRefused, st.err)
}

// settleAhead waits for the answer of a BeginStep sent ahead, when the
// next call cannot carry it (a device layer, End): its refusal is the
// step's (see refuse).
func (st *stepState) settleAhead(ctx context.Context, layer int) error {
	a := st.ahead
	if a == nil {
		return nil
	}
	st.ahead = nil
	if err := a.settle(ctx); err != nil {
		return st.refuse(layer, err)
	}
	return nil
}

// checkLayer validates one layer's inputs against the open step.
func (st *stepState) checkLayer(layer int, q, k, v []float32) error {
	e, c := st.e, st.e.cfg
	n := len(st.reqs)
	if len(q) != n*c.QRow() || !kernels.Finite(q) {
		return fmt.Errorf("%w: q must be %d finite floats (%d rows x %d heads x %d), has %d", ErrBadInput, n*c.QRow(), n, c.QHeads, c.HeadDim, len(q))
	}
	for i := range n {
		if err := checkMagnitude("q", q[i*c.QRow():(i+1)*c.QRow()], c.HeadDim); err != nil {
			return fmt.Errorf("row %d: %w", i, err)
		}
	}
	if len(k) != st.nNew*c.KVRow() || len(v) != len(k) {
		return fmt.Errorf("%w: k and v must be [%d new tokens][%d][%d], have %d and %d floats", ErrBadInput, st.nNew, c.KVHeads, c.HeadDim, len(k), len(v))
	}
	for j := range st.nNew {
		if err := e.checkKV(layer, k[j*c.KVRow():(j+1)*c.KVRow()], v[j*c.KVRow():(j+1)*c.KVRow()]); err != nil {
			return fmt.Errorf("new token %d: %w", j, err)
		}
	}
	return st.checkLens(layer)
}

// checkLens checks that every row's sequence holds in layer the tokens
// it held at the step's first layer.
func (st *stepState) checkLens(layer int) error {
	for i, sq := range st.seqs {
		if sq.lens[layer] != st.lens[i] {
			return fmt.Errorf("%w: sequence %d has %d tokens in layer %d and %d in layer %d", ErrBadInput,
				st.reqs[i].Seq, st.lens[i], st.first, sq.lens[layer], layer)
		}
	}
	return nil
}

// End implements decode.Step: one EndStep per worker (with the layers
// that ran when the step failed, so the workers forget their collective
// tags); it gives the engine back to other calls.
func (st *stepState) End(ctx context.Context) error {
	if st.ended {
		return decode.ErrStepEnded
	}
	st.ended = true
	e := st.e
	defer e.mu.Unlock()
	if a := st.ahead; a != nil {
		// No layer ran: the answer of the BeginStep sent ahead is read
		// before the EndStep (its outcome changes nothing: an EndStep
		// of a step never begun is a no-op).
		st.ahead = nil
		actx, cancel := detached()
		_ = a.settle(actx)
		cancel()
	}
	defer st.release()
	if st.device {
		return st.endTensor(ctx)
	}
	e.ran = append(e.ran[:0], st.ran...)
	e.end(st.id, st.err != nil, e.ran, len(e.workers))
	return nil
}

// release gives the step's buffers back to the engine for the next step
// and its device layers' context (End, e.mu held).
func (st *stepState) release() {
	if st.dcancel != nil {
		st.dcancel()
		st.dctx, st.dparent, st.dcancel = nil, nil, nil
	}
	st.e.stepRan, st.ran = st.ran[:0], nil
	if st.queued != nil {
		st.e.stepQueued, st.queued = st.queued[:0], nil
	}
}

// eachWorker calls f for every worker but skip (-1: none), all at once
// when there are several, and returns their errors by worker.
func (e *Engine) eachWorker(f func(wk worker.Worker) error, skip int) []error {
	errs := make([]error, len(e.workers))
	if n := len(e.workers); n == 1 || (n == 2 && skip >= 0) {
		for w, wk := range e.workers {
			if w != skip {
				errs[w] = f(wk)
			}
		}
		return errs
	}
	var wg sync.WaitGroup
	for w, wk := range e.workers {
		if w != skip {
			wg.Go(func() { errs[w] = f(wk) })
		}
	}
	wg.Wait()
	return errs
}
