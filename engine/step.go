package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
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
}

// StepOptions tune one step.
type StepOptions struct {
	// Diagnostics measures the selection against dense attention (a
	// second, dense pass over all shards).
	Diagnostics bool
	// TopR is R for the recall diagnostic (10).
	TopR int
	// ForceDense attends every page (a dense reference step).
	ForceDense bool
	// Phased keeps score, top-K and attention separate backend calls when
	// a shard could fuse them (CP = 1 with a fusing backend; see
	// shard.FusedStep): per-phase times, and a reference for the fused
	// path. Diagnostics imply it.
	Phased bool
}

// Times are the wall times of a step's phases on CP rank 0 of TP group 0,
// and of the whole step (appends included, diagnostics excluded).
type Times struct {
	Score, TopK, Select, Attend, Merge, Total time.Duration
	// Fused is the time of a local step fused into one backend call
	// (Score, TopK and Attend are then zero).
	Fused time.Duration
}

// Collective is the time spent in collectives (selection exchange and
// merge).
func (t Times) Collective() time.Duration { return t.Select + t.Merge }

// Result holds a step's outputs; reuse one across steps.
type Result struct {
	// O is [sequences][QHeads][HeadDim]; LSE is [sequences][QHeads].
	O, LSE []float32
	// Plans is each sequence's global page plan.
	Plans []plan.Plan
	// Diag has one entry per sequence when diagnostics were asked for.
	Diag []shard.Diagnostics
	Time Times
}

// rankWork is one shard's reusable state for a step.
type rankWork struct {
	parts []shard.SeqPart
	ls    shard.LocalStep
	sel   shard.Selection
	local [][]collective.Candidate
	k     []int
	lists [][]int32
	ids   []uint64
	q     []float32
	t     Times
}

// Step runs one decode step of one layer for a batch of sequences on every
// shard. Bad requests change nothing. A shard that fails or blocks fails
// the step with an error before the deadline (StepTimeout or ctx's); the
// other shards abandon it and the engine stays usable.
func (e *Engine) Step(ctx context.Context, layer int, reqs []Request, opt StepOptions, res *Result) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.StepTimeout)
	defer cancel()
	seqs, err := e.checkStep(layer, reqs)
	if err != nil {
		return err
	}
	for i, r := range reqs {
		if r.K != nil {
			if err := e.append(r.Seq, seqs[i], layer, r.K, r.V); err != nil {
				return fmt.Errorf("step layer %d: %w", layer, err)
			}
		}
	}
	plans := make([]plan.Plan, 0, len(reqs))
	for _, r := range reqs {
		sq := e.seqs[r.Seq]
		pages := (sq.lens[layer] + e.cfg.PageSize - 1) / e.cfg.PageSize
		pl, err := e.cfg.Policy.Plan(layer, pages, r.BudgetTokens)
		if err != nil {
			return fmt.Errorf("step layer %d sequence %d: %w: %w", layer, r.Seq, ErrBadInput, err)
		}
		if opt.ForceDense {
			pl = pl.AsDense()
		}
		plans = append(plans, pl)
	}
	if err := e.run(ctx, layer, reqs, seqs, plans, opt.Diagnostics, opt.Diagnostics || opt.Phased, res); err != nil {
		return err
	}
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
	seen := map[SeqID]bool{}
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
		if len(r.Q) != c.QHeads*c.HeadDim || !kernels.Finite(r.Q) {
			return nil, fmt.Errorf("step: %w: batch index %d: query must be %d finite floats", ErrBadInput, i, c.QHeads*c.HeadDim)
		}
		if (r.K == nil) != (r.V == nil) {
			return nil, fmt.Errorf("step: %w: batch index %d: k and v must come together", ErrBadInput, i)
		}
		if r.K != nil {
			if len(r.K) != c.KVHeads*c.HeadDim {
				return nil, fmt.Errorf("step: %w: batch index %d: new token k/v must be [%d][%d]", ErrBadInput, i, c.KVHeads, c.HeadDim)
			}
			if err := e.checkKV(layer, r.K, r.V); err != nil {
				return nil, fmt.Errorf("step: batch index %d: %w", i, err)
			}
		} else if sq.lens[layer] == 0 {
			return nil, fmt.Errorf("step: %w: sequence %d has no tokens in layer %d", ErrBadInput, r.Seq, layer)
		}
		if r.BudgetTokens < 0 || (r.BudgetTokens > 0 && r.BudgetTokens < c.PageSize) {
			return nil, fmt.Errorf("step: %w: batch index %d: budget %d tokens is below one page", ErrBadInput, i, r.BudgetTokens)
		}
		seqs = append(seqs, sq)
	}
	return seqs, nil
}

// run executes the step on every shard in parallel and, only when every
// shard succeeded, assembles the merged states from CP rank 0 of every TP
// group into res (res is untouched on error).
func (e *Engine) run(ctx context.Context, layer int, reqs []Request, seqs []*seqState, plans []plan.Plan, diag, phased bool, res *Result) error {
	c := e.cfg
	e.step++
	step := e.step
	n := len(reqs)
	errs := make([]error, c.TP*c.CP)
	var wg sync.WaitGroup
	for tp := range c.TP {
		for cp := range c.CP {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.rankStep(ctx, tp, cp, layer, step, reqs, seqs, plans, diag, phased); err != nil {
					errs[tp*c.CP+cp] = fmt.Errorf("shard (tp %d, cp %d): %w", tp, cp, err)
				}
			}()
		}
	}
	wg.Wait()
	// Report the root cause first: a rank that failed on its own, then
	// one that ran into the deadline, then one that saw a peer abort.
	rank := func(err error) int {
		switch {
		case errors.Is(err, collective.ErrAborted):
			return 0
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			return 1
		}
		return 2
	}
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || rank(err) > rank(first)) {
			first = err
		}
	}
	if first != nil {
		// Every rank returned: drop what the failed operations left
		// buffered (data sent before a peer failed, aborts).
		for tp := range c.TP {
			for _, tr := range e.trs[tp] {
				tr.Forget(collective.MakeTag(step, layer, collective.OpSelect))
				tr.Forget(collective.MakeTag(step, layer, collective.OpReduce))
			}
		}
		return fmt.Errorf("step layer %d: %w", layer, first)
	}
	d := c.HeadDim
	res.O = resize(res.O, n*c.QHeads*d)
	res.LSE = resize(res.LSE, n*c.QHeads)
	for tp := range c.TP {
		ls := &e.work[tp][0].ls
		for i := range n {
			copy(res.O[(i*c.QHeads+tp*e.qT)*d:][:e.qT*d], ls.O[i*e.qT*d:][:e.qT*d])
			copy(res.LSE[i*c.QHeads+tp*e.qT:][:e.qT], ls.LSE[i*e.qT:][:e.qT])
		}
	}
	res.Time = e.work[0][0].t
	res.Time.Total = 0
	return nil
}

func resize(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// rankStep is one shard's part of a step.
func (e *Engine) rankStep(ctx context.Context, tp, cp, layer int, step uint64, reqs []Request, seqs []*seqState, plans []plan.Plan, diag, phased bool) error {
	c := e.cfg
	d := c.HeadDim
	w := e.work[tp][cp]
	w.t = Times{}
	sh := e.shards[tp][cp]
	g := e.groups[tp][cp]
	selTag := collective.MakeTag(step, layer, collective.OpSelect)
	redTag := collective.MakeTag(step, layer, collective.OpReduce)
	// fail tells the peers that wait on this rank's messages: the
	// selection exchange if this rank has not sent its candidates yet, and
	// the merge at the root if this rank is not the root.
	selSent := c.Selection != Exact
	fail := func(err error) error {
		actx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if !selSent {
			collective.Abort(actx, g.Transport(), selTag, err)
		}
		if cp != 0 {
			collective.AbortRank(actx, g.Transport(), redTag, 0, err)
		}
		return err
	}
	w.parts = w.parts[:0]
	w.ids = w.ids[:0]
	w.q = w.q[:0]
	for i, sq := range seqs {
		q := reqs[i].Q[tp*e.qT*d : (tp+1)*e.qT*d]
		w.parts = append(w.parts, shard.SeqPart{Seq: sq.local[tp][cp], Place: sq.layout.Place(cp), Plan: plans[i], Q: q})
		w.ids = append(w.ids, uint64(reqs[i].Seq))
		w.q = append(w.q, q...)
	}
	if err := sh.Begin(&w.ls, layer, w.parts); err != nil {
		return fail(err)
	}
	if c.CP == 1 && !phased {
		// One rank holds every page: its local top-K is the global one,
		// and a fusing backend runs the whole local step in one call.
		done, err := sh.FusedStep(ctx, &w.ls)
		if err != nil {
			return fail(err)
		}
		if done {
			w.t.Fused = w.ls.Time.Fused
			t0 := time.Now()
			err := g.Reduce(ctx, redTag, 0, d, w.ls.O, w.ls.LSE)
			w.t.Merge = time.Since(t0)
			return err
		}
	}
	quota := func(pl plan.Plan) int { return pl.Rank }
	if c.Selection == Union {
		quota = func(pl plan.Plan) int { return plan.UnionQuota(pl.Rank, c.CP) }
	}
	// A ranking backend scores and picks the candidates in one call: only
	// the candidates come back from the device.
	ranked := false
	if c.Selection != Replicated && !phased {
		var err error
		if ranked, err = sh.RankCandidates(ctx, &w.ls, quota); err != nil {
			return fail(err)
		}
	}
	scoreLocal := c.Selection != Replicated || diag
	if scoreLocal && !ranked {
		if err := sh.Score(ctx, &w.ls, diag); err != nil {
			return fail(err)
		}
	}
	switch c.Selection {
	case Exact, Union:
		if !ranked {
			if err := sh.Candidates(ctx, &w.ls, quota); err != nil {
				return fail(err)
			}
		}
		if c.Selection == Union {
			w.ls.LocalSelection(&w.sel)
			break
		}
		rows := w.ls.Rows()
		w.local, w.k = w.local[:0], w.k[:0]
		for i := range seqs {
			for r := range rows {
				w.local = append(w.local, w.ls.RowCandidates(i, r))
				k := 0
				if !plans[i].Dense {
					k = plans[i].Rank
				}
				w.k = append(w.k, k)
			}
		}
		t0 := time.Now()
		lists, err := g.SelectExact(ctx, selTag, w.local, w.k, w.lists)
		w.t.Select = time.Since(t0)
		selSent = true // the group aborted its own peers if it failed
		if err != nil {
			return fail(err)
		}
		w.lists = lists
		w.sel.Reset()
		for _, l := range lists {
			w.sel.Pages = append(w.sel.Pages, l...)
			w.sel.Indptr = append(w.sel.Indptr, int32(len(w.sel.Pages)))
		}
	case Replicated:
		t0 := time.Now()
		if err := sh.ReplicatedSelect(ctx, e.mirrors[tp][cp], layer, w.ids, plans, w.q, &w.sel); err != nil {
			return fail(err)
		}
		w.t.Score = time.Since(t0)
	}
	if err := sh.Attend(ctx, &w.ls, &w.sel); err != nil {
		return fail(err)
	}
	lt := w.ls.Time
	if scoreLocal {
		w.t.Score = lt.Score
	}
	w.t.TopK, w.t.Attend = lt.TopK, lt.Attend
	t0 := time.Now()
	err := g.Reduce(ctx, redTag, 0, d, w.ls.O, w.ls.LSE)
	w.t.Merge = time.Since(t0)
	if err != nil {
		return err
	}
	return nil
}
