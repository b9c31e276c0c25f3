package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/questrt/questrt/worker"
)

// NextLayer is called by Decode after layer's outputs are in res, before
// the next layer runs: it writes the next layer's query heads (and new
// token, if the step has one) into the requests it was given (same
// sequences, same order; K and V set exactly when they were at the first
// layer). An error ends the step (the tokens appended so far stay; see
// Decode).
type NextLayer func(layer int, reqs []Request, res *Result) error

// Decode runs one decode step over layers [first, last) for a batch of
// sequences with one BeginStep per worker carrying the step's plan once,
// then one Layer call per worker per layer, then one EndStep: what Step
// does for one layer, without a BeginStep and EndStep round per layer.
// reqs holds the first layer's requests; next fills each later layer's
// (a model executor computes them from the previous layer's output).
// Every sequence must have the same length in every layer of the range
// (as after a prefill of every layer); the new tokens' K and V, when
// given, come at every layer. Diagnostics are refused (use Step). The
// whole step is bounded by StepTimeout per layer, or ctx's earlier
// deadline. A failure at a layer fails the step there: the new tokens of
// the earlier layers stay appended (lengths then differ by layer: the
// caller rolls back or goes on layer by layer with Step), the layer's
// own token follows Step's rule.
func (e *Engine) Decode(ctx context.Context, first, last int, reqs []Request, opt StepOptions, res *Result, next NextLayer) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	c := e.cfg
	switch {
	case opt.Diagnostics:
		return fmt.Errorf("decode: %w: diagnostics need Step (one layer at a time)", ErrBadInput)
	case first < 0 || last > c.Layers || first >= last:
		return fmt.Errorf("decode: %w: layers [%d, %d) outside [0, %d)", ErrBadInput, first, last, c.Layers)
	case last-first > 1 && next == nil:
		return fmt.Errorf("decode: %w: no NextLayer for %d layers", ErrBadInput, last-first)
	}
	seqs, err := e.checkStep(first, reqs)
	if err != nil {
		return err
	}
	fresh := make([]bool, len(reqs))
	for i, r := range reqs {
		fresh[i] = r.K != nil
		for l := first + 1; l < last; l++ {
			if seqs[i].lens[l] != seqs[i].lens[first] {
				return fmt.Errorf("decode: %w: sequence %d has %d tokens in layer %d and %d in layer %d", ErrBadInput,
					r.Seq, seqs[i].lens[first], first, seqs[i].lens[l], l)
			}
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, time.Duration(last-first)*c.StepTimeout)
	defer cancel()
	e.step++
	step := e.step
	b := &e.begin
	*b = worker.BeginRequest{Step: step, Layer: first, Seqs: b.Seqs[:0], Phased: opt.Phased, ForceDense: opt.ForceDense}
	for i, r := range reqs {
		b.Seqs = append(b.Seqs, worker.StepSeq{Seq: uint64(r.Seq), Len: seqs[i].lens[first], New: fresh[i], Budget: r.BudgetTokens})
	}
	for w, wk := range e.workers {
		if err := wk.BeginStep(ctx, *b); err != nil {
			e.end(step, true, nil, w)
			return fmt.Errorf("decode layer %d: %w", first, err)
		}
	}
	var ran []int
	fail := func(layer int, err error) error {
		e.end(step, true, ran, len(e.workers))
		return fmt.Errorf("decode layer %d: %w", layer, err)
	}
	for l := first; l < last; l++ {
		if l > first {
			if err := next(l-1, reqs, res); err != nil {
				return fail(l, err)
			}
			if _, err := e.checkStep(l, reqs); err != nil {
				return fail(l, err)
			}
			for i, r := range reqs {
				if (r.K != nil) != fresh[i] {
					return fail(l, fmt.Errorf("%w: batch index %d: a new token at some layers of a step and not at others", ErrBadInput, i))
				}
			}
		}
		plans, err := e.plans(l, reqs, seqs, opt.ForceDense, res.Plans[:0])
		if err != nil {
			return fail(l, err)
		}
		e.layerRequests(step, l, reqs, seqs, true)
		ran = append(ran, l)
		errs := e.layerCalls(ctx, e.reps)
		err = worker.Cause(errs...)
		e.account(l, reqs, seqs, e.reps, errs)
		if err != nil {
			return fail(l, err)
		}
		e.gather(len(reqs), e.reps, res)
		res.Plans = plans
		res.Diag = res.Diag[:0]
	}
	e.end(step, false, nil, len(e.workers))
	res.Time.Total = time.Since(start)
	return nil
}

// layerCalls sends every worker its Layer request at once (see run for
// the cancellation rule) and returns their errors.
func (e *Engine) layerCalls(ctx context.Context, reps []worker.LayerReply) []error {
	e.errs = append(e.errs[:0], make([]error, len(e.workers))...)
	errs := e.errs
	if len(e.workers) == 1 {
		errs[0] = e.workers[0].Layer(ctx, e.lreqs[0], &reps[0])
		return errs
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var once sync.Once
	var timer *time.Timer
	var wg sync.WaitGroup
	for w, wk := range e.workers {
		wg.Go(func() {
			if err := wk.Layer(lctx, e.lreqs[w], &reps[w]); err != nil {
				errs[w] = err
				once.Do(func() { timer = time.AfterFunc(abortGrace, cancel) })
			}
		})
	}
	wg.Wait()
	if timer != nil {
		timer.Stop()
	}
	return errs
}
