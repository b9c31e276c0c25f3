package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
	"github.com/questrt/questrt/worker"
)

// Request is one sequence's part of a step.
type Request struct {
	Seq SeqID
	// Q is [QHeads][HeadDim] for the whole model.
	Q []float32
	// K and V, when set, are the new token's [KVHeads][HeadDim], appended
	// to the layer before attention.
	K, V []float32
	// BudgetTokens overrides the policy's budget (0: the policy's).
	BudgetTokens int
	// DenseLayers makes the layers below it attend every page of this
	// sequence (see decode.Row.DenseLayers).
	DenseLayers int
}

// StepOptions tune one step (decode.Options, the one declaration).
type StepOptions = decode.Options

// Times are the wall times of a step's phases on CP rank 0 of TP group 0,
// and of the whole step (appends included, diagnostics excluded); see
// decode.Times.
type Times = decode.Times

// Result holds a step's outputs; reuse one across steps.
type Result struct {
	// O is [sequences][QHeads][HeadDim]; LSE is [sequences][QHeads].
	O, LSE []float32
	// Plans is each sequence's global page plan.
	Plans []plan.Plan
	// Diag has one entry per sequence when diagnostics were asked for.
	Diag []shard.Diagnostics
	// DenseLSE is the dense reference's LSE, [sequences][QHeads], when
	// diagnostics were asked for.
	DenseLSE []float32
	Time     Times
}

// Step runs one decode step of one layer for a batch of sequences on every
// shard: one BeginStep to every worker carrying the step's plan, then one
// Layer call per worker (all at once: their ranks exchange with each
// other) carrying the query heads and the new tokens, then EndStep. Bad
// requests change nothing. A shard that fails or blocks fails the step
// with an error before the deadline (StepTimeout or ctx's); the other
// shards abandon it, the workers forget its collective tags, and the
// engine stays usable. A new token that reached every rank it was routed
// to stays appended after a failed step; one that reached only some of
// them breaks its sequence.
func (e *Engine) Step(ctx context.Context, layer int, reqs []Request, opt StepOptions, res *Result) error {
	if err := e.lockOp(ctx, fmt.Sprintf("step layer %d", layer)); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.StepTimeout)
	defer cancel()
	seqs, err := e.checkStep(layer, reqs)
	if err != nil {
		return err
	}
	plans, err := e.plans(layer, reqs, seqs, opt.ForceDense, make([]plan.Plan, 0, len(reqs)))
	if err != nil {
		return err
	}
	run := runOptions{fresh: true, phased: opt.Phased, diag: opt.Diagnostics, dense: opt.ForceDense}
	if err := e.run(ctx, layer, reqs, seqs, run, e.reps); err != nil {
		return err
	}
	e.gather(len(reqs), e.reps, res)
	res.Plans = append(res.Plans[:0], plans...)
	res.Time.Total = time.Since(start)
	res.Diag = res.Diag[:0]
	if opt.Diagnostics {
		if err := e.diagnose(ctx, layer, reqs, seqs, opt, res); err != nil {
			return fmt.Errorf("step layer %d diagnostics: %w", layer, err)
		}
	}
	return nil
}

func (e *Engine) checkStep(layer int, reqs []Request) ([]*seqState, error) {
	c := e.cfg
	if layer < 0 || layer >= c.Layers {
		return nil, fmt.Errorf("step: %w: layer %d outside 0..%d", ErrBadInput, layer, c.Layers-1)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("step: %w: empty batch", ErrBadInput)
	}
	seen := make(map[SeqID]bool, len(reqs))
	var seqs []*seqState
	for i, r := range reqs {
		sq, err := e.lookup(r.Seq)
		if err != nil {
			return nil, fmt.Errorf("step: %w", err)
		}
		if seen[r.Seq] {
			return nil, fmt.Errorf("step: %w: sequence %d appears twice", ErrBadInput, r.Seq)
		}
		seen[r.Seq] = true
		if len(r.Q) != c.QRow() || !kernels.Finite(r.Q) {
			return nil, fmt.Errorf("step: %w: batch index %d: query must be %d finite floats", ErrBadInput, i, c.QRow())
		}
		if err := checkMagnitude("q", r.Q, c.HeadDim); err != nil {
			return nil, fmt.Errorf("step: batch index %d: %w", i, err)
		}
		if (r.K == nil) != (r.V == nil) {
			return nil, fmt.Errorf("step: %w: batch index %d: k and v must come together", ErrBadInput, i)
		}
		if r.K != nil {
			if len(r.K) != c.KVRow() {
				return nil, fmt.Errorf("step: %w: batch index %d: new token k/v must be [%d][%d]", ErrBadInput, i, c.KVHeads, c.HeadDim)
			}
			if err := e.checkKV(layer, r.K, r.V); err != nil {
				return nil, fmt.Errorf("step: batch index %d: %w", i, err)
			}
		} else if sq.lens[layer] == 0 {
			return nil, fmt.Errorf("step: %w: sequence %d has no tokens in layer %d", ErrBadInput, r.Seq, layer)
		}
		if r.DenseLayers < 0 || r.DenseLayers > c.Layers {
			return nil, fmt.Errorf("step: %w: batch index %d: dense layers %d outside 0..%d", ErrBadInput, i, r.DenseLayers, c.Layers)
		}
		if r.BudgetTokens < 0 || (r.BudgetTokens > 0 && r.BudgetTokens < c.PageSize) {
			return nil, fmt.Errorf("step: %w: batch index %d: budget %d tokens is below one page", ErrBadInput, i, r.BudgetTokens)
		}
		seqs = append(seqs, sq)
	}
	return seqs, nil
}

// plans appends to dst the page plan of each request at layer: its
// sequence's pages there, with the new token when the request has one,
// and its budget (dense: every page).
func (e *Engine) plans(layer int, reqs []Request, seqs []*seqState, dense bool, dst []plan.Plan) ([]plan.Plan, error) {
	for i, r := range reqs {
		n := seqs[i].lens[layer]
		if r.K != nil {
			n++
		}
		pl, err := e.cfg.Policy.Plan(layer, e.cfg.Pages(n), r.BudgetTokens)
		if err != nil {
			return nil, fmt.Errorf("step layer %d sequence %d: %w: %w", layer, r.Seq, ErrBadInput, err)
		}
		if dense || layer < r.DenseLayers {
			pl = pl.AsDense()
		}
		dst = append(dst, pl)
	}
	return dst, nil
}

// runOptions say what one run of a layer over the workers does.
type runOptions struct {
	fresh  bool // the requests' K and V are new tokens to append
	phased bool // separate backend calls per phase
	diag   bool // the workers return the selection and page scores
	dense  bool // attend every page
}

// run runs one layer of the batch on every worker as one step: BeginStep
// everywhere, then every worker's Layer call at once, then EndStep (with
// Failed after a failure, so the workers forget the step's tags). The
// replies land in reps; only when every worker succeeded are they whole.
// Host work is O(sequences x heads x HeadDim) for the tensors and
// O(workers x sequences) for the bookkeeping: no page is listed.
func (e *Engine) run(ctx context.Context, layer int, reqs []Request, seqs []*seqState, o runOptions, reps []worker.LayerReply) error {
	e.step++
	step := e.step
	b := &e.begin
	*b = worker.BeginRequest{Step: step, Layer: layer, Seqs: b.Seqs[:0], Phased: o.phased, Diagnostics: o.diag, ForceDense: o.dense}
	for i, r := range reqs {
		b.Seqs = append(b.Seqs, worker.StepSeq{Seq: uint64(r.Seq), Len: seqs[i].lens[layer], New: o.fresh && r.K != nil, Budget: r.BudgetTokens, DenseLayers: r.DenseLayers})
	}
	for w, wk := range e.workers {
		if err := wk.BeginStep(ctx, *b); err != nil {
			// The failing worker too: it may have opened the step and
			// lost its answer.
			e.end(step, true, nil, w+1)
			return fmt.Errorf("step layer %d: %w", layer, err)
		}
	}
	e.layerRequests(step, layer, reqs, seqs, o.fresh)
	// Every worker's Layer at once. A failing rank tells its peers
	// through the transports' aborts, so the other calls return by
	// themselves with their Appended counts (a remote call cancelled
	// before its reply cannot say whether its token went in, which breaks
	// the sequence); the first failure cancels the calls still running
	// abortGrace later (a peer that never heard of the failure).
	errs, _ := e.layerCalls(ctx, reps, nil)
	err := worker.Cause(errs...)
	if o.fresh {
		e.account(layer, reqs, seqs, reps, errs)
	}
	e.ran = append(e.ran[:0], layer)
	e.end(step, err != nil, e.ran, len(e.workers))
	if err != nil {
		return fmt.Errorf("step layer %d: %w", layer, err)
	}
	return nil
}

// abortGrace is how long after a step's first failed Layer call the
// calls still running are cancelled.
const abortGrace = 100 * time.Millisecond

// end closes step on the first n workers. A failed step's workers
// forget the tags of the layers in ran (the layers the step sent Layer
// calls for, to any worker) besides those they ran themselves.
func (e *Engine) end(step uint64, failed bool, ran []int, n int) {
	// Not the step's context, which may be done: a detached one bounded
	// by endTimeout.
	ctx, cancel := detached()
	defer cancel()
	m := worker.EndRequest{Step: step, Failed: failed}
	if failed {
		m.Layers = ran
	}
	// An EndStep cannot fail for a step the worker began; a worker that
	// lost it has nothing to forget. Several workers: all at once.
	if n == 1 {
		_ = e.workers[0].EndStep(ctx, m)
		return
	}
	var wg sync.WaitGroup
	for _, wk := range e.workers[:n] {
		wg.Go(func() { _ = wk.EndStep(ctx, m) })
	}
	wg.Wait()
}

// layerRequests fills every worker's Layer request: per hosted rank, its
// TP group's query heads of every sequence and the new tokens it takes
// (the owner of each token's page stores it; under replicated selection
// every rank's mirror takes its keys).
func (e *Engine) layerRequests(step uint64, layer int, reqs []Request, seqs []*seqState, fresh bool) {
	c := e.cfg
	d := c.HeadDim
	replicated := c.Selection == Replicated
	for w, hosted := range e.hosts {
		lr := &e.lreqs[w]
		lr.Step, lr.Layer = step, layer
		if cap(lr.Ranks) < len(hosted) {
			lr.Ranks = make([]worker.RankInput, len(hosted))
		}
		lr.Ranks = lr.Ranks[:len(hosted)]
		for k, r := range hosted {
			in := &lr.Ranks[k]
			in.Rank = r
			in.Q, in.K, in.V, in.MirrorK = in.Q[:0], in.K[:0], in.V[:0], in.MirrorK[:0]
			for i := range reqs {
				in.Q = append(in.Q, reqs[i].Q[r.TP*e.qT*d:(r.TP+1)*e.qT*d]...)
				if !fresh || reqs[i].K == nil {
					continue
				}
				lo, hi := r.TP*e.kvT*d, (r.TP+1)*e.kvT*d
				if seqs[i].layout.Owner(seqs[i].lens[layer]/c.PageSize) == r.CP {
					in.K = append(in.K, reqs[i].K[lo:hi]...)
					in.V = append(in.V, reqs[i].V[lo:hi]...)
				}
				if replicated {
					in.MirrorK = append(in.MirrorK, reqs[i].K[lo:hi]...)
				}
			}
			if !replicated {
				in.MirrorK = nil
			}
		}
	}
}

// account applies the outcome of a layer's new tokens to the sequence
// table: a token every rank it was routed to took is appended; one no
// rank took changed nothing; one only some took (or a rank that failed
// after a change, worker.ErrChanged) breaks its sequence. errs are the
// workers' errors.
func (e *Engine) account(layer int, reqs []Request, seqs []*seqState, reps []worker.LayerReply, errs []error) {
	c := e.cfg
	n := len(reqs)
	e.routed = slices.Grow(e.routed[:0], n)[:n]
	e.took = slices.Grow(e.took[:0], n)[:n]
	clear(e.routed)
	clear(e.took)
	changed := false
	for _, err := range errs {
		changed = changed || errors.Is(err, worker.ErrChanged)
	}
	for tp := range c.TP {
		for cp := range c.CP {
			out := e.output(reps, tp, cp)
			j := 0 // position among the tokens routed to this rank
			for i, r := range reqs {
				if r.K == nil {
					continue
				}
				if c.Selection != Replicated && seqs[i].layout.Owner(seqs[i].lens[layer]/c.PageSize) != cp {
					continue
				}
				e.routed[i]++
				if out != nil && j < out.Appended {
					e.took[i]++
				}
				j++
			}
		}
	}
	for i, r := range reqs {
		if r.K == nil {
			continue
		}
		switch got, want := e.took[i], e.routed[i]; {
		case got == want && !changed:
			seqs[i].lens[layer]++
		case got > 0 || changed:
			seqs[i].broken = true
		}
	}
}

// gather assembles the merged states of CP rank 0 of every TP group into
// res (called only after every worker succeeded).
func (e *Engine) gather(n int, reps []worker.LayerReply, res *Result) {
	c := e.cfg
	res.O = resize(res.O, n*c.QHeads*c.HeadDim)
	res.LSE = resize(res.LSE, n*c.QHeads)
	res.Time = e.gatherInto(n, reps, res.O, res.LSE)
}

// gatherInto writes the merged states of CP rank 0 of every TP group into
// o ([n][QHeads][HeadDim]) and lse ([n][QHeads]) and returns the phase
// times of rank (0, 0).
func (e *Engine) gatherInto(n int, reps []worker.LayerReply, o, lse []float32) Times {
	c := e.cfg
	d := c.HeadDim
	for tp := range c.TP {
		out := e.output(reps, tp, 0)
		for i := range n {
			copy(o[(i*c.QHeads+tp*e.qT)*d:][:e.qT*d], out.O[i*e.qT*d:][:e.qT*d])
			copy(lse[i*c.QHeads+tp*e.qT:][:e.qT], out.LSE[i*e.qT:][:e.qT])
		}
	}
	t := e.output(reps, 0, 0).Time
	return Times{Score: t.Score, TopK: t.TopK, Select: t.Select, Attend: t.Attend, Merge: t.Merge, Fused: t.Fused,
		Reused: t.Reused, RankSkipped: t.RankSkipped}
}

func resize(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
