package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/worker"
)

// NextLayer is called by Decode after layer's outputs are in res, before
// the next layer runs: it writes the next layer's query heads (and new
// token, if the step has one) into the requests it was given (same
// sequences, same order; K and V set exactly when they were at the first
// layer). An error ends the step (the tokens appended so far stay; see
// Decode).
//
// Deprecated: drive the layer loop with Begin, Step.Layer and Step.End
// (decode.Stepper); NextLayer and Decode stay for one release.
type NextLayer func(layer int, reqs []Request, res *Result) error

// Decode runs one decode step over layers [first, last) for a batch of
// sequences with one BeginStep per worker carrying the step's plan once,
// then one Layer call per worker per layer, then one EndStep: Begin,
// Step.Layer per layer and Step.End with the layer loop inside. reqs
// holds the first layer's requests; next fills each later layer's (a
// model executor computes them from the previous layer's output). Every
// sequence must have the same length in every layer of the range (as
// after a prefill of every layer); the new tokens' K and V, when given,
// come at every layer. Diagnostics are refused (use Step). Each layer is
// bounded by StepTimeout, or ctx's earlier deadline. A failure at a layer
// fails the step there: the new tokens of the earlier layers stay
// appended (lengths then differ by layer: the caller rolls back or goes
// on layer by layer with Step), the layer's own token follows Step's
// rule.
//
// Deprecated: use Begin (decode.Stepper), where the caller owns the layer
// loop; Decode stays for one release.
func (e *Engine) Decode(ctx context.Context, first, last int, reqs []Request, opt StepOptions, res *Result, next NextLayer) error {
	c := e.cfg
	switch {
	case opt.Diagnostics:
		return fmt.Errorf("decode: %w: diagnostics need Step (one layer at a time)", ErrBadInput)
	case first < 0 || last > c.Layers || first >= last:
		return fmt.Errorf("decode: %w: layers [%d, %d) outside [0, %d)", ErrBadInput, first, last, c.Layers)
	case last-first > 1 && next == nil:
		return fmt.Errorf("decode: %w: no NextLayer for %d layers", ErrBadInput, last-first)
	}
	start := time.Now()
	b := decode.Batch{FirstLayer: first, Options: opt, Rows: make([]decode.Row, len(reqs))}
	for i, r := range reqs {
		if (r.K == nil) != (r.V == nil) {
			return fmt.Errorf("decode: %w: batch index %d: k and v must come together", ErrBadInput, i)
		}
		b.Rows[i] = decode.Row{Seq: r.Seq, New: r.K != nil, Budget: r.BudgetTokens, DenseLayers: r.DenseLayers}
	}
	s, err := e.Begin(ctx, b)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	st := s.(*stepState)
	defer st.End(ctx)
	for i, sq := range st.seqs {
		for l := first + 1; l < last; l++ {
			if sq.lens[l] != st.lens[i] {
				return fmt.Errorf("decode: %w: sequence %d has %d tokens in layer %d and %d in layer %d", ErrBadInput,
					reqs[i].Seq, st.lens[i], first, sq.lens[l], l)
			}
		}
	}
	var q, k, v []float32
	for l := first; l < last; l++ {
		if l > first {
			if err := next(l-1, reqs, res); err != nil {
				return fmt.Errorf("decode layer %d: %w", l, err)
			}
		}
		q, k, v = q[:0], k[:0], v[:0]
		for i, r := range reqs {
			if (r.K != nil) != b.Rows[i].New || (r.K == nil) != (r.V == nil) {
				return fmt.Errorf("decode layer %d: %w: batch index %d: a new token at some layers of a step and not at others", l, ErrBadInput, i)
			}
			q = append(q, r.Q...)
			k = append(k, r.K...)
			v = append(v, r.V...)
		}
		res.O = resize(res.O, len(reqs)*c.QRow())
		dr := decode.Result{O: decode.Host(res.O), LSE: res.LSE, Plans: res.Plans}
		if err := st.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(v), &dr); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		res.LSE, res.Plans, res.Time = dr.LSE, dr.Plans, dr.Time
		res.Diag = res.Diag[:0]
	}
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
