package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// opContext bounds a sequence operation: ctx, and StepTimeout.
func (e *Engine) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.cfg.StepTimeout)
}

// lockOp waits for the engine (an open step holds it until its End)
// until ctx is done, and then returns ctx's error; a context that does
// not end waits as for a mutex. An open step gives the engine back
// within its callers' deadlines: a Steps stream whose client stalls is
// ended by the server.
func (e *Engine) lockOp(ctx context.Context, what string) error {
	if err := e.mu.lockCtx(ctx); err != nil {
		return fmt.Errorf("%s: waiting for the engine: %w", what, err)
	}
	return nil
}

// Create starts an empty sequence with the given placement.
func (e *Engine) Create(p plan.Placement) (SeqID, error) {
	return e.CreateContext(context.Background(), p)
}

// CreateContext is Create bounded by ctx (the wait for an open step to
// end, and the workers' calls; those also by StepTimeout).
func (e *Engine) CreateContext(ctx context.Context, p plan.Placement) (SeqID, error) {
	if err := e.lockOp(ctx, "create"); err != nil {
		return 0, err
	}
	defer e.mu.Unlock()
	id := e.nextID
	if err := e.create(ctx, id, p); err != nil {
		return 0, err
	}
	return id, nil
}

// CreateID is Create under an id the caller chooses (a coordinator that
// names its sequences across grids): id must be positive and unused;
// later ids of Create and Fork come after it.
func (e *Engine) CreateID(id SeqID, p plan.Placement) error {
	return e.CreateIDContext(context.Background(), id, p)
}

// CreateIDContext is CreateID bounded by ctx (and StepTimeout).
func (e *Engine) CreateIDContext(ctx context.Context, id SeqID, p plan.Placement) error {
	if err := e.lockOp(ctx, "create"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	return e.create(ctx, id, p)
}

func (e *Engine) create(ctx context.Context, id SeqID, p plan.Placement) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if p != plan.Striped && p != plan.Contiguous {
		return fmt.Errorf("create: %w: placement %d", ErrBadInput, p)
	}
	if err := e.freeID(id); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	ctx, cancel := e.opContext(ctx)
	defer cancel()
	sq := &seqState{layout: plan.Layout{CP: e.cfg.CP, TP: e.cfg.TP, Placement: p, BlockPages: e.cfg.BlockPages},
		lens: make([]int, e.cfg.Layers)}
	for w, wk := range e.workers {
		if err := wk.Create(ctx, worker.CreateRequest{Seq: uint64(id), Layout: sq.layout}); err != nil {
			e.releaseOn(id, w)
			return fmt.Errorf("create: %w", err)
		}
	}
	e.nextID = max(e.nextID, id+1)
	e.seqs[id] = sq
	return nil
}

// freeID refuses an id that is 0 or names a sequence.
func (e *Engine) freeID(id SeqID) error {
	if id == 0 {
		return fmt.Errorf("%w: sequence id 0", ErrBadInput)
	}
	if _, ok := e.seqs[id]; ok {
		return fmt.Errorf("%w: sequence %d exists", ErrBadInput, id)
	}
	return nil
}

// releaseOn releases sequence id on the first n workers (undoing a create
// or fork that failed on worker n).
func (e *Engine) releaseOn(id SeqID, n int) {
	ctx, cancel := detached()
	defer cancel()
	for _, wk := range e.workers[:n] {
		_ = wk.Release(ctx, worker.ReleaseRequest{Seq: uint64(id)}) // best effort: the worker forgets it anyway
	}
}

// Len returns a sequence's length (the shortest layer).
func (e *Engine) Len(id SeqID) (int, error) {
	if err := e.lockOp(context.Background(), "len"); err != nil {
		return 0, err
	}
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return 0, err
	}
	return slices.Min(sq.lens), nil
}

// Append appends n tokens to one layer of a sequence; k and v are
// [n][KVHeads][HeadDim] for the whole model. Each token goes to the CP rank
// that owns its page, split by KV heads over the TP ranks. Bad input and a
// pool too small change nothing.
func (e *Engine) Append(id SeqID, layer int, k, v []float32) error {
	return e.AppendContext(context.Background(), id, layer, k, v)
}

// AppendContext is Append bounded by ctx (and StepTimeout): a caller that
// gives up stops the workers' calls.
func (e *Engine) AppendContext(ctx context.Context, id SeqID, layer int, k, v []float32) error {
	if err := e.lockOp(ctx, "append"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	if err := e.checkKV(layer, k, v); err != nil {
		return fmt.Errorf("append seq %d: %w", id, err)
	}
	ctx, cancel := e.opContext(ctx)
	defer cancel()
	return e.append(ctx, id, sq, layer, k, v)
}

func (e *Engine) checkKV(layer int, k, v []float32) error {
	tok := e.cfg.KVRow()
	switch {
	case layer < 0 || layer >= e.cfg.Layers:
		return fmt.Errorf("%w: layer %d outside 0..%d", ErrBadInput, layer, e.cfg.Layers-1)
	case len(k) == 0 || len(k)%tok != 0 || len(v) != len(k):
		return fmt.Errorf("%w: k %d and v %d floats are not the same whole number of tokens of %d", ErrBadInput, len(k), len(v), tok)
	case !kernels.Finite(k):
		return fmt.Errorf("%w: non-finite key (k)", ErrBadInput)
	case !kernels.Finite(v):
		return fmt.Errorf("%w: non-finite value (v)", ErrBadInput)
	}
	return checkMagnitude("k", k, e.cfg.HeadDim)
}

// append checks the append on every worker, then sends the tokens run by
// run: each run of consecutive pages with one owner goes to the owner's
// rank of every TP group (its heads of the run's keys and values: with one
// TP rank a slice of k and v, no copy) and, under replicated selection,
// the run's keys to every other CP rank's mirror. A failure after a rank
// changed breaks the sequence.
//
// The messages allow any split of the range: a coordinator across a
// network would send each rank its runs in one message instead.
func (e *Engine) append(ctx context.Context, id SeqID, sq *seqState, layer int, k, v []float32) error {
	c := e.cfg
	tok := c.KVRow()
	n := len(k) / tok
	start := sq.lens[layer]
	// Capacity first, exactly, on every rank the append touches (new
	// pages and copy-on-write copies): a pool too small changes nothing.
	for _, wk := range e.workers {
		if err := wk.Check(ctx, worker.CheckRequest{Seq: uint64(id), Layer: layer, Len: start, Append: n}); err != nil {
			return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
		}
	}
	replicated := c.Selection == Replicated
	var kt, vt []float32
	changed := false
	send := func(m worker.AppendRequest) error {
		if err := e.worker(m.Rank.TP, m.Rank.CP).Append(ctx, m); err != nil {
			if changed || errors.Is(err, worker.ErrChanged) {
				sq.broken = true
			}
			return fmt.Errorf("append seq %d layer %d on shard (tp %d, cp %d): %w", id, layer, m.Rank.TP, m.Rank.CP, err)
		}
		changed = true
		return nil
	}
	// run returns the end of the run of tokens from t0 whose pages one
	// rank owns, and that rank.
	run := func(t0 int) (int, int) {
		r := sq.layout.Owner((start + t0) / c.PageSize)
		t1 := t0
		for t1 < n && sq.layout.Owner((start+t1)/c.PageSize) == r {
			t1 = min(n, ((start+t1)/c.PageSize+1)*c.PageSize-start) // to the end of the page
		}
		return t1, r
	}
	if c.TP > 1 {
		// Scratch for one run of one TP rank's heads, sized once.
		longest := 0
		for t0 := 0; t0 < n; {
			t1, _ := run(t0)
			longest, t0 = max(longest, t1-t0), t1
		}
		kt = make([]float32, 0, longest*e.kvT*c.HeadDim)
		vt = make([]float32, 0, longest*e.kvT*c.HeadDim)
	}
	for t0 := 0; t0 < n; {
		t1, r := run(t0)
		for tp := range c.TP {
			if c.TP == 1 {
				kt, vt = k[t0*tok:t1*tok], v[t0*tok:t1*tok]
			} else {
				lo, hi := tp*e.kvT*c.HeadDim, (tp+1)*e.kvT*c.HeadDim
				kt, vt = kt[:0], vt[:0]
				for t := t0; t < t1; t++ {
					kt = append(kt, k[t*tok+lo:t*tok+hi]...)
					vt = append(vt, v[t*tok+lo:t*tok+hi]...)
				}
			}
			m := worker.AppendRequest{Seq: uint64(id), Rank: worker.Rank{TP: tp, CP: r}, Layer: layer, Start: start + t0, Tokens: t1 - t0, K: kt, V: vt}
			if replicated {
				m.MirrorK = kt
			}
			if err := send(m); err != nil {
				return err
			}
			if !replicated {
				continue
			}
			for cp := range c.CP {
				if cp != r {
					m.Rank.CP, m.K, m.V = cp, nil, nil
					if err := send(m); err != nil {
						return err
					}
				}
			}
		}
		t0 = t1
	}
	sq.lens[layer] += n
	return nil
}

// Fork makes a child sharing every page with the parent on every shard
// (copy-on-write tails).
func (e *Engine) Fork(id SeqID) (SeqID, error) {
	return e.ForkContext(context.Background(), id)
}

// ForkContext is Fork bounded by ctx (and StepTimeout).
func (e *Engine) ForkContext(ctx context.Context, id SeqID) (SeqID, error) {
	if err := e.lockOp(ctx, "fork"); err != nil {
		return 0, err
	}
	defer e.mu.Unlock()
	cid := e.nextID
	if err := e.fork(ctx, id, cid); err != nil {
		return 0, err
	}
	return cid, nil
}

// ForkID is Fork with the child's id chosen by the caller (see
// CreateID).
func (e *Engine) ForkID(id, child SeqID) error {
	return e.ForkIDContext(context.Background(), id, child)
}

// ForkIDContext is ForkID bounded by ctx (and StepTimeout).
func (e *Engine) ForkIDContext(ctx context.Context, id, child SeqID) error {
	if err := e.lockOp(ctx, "fork"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	return e.fork(ctx, id, child)
}

func (e *Engine) fork(ctx context.Context, id, cid SeqID) error {
	sq, err := e.lookup(id)
	if err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	if err := e.freeID(cid); err != nil {
		return fmt.Errorf("fork seq %d: %w", id, err)
	}
	if slices.Min(sq.lens) != slices.Max(sq.lens) {
		return fmt.Errorf("fork seq %d: %w", id, pagestore.ErrUnevenLayers)
	}
	ctx, cancel := e.opContext(ctx)
	defer cancel()
	for w, wk := range e.workers {
		if err := wk.Fork(ctx, worker.ForkRequest{Parent: uint64(id), Child: uint64(cid)}); err != nil {
			e.releaseOn(cid, w) // the failing worker undid its own forks
			return fmt.Errorf("fork seq %d: %w", id, err)
		}
	}
	e.nextID = max(e.nextID, cid+1)
	e.seqs[cid] = &seqState{layout: sq.layout, lens: slices.Clone(sq.lens)}
	return nil
}

// Rollback drops the last n tokens of every layer on every shard.
func (e *Engine) Rollback(id SeqID, n int) error {
	return e.RollbackContext(context.Background(), id, n)
}

// RollbackContext is Rollback bounded by ctx (and StepTimeout).
func (e *Engine) RollbackContext(ctx context.Context, id SeqID, n int) error {
	if err := e.lockOp(ctx, "rollback"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return fmt.Errorf("rollback: %w", err)
	}
	l := sq.lens[0]
	if slices.Min(sq.lens) != slices.Max(sq.lens) {
		return fmt.Errorf("rollback seq %d: %w", id, pagestore.ErrUnevenLayers)
	}
	if n <= 0 || n > l {
		return fmt.Errorf("rollback seq %d: %w: %d tokens of %d", id, ErrBadInput, n, l)
	}
	ctx, cancel := e.opContext(ctx)
	defer cancel()
	c := e.cfg
	newLen := l - n
	// Check every rank first (range, copy-on-write capacity) so that a
	// rollback that cannot complete changes nothing.
	for _, wk := range e.workers {
		if err := wk.Check(ctx, worker.CheckRequest{Seq: uint64(id), Len: l, Drop: n}); err != nil {
			return fmt.Errorf("rollback seq %d: %w", id, err)
		}
	}
	// Ranks that drop tokens (a pass over the dropped pages).
	drops := make([]bool, c.CP)
	for g := newLen / c.PageSize; g*c.PageSize < l; g++ {
		drops[sq.layout.Owner(g)] = true
	}
	replicated := c.Selection == Replicated
	// The page the new end cuts: its owner rescans it, and under
	// replicated selection hands its summaries to the other ranks'
	// mirrors, so it goes first.
	owner := -1
	if newLen%c.PageSize != 0 {
		owner = sq.layout.Owner(newLen / c.PageSize)
	}
	order := make([]int, 0, c.CP)
	if owner >= 0 {
		order = append(order, owner)
	}
	for cp := range c.CP {
		if cp != owner {
			order = append(order, cp)
		}
	}
	changed := false
	for tp := range c.TP {
		var tail [][]float32
		for _, cp := range order {
			if !drops[cp] && !replicated {
				continue
			}
			m := worker.RollbackRequest{Seq: uint64(id), Rank: worker.Rank{TP: tp, CP: cp}, Len: l, Drop: n}
			if replicated && owner >= 0 && cp != owner {
				m.Tail = tail
			}
			rep, err := e.worker(tp, cp).Rollback(ctx, m)
			if err != nil {
				sq.broken = changed || errors.Is(err, worker.ErrChanged)
				return fmt.Errorf("rollback seq %d on shard (tp %d, cp %d): %w", id, tp, cp, err)
			}
			changed = true
			if cp == owner {
				tail = rep.Tail
			}
		}
	}
	for i := range sq.lens {
		sq.lens[i] = newLen
	}
	return nil
}

// Release frees a sequence on every shard.
func (e *Engine) Release(id SeqID) error {
	return e.ReleaseContext(context.Background(), id)
}

// ReleaseContext is Release bounded by ctx (the workers' calls also by
// StepTimeout); the sequence is forgotten whatever the workers answer. A
// caller that must release passes a context that does not end.
func (e *Engine) ReleaseContext(ctx context.Context, id SeqID) error {
	if err := e.lockOp(ctx, "release"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	if _, ok := e.seqs[id]; !ok {
		return fmt.Errorf("release: %w: %d", ErrUnknownSequence, id)
	}
	ctx, cancel := e.opContext(ctx)
	defer cancel()
	var first error
	for _, wk := range e.workers {
		if err := wk.Release(ctx, worker.ReleaseRequest{Seq: uint64(id)}); err != nil && first == nil {
			first = err
		}
	}
	delete(e.seqs, id)
	return first
}
