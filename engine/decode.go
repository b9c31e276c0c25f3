package engine

import (
	"context"
	"sync"
	"time"

	"github.com/questrt/questrt/worker"
)

// layerCalls sends every worker its Layer request at once (see run for
// the cancellation rule) and returns their errors.
func (e *Engine) layerCalls(ctx context.Context, reps []worker.LayerReply, a *aheadBegin) (errs []error, beginErr error) {
	e.errs = append(e.errs[:0], make([]error, len(e.workers))...)
	errs = e.errs
	if len(e.workers) == 1 && a == nil {
		errs[0] = e.workers[0].Layer(ctx, e.lreqs[0], &reps[0])
		return errs, nil
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var once sync.Once
	var timer *time.Timer
	var wg sync.WaitGroup
	// With a BeginStep sent ahead, its worker's Layer goes out at once
	// (behind the BeginStep on its stream) and the others wait for the
	// BeginStep's answer (gate): after a refusal they run nothing.
	var gate chan struct{}
	if a != nil {
		gate = make(chan struct{})
	}
	for w, wk := range e.workers {
		wg.Go(func() {
			if a != nil && w != a.w {
				<-gate
				if beginErr != nil {
					notRun(&reps[w], e.hosts[w])
					return
				}
			}
			if err := wk.Layer(lctx, e.lreqs[w], &reps[w]); err != nil {
				errs[w] = err
				once.Do(func() { timer = time.AfterFunc(abortGrace, cancel) })
			}
		})
	}
	if a != nil {
		beginErr = a.settle(lctx)
		close(gate)
	}
	wg.Wait()
	if timer != nil {
		timer.Stop()
	}
	return errs, beginErr
}

// notRun makes rep the reply of a worker that did not run the layer.
func notRun(rep *worker.LayerReply, hosted []worker.Rank) {
	rep.Ranks = rep.Ranks[:0]
	for _, r := range hosted {
		rep.Ranks = append(rep.Ranks, worker.RankOutput{Rank: r})
	}
}
