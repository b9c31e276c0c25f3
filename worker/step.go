package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// stepState is the open step: its plan as BeginStep carried it, resolved
// once against the worker's sequence table, and the layers it ran.
type stepState struct {
	id          uint64
	first       int   // the first layer (BeginStep checked the lengths there)
	next        int   // the lowest layer the next Layer call may run
	ran         []int // layers whose collectives ran (forgotten on failure)
	failed      bool
	queued      bool // LayerTensor queued work that EndStep waits for
	phased      bool
	diag, dense bool
	seqs        []StepSeq
	index       map[uint64]int // sequence -> batch index
	sq          []*seqState    // per batch index
	ids         []uint64       // per batch index: the sequence id (mirror key)
	fresh       []int          // batch indices of the New sequences, ascending
	own         [][]int        // per hosted rank: the New sequences whose token it stores
	plans       []plan.Plan    // the current layer's plan per batch index
	marks       [][][]int      // per batch index: its step marker's lengths (stepmark.go), nil if none
	// checked holds each tensor of checkTensorLayer (q, k, v, o, lse)
	// that the shard took at an earlier layer of the step.
	checked [5]decode.Tensor
	// Layer scratch.
	order []int
	seen  []bool
	errs  []error
}

// reset makes st the state of step m over ranks hosted ranks, keeping
// its buffers (a worker has at most one open step: one stepState serves
// them all).
func (st *stepState) reset(m BeginRequest, ranks int) {
	st.id, st.first, st.next, st.ran, st.failed, st.queued = m.Step, m.Layer, m.Layer, st.ran[:0], false, false
	st.checked = [5]decode.Tensor{}
	st.phased, st.diag, st.dense = m.Phased || m.Diagnostics, m.Diagnostics, m.ForceDense
	st.seqs = append(st.seqs[:0], m.Seqs...)
	if st.index == nil {
		st.index = make(map[uint64]int, len(m.Seqs))
	}
	clear(st.index)
	st.sq, st.ids, st.fresh, st.plans = st.sq[:0], st.ids[:0], st.fresh[:0], st.plans[:0]
	if cap(st.own) < ranks {
		st.own = make([][]int, ranks)
	}
	st.own = st.own[:ranks]
	for i := range st.own {
		st.own[i] = st.own[i][:0]
	}
}

// BeginStep implements Worker.
func (l *Local) BeginStep(ctx context.Context, m BeginRequest) error {
	l.lock()
	defer l.unlock()
	if l.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	switch {
	case l.step != nil:
		return fmt.Errorf("begin step %d: %w: step %d not ended", m.Step, ErrStepOpen, l.step.id)
	case l.began && m.Step <= l.last:
		return fmt.Errorf("begin step %d: %w: step ids must increase (last %d)", m.Step, ErrStep, l.last)
	case len(m.Seqs) == 0:
		return fmt.Errorf("begin step %d: %w: no sequences", m.Step, ErrBadMessage)
	}
	// Before the step state grows for the batch.
	ids := func(yield func(uint64) bool) {
		for _, s := range m.Seqs {
			if !yield(s.Seq) {
				return
			}
		}
	}
	if err := l.checkBatch(len(m.Seqs), ids); err != nil {
		return fmt.Errorf("begin step %d: %w", m.Step, err)
	}
	if err := l.checkLayer(m.Layer); err != nil {
		return fmt.Errorf("begin step %d: %w", m.Step, err)
	}
	c := l.cfg
	S := c.PageSize
	st := &l.state
	st.reset(m, len(l.ranks))
	// Free pages the step's new tokens take on each rank, summed over the
	// batch: each sequence fitting alone is not enough.
	need := make([]int, len(l.ranks))
	for i, s := range m.Seqs {
		sq, err := l.lookup(s.Seq)
		if err != nil {
			return fmt.Errorf("begin step %d: %w", m.Step, err)
		}
		if _, dup := st.index[s.Seq]; dup {
			return fmt.Errorf("begin step %d: %w: sequence %d appears twice", m.Step, ErrBadMessage, s.Seq)
		}
		switch {
		case s.Len < 0 || (s.Len == 0 && !s.New):
			return fmt.Errorf("begin step %d: %w: sequence %d: length %d and no new token", m.Step, ErrBadMessage, s.Seq, s.Len)
		case s.Budget < 0 || (s.Budget > 0 && s.Budget < S):
			return fmt.Errorf("begin step %d: %w: sequence %d: budget %d tokens is below one page", m.Step, ErrBadMessage, s.Seq, s.Budget)
		case s.DenseLayers < 0 || s.DenseLayers > c.Layers:
			return fmt.Errorf("begin step %d: %w: sequence %d: dense layers %d outside 0..%d", m.Step, ErrBadMessage, s.Seq, s.DenseLayers, c.Layers)
		}
		if _, err := l.plan(m.Layer, s, m.ForceDense); err != nil {
			return fmt.Errorf("begin step %d: %w", m.Step, err)
		}
		st.index[s.Seq] = i
		st.sq = append(st.sq, sq)
		st.ids = append(st.ids, s.Seq)
		if s.New {
			st.fresh = append(st.fresh, i)
		}
		for r, rk := range l.ranks {
			if err := l.checkLen(r, s.Seq, sq, m.Layer, s.Len); err != nil {
				return fmt.Errorf("begin step %d: %w", m.Step, err)
			}
			if s.New && sq.layout.Owner(s.Len/S) == rk.id.CP {
				// The token's page exists (and is private) for the later
				// layers once the first layer wrote it: pages are shared
				// by all layers of a sequence.
				n, err := rk.sh.Store().CheckAppend(sq.local[r], m.Layer, 1)
				if err != nil {
					return fmt.Errorf("begin step %d: new token of sequence %d on rank %v: %w", m.Step, s.Seq, rk.id, err)
				}
				need[r] += n
				st.own[r] = append(st.own[r], i)
			}
		}
	}
	for r, rk := range l.ranks {
		if free := rk.sh.Store().Stats().FreePages; need[r] > free {
			return fmt.Errorf("begin step %d: the new tokens need %d free pages on rank %v, %d are free: %w",
				m.Step, need[r], rk.id, free, pagestore.ErrPoolExhausted)
		}
	}
	if l.db != nil {
		// Markers of the previous step that EndStep could not delete
		// would cut its acknowledged tokens at recovery.
		if err := l.clearMarks(); err != nil {
			return fmt.Errorf("begin step %d: %w", m.Step, err)
		}
		if err := l.takeMarks(st); err != nil {
			return fmt.Errorf("begin step %d: %w", m.Step, err)
		}
		var idx []int
		for si := range st.sq {
			if st.marks[si] != nil && l.sealsPage(st, si) {
				idx = append(idx, si)
			}
		}
		if err := l.putMarks(st, idx); err != nil {
			return fmt.Errorf("begin step %d: %w", m.Step, err)
		}
		l.crashPoint("step/marked")
	}
	l.step, l.last, l.began = st, m.Step, true
	return nil
}

// plan returns the page plan of one sequence of a step at layer.
func (l *Local) plan(layer int, s StepSeq, dense bool) (plan.Plan, error) {
	n := s.Len
	if s.New {
		n++
	}
	pages := l.cfg.Pages(n)
	pl, err := l.cfg.Policy.Plan(layer, pages, s.Budget)
	if err != nil {
		return plan.Plan{}, fmt.Errorf("%w: sequence %d layer %d: %w", ErrBadMessage, s.Seq, layer, err)
	}
	if dense || layer < s.DenseLayers {
		pl = pl.AsDense()
	}
	return pl, nil
}

// Layer implements Worker.
func (l *Local) Layer(ctx context.Context, m LayerRequest, rep *LayerReply) error {
	l.lock()
	defer l.unlock()
	rep.Ranks = resizeOutputs(rep.Ranks, len(l.ranks))
	for i, rk := range l.ranks {
		rep.Ranks[i].Rank, rep.Ranks[i].Appended = rk.id, 0
	}
	if l.closed {
		return ErrClosed
	}
	st := l.step
	switch {
	case st == nil:
		return fmt.Errorf("layer %d of step %d: %w: no open step", m.Layer, m.Step, ErrStep)
	case m.Step != st.id:
		return fmt.Errorf("layer %d of step %d: %w: step %d is open", m.Layer, m.Step, ErrStep, st.id)
	case st.failed:
		return fmt.Errorf("layer %d of step %d: %w: the step failed; end it", m.Layer, m.Step, ErrStep)
	}
	if err := l.checkLayer(m.Layer); err != nil {
		return fmt.Errorf("layer of step %d: %w", m.Step, err)
	}
	if m.Layer < st.next {
		return fmt.Errorf("layer %d of step %d: %w: layers must increase (next %d)", m.Layer, m.Step, ErrStep, st.next)
	}
	// The (step, layer) is taken: its collective tags are used, by this
	// worker or by the aborts it sends if the request is bad.
	st.next = m.Layer + 1
	st.ran = append(st.ran, m.Layer)
	order, err := l.checkLayerRequest(st, m)
	if err != nil {
		st.failed = true
		// The layer's plans are not made yet (st.plans may be the last
		// layer's): a top-p policy aborts its exchange whatever they are.
		for _, rk := range l.ranks {
			l.abort(rk, st.id, m.Layer, err, l.cfg.Mode == Exact, l.cfg.CP > 1 && l.cfg.Policy.TopPOn())
		}
		return fmt.Errorf("layer %d of step %d: %w", m.Layer, m.Step, err)
	}
	for k, i := range order {
		rep.Ranks[k].Rank = l.ranks[i].id
	}
	st.errs = append(st.errs[:0], make([]error, len(order))...)
	errs := st.errs
	if len(order) == 1 {
		errs[0] = l.runRank(ctx, st, order[0], m.Layer, &m.Ranks[0], &rep.Ranks[0])
	} else {
		var wg sync.WaitGroup
		for k, i := range order {
			wg.Go(func() { errs[k] = l.runRank(ctx, st, i, m.Layer, &m.Ranks[k], &rep.Ranks[k]) })
		}
		wg.Wait()
	}
	if err := Cause(errs...); err != nil {
		st.failed = true
		return fmt.Errorf("layer %d of step %d: %w", m.Layer, m.Step, err)
	}
	return nil
}

// checkLayerRequest validates a Layer request against the open step and
// computes the layer's plans; it returns, per request entry, the index of
// its hosted rank. It changes nothing.
func (l *Local) checkLayerRequest(st *stepState, m LayerRequest) ([]int, error) {
	c := l.cfg
	if len(m.Ranks) != len(l.ranks) {
		return nil, fmt.Errorf("%w: %d rank inputs for %d hosted ranks", ErrBadMessage, len(m.Ranks), len(l.ranks))
	}
	st.order = append(st.order[:0], make([]int, len(m.Ranks))...)
	st.seen = append(st.seen[:0], make([]bool, len(l.ranks))...)
	order, seen := st.order, st.seen
	q := len(st.seqs) * c.QHeadsPerRank() * c.HeadDim
	for k, in := range m.Ranks {
		i, err := l.rankOf(in.Rank)
		if err != nil {
			return nil, err
		}
		if seen[i] {
			return nil, fmt.Errorf("%w: rank %v listed twice", ErrBadMessage, in.Rank)
		}
		seen[i] = true
		order[k] = i
		if len(in.Q) != q || !kernels.Finite(in.Q) {
			return nil, fmt.Errorf("%w: rank %v: query must be %d finite floats (%d sequences x %d heads x %d), has %d", ErrBadMessage, in.Rank, q, len(st.seqs), c.QHeadsPerRank(), c.HeadDim, len(in.Q))
		}
		if err := l.checkTokens("k", in.K, len(st.own[i])); err != nil {
			return nil, fmt.Errorf("rank %v: %w", in.Rank, err)
		}
		if err := l.checkTokens("v", in.V, len(st.own[i])); err != nil {
			return nil, fmt.Errorf("rank %v: %w", in.Rank, err)
		}
		if l.ranks[i].mirror != nil {
			if err := l.checkTokens("mirror k", in.MirrorK, len(st.fresh)); err != nil {
				return nil, fmt.Errorf("rank %v: %w", in.Rank, err)
			}
		} else if in.MirrorK != nil {
			return nil, fmt.Errorf("%w: rank %v: mirror keys without replicated selection", ErrBadMessage, in.Rank)
		}
		if m.Layer == st.first {
			continue // BeginStep checked, and the step's sequences cannot change
		}
		for si, s := range st.seqs {
			if err := l.checkLen(i, s.Seq, st.sq[si], m.Layer, s.Len); err != nil {
				return nil, err
			}
		}
	}
	st.plans = st.plans[:0]
	for _, s := range st.seqs {
		pl, err := l.plan(m.Layer, s, st.dense)
		if err != nil {
			return nil, err
		}
		st.plans = append(st.plans, pl)
	}
	return order, nil
}

// EndStep implements Worker. After a failure it forgets the tags of each
// layer once, however often the layer appears in the layers the step ran
// and m.Layers. Entries of m.Layers outside [0, Layers) are ignored, not
// refused: no Layer call can have run (or sent messages under) such a
// layer, and a bad list must not stop the step from ending and the
// valid layers' tags from being forgotten.
func (l *Local) EndStep(ctx context.Context, m EndRequest) error {
	l.lock()
	defer l.unlock()
	st := l.step
	if st == nil || st.id != m.Step {
		return fmt.Errorf("end step %d: %w: not the open step", m.Step, ErrStep)
	}
	// Work that LayerTensor queued: wait for it, so that the step's
	// outputs and appended tokens are in place once it ends; a failure
	// there fails the step (its tags are forgotten below) and is
	// reported, but the step ends regardless.
	serr := l.syncTensors(ctx)
	if serr != nil {
		st.failed = true
	}
	if m.Failed || st.failed {
		// Every worker of a failed step forgets its sequences' kept
		// selections, so that all ranks rank afresh alike (reuse.go).
		for _, sq := range st.sq {
			sq.dropReuse(-1)
		}
	}
	if (m.Failed || st.failed) && !l.closed {
		// Failure path only: a small scratch, one flag per layer.
		done := make([]bool, l.cfg.Layers)
		for _, layers := range [][]int{st.ran, m.Layers} {
			for _, layer := range layers {
				if layer < 0 || layer >= len(done) || done[layer] {
					continue
				}
				done[layer] = true
				for _, rk := range l.ranks {
					rk.tr.Forget(collective.MakeTag(st.id, layer, collective.OpSelect))
					rk.tr.Forget(collective.MakeTag(st.id, layer, collective.OpReduce))
				}
			}
		}
	}
	l.step = nil
	if serr != nil {
		return fmt.Errorf("end %w", serr)
	}
	l.crashPoint("step/end")
	// The step's tokens are acknowledged from here: a recovery must keep
	// them. (After a failed step too: the coordinator keeps the layers
	// that took the token.)
	if err := l.clearMarks(); err != nil {
		return fmt.Errorf("end step %d: %w", m.Step, err)
	}
	return nil
}

func resizeOutputs(s []RankOutput, n int) []RankOutput {
	if cap(s) < n {
		s = append(s[:cap(s)], make([]RankOutput, n-cap(s))...)
	}
	return s[:n]
}
