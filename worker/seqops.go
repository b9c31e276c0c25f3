package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/questrt/questrt/pagestore"
)

// Create implements Worker.
func (l *Local) Create(ctx context.Context, m CreateRequest) error {
	l.lock()
	defer l.unlock()
	if l.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, ok := l.seqs[m.Seq]; ok {
		return fmt.Errorf("create: %w: sequence %d exists", ErrBadMessage, m.Seq)
	}
	if err := l.roomLocked(); err != nil {
		return fmt.Errorf("create sequence %d: %w", m.Seq, err)
	}
	if err := m.Layout.Validate(l.cfg.KVHeads); err != nil {
		return fmt.Errorf("create sequence %d: %w: %w", m.Seq, ErrBadMessage, err)
	}
	if m.Layout.CP != l.cfg.CP || m.Layout.TP != l.cfg.TP {
		return fmt.Errorf("create sequence %d: %w: layout %d x %d on a %d x %d worker", m.Seq, ErrBadMessage, m.Layout.TP, m.Layout.CP, l.cfg.TP, l.cfg.CP)
	}
	sq := &seqState{layout: m.Layout}
	for _, rk := range l.ranks {
		sq.local = append(sq.local, rk.sh.Store().Create())
	}
	if err := l.putEntry(m.Seq, sq); err != nil {
		for i, rk := range l.ranks {
			_ = rk.sh.Release(sq.local[i]) // undo: the table does not name them
		}
		return fmt.Errorf("create sequence %d: %w", m.Seq, err)
	}
	for _, rk := range l.ranks {
		if rk.mirror != nil {
			rk.mirror.Create(m.Seq)
		}
	}
	l.seqs[m.Seq] = sq
	_, _ = l.forgetLost(l.lost, m.Seq) // an id reused: its tombstone goes
	return nil
}

// Fork implements Worker.
func (l *Local) Fork(ctx context.Context, m ForkRequest) error {
	l.lock()
	defer l.unlock()
	sq, err := l.mutable(m.Parent)
	if err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, ok := l.seqs[m.Child]; ok {
		return fmt.Errorf("fork sequence %d: %w: child %d exists", m.Parent, ErrBadMessage, m.Child)
	}
	if err := l.roomLocked(); err != nil {
		return fmt.Errorf("fork sequence %d: %w", m.Parent, err)
	}
	child := &seqState{layout: sq.layout}
	for i, rk := range l.ranks {
		id, err := rk.sh.Fork(sq.local[i])
		if err != nil {
			for j, done := range child.local {
				l.ranks[j].sh.Release(done)
			}
			return fmt.Errorf("fork sequence %d on rank %v: %w", m.Parent, rk.id, err)
		}
		child.local = append(child.local, id)
	}
	if err := l.putEntry(m.Child, child); err != nil {
		for j, done := range child.local {
			l.ranks[j].sh.Release(done)
		}
		return fmt.Errorf("fork sequence %d: %w", m.Parent, err)
	}
	for _, rk := range l.ranks {
		if rk.mirror != nil {
			// The parent is known to every mirror, so this does not fail;
			// if it did, the forks made above are given back.
			if err := rk.mirror.Clone(m.Parent, m.Child); err != nil {
				for j, done := range child.local {
					l.ranks[j].sh.Release(done)
				}
				_ = l.deleteEntry(child) // an orphan left behind is released at recovery
				for _, r2 := range l.ranks {
					if r2.mirror != nil {
						r2.mirror.Drop(m.Child)
					}
				}
				return fmt.Errorf("fork sequence %d on rank %v: %w", m.Parent, rk.id, err)
			}
		}
	}
	l.seqs[m.Child] = child
	_, _ = l.forgetLost(l.lost, m.Child)
	return nil
}

// Release implements Worker.
func (l *Local) Release(ctx context.Context, m ReleaseRequest) error {
	l.lock()
	defer l.unlock()
	if ok, err := l.forgetLost(l.lost, m.Seq); ok {
		// Dropped as damaged (damage.go): its tombstone goes.
		if err != nil {
			return fmt.Errorf("release damaged sequence %d: %w", m.Seq, err)
		}
		return nil
	}
	sq, err := l.mutable(m.Seq)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	// The entry goes first: a crash before the stores' releases leaves
	// orphans, which recovery releases.
	first := l.deleteEntry(sq)
	if first != nil {
		first = fmt.Errorf("release sequence %d: %w", m.Seq, first)
	}
	for i, rk := range l.ranks {
		if err := rk.sh.Release(sq.local[i]); err != nil && first == nil {
			first = fmt.Errorf("release sequence %d on rank %v: %w", m.Seq, rk.id, err)
		}
		if rk.mirror != nil {
			rk.mirror.Drop(m.Seq)
		}
	}
	delete(l.seqs, m.Seq)
	return first
}

// Check implements Worker.
func (l *Local) Check(ctx context.Context, m CheckRequest) error {
	l.lock()
	defer l.unlock()
	sq, err := l.mutable(m.Seq)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	S := l.cfg.PageSize
	switch {
	case m.Len < 0:
		return fmt.Errorf("check sequence %d: %w: length %d", m.Seq, ErrBadMessage, m.Len)
	case (m.Append > 0) == (m.Drop > 0) || m.Append < 0 || m.Drop < 0:
		return fmt.Errorf("check sequence %d: %w: want one of append (%d) and drop (%d) positive", m.Seq, ErrBadMessage, m.Append, m.Drop)
	case m.Drop > m.Len:
		return fmt.Errorf("check sequence %d: %w: drop %d of %d tokens", m.Seq, ErrBadMessage, m.Drop, m.Len)
	}
	if m.Append > 0 {
		if err := l.checkLayer(m.Layer); err != nil {
			return fmt.Errorf("check sequence %d: %w", m.Seq, err)
		}
	}
	for i, rk := range l.ranks {
		p := sq.layout.Place(rk.id.CP)
		if m.Append > 0 {
			if err := l.checkLen(i, m.Seq, sq, m.Layer, m.Len); err != nil {
				return fmt.Errorf("check append: %w", err)
			}
			if n := ownedRange(p, S, m.Len, m.Len+m.Append); n > 0 {
				if _, err := rk.sh.Store().CheckAppend(sq.local[i], m.Layer, n); err != nil {
					return fmt.Errorf("check append sequence %d layer %d on rank %v: %w", m.Seq, m.Layer, rk.id, err)
				}
			}
			continue
		}
		for layer := range l.cfg.Layers {
			if err := l.checkLen(i, m.Seq, sq, layer, m.Len); err != nil {
				return fmt.Errorf("check rollback: %w", err)
			}
		}
		if n := ownedRange(p, S, m.Len-m.Drop, m.Len); n > 0 {
			if err := rk.sh.Store().CheckRollback(sq.local[i], n); err != nil {
				return fmt.Errorf("check rollback sequence %d on rank %v: %w", m.Seq, rk.id, err)
			}
		}
	}
	return nil
}

// Append implements Worker.
func (l *Local) Append(ctx context.Context, m AppendRequest) error {
	l.lock()
	defer l.unlock()
	sq, err := l.mutable(m.Seq)
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	i, err := l.rankOf(m.Rank)
	if err != nil {
		return fmt.Errorf("append sequence %d: %w", m.Seq, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	rk := l.ranks[i]
	if err := l.checkLayer(m.Layer); err != nil {
		return fmt.Errorf("append sequence %d: %w", m.Seq, err)
	}
	if m.Start < 0 || m.Tokens < 1 {
		return fmt.Errorf("append sequence %d: %w: %d tokens at %d", m.Seq, ErrBadMessage, m.Tokens, m.Start)
	}
	if err := l.checkLen(i, m.Seq, sq, m.Layer, m.Start); err != nil {
		return fmt.Errorf("append: %w", err)
	}
	n := ownedRange(sq.layout.Place(rk.id.CP), l.cfg.PageSize, m.Start, m.Start+m.Tokens)
	if err := l.checkTokens("k", m.K, n); err != nil {
		return fmt.Errorf("append sequence %d on rank %v: %w", m.Seq, rk.id, err)
	}
	if err := l.checkTokens("v", m.V, n); err != nil {
		return fmt.Errorf("append sequence %d on rank %v: %w", m.Seq, rk.id, err)
	}
	if rk.mirror != nil {
		if err := l.checkTokens("mirror k", m.MirrorK, m.Tokens); err != nil {
			return fmt.Errorf("append sequence %d on rank %v: %w", m.Seq, rk.id, err)
		}
	} else if m.MirrorK != nil {
		return fmt.Errorf("append sequence %d on rank %v: %w: mirror keys without replicated selection", m.Seq, rk.id, ErrBadMessage)
	}
	if n > 0 {
		if err := rk.sh.Append(sq.local[i], m.Layer, m.K, m.V); err != nil {
			if changedBy(err) {
				err = fmt.Errorf("%w: %w", ErrChanged, err)
			}
			return fmt.Errorf("append sequence %d layer %d on rank %v: %w", m.Seq, m.Layer, rk.id, err)
		}
	}
	if rk.mirror != nil {
		if err := rk.mirror.Append(m.Seq, m.Layer, m.MirrorK); err != nil {
			return fmt.Errorf("append sequence %d layer %d on rank %v: %w: %w", m.Seq, m.Layer, rk.id, ErrChanged, err)
		}
	}
	return nil
}

// Rollback implements Worker.
func (l *Local) Rollback(ctx context.Context, m RollbackRequest) (RollbackReply, error) {
	l.lock()
	defer l.unlock()
	sq, err := l.mutable(m.Seq)
	if err != nil {
		return RollbackReply{}, fmt.Errorf("rollback: %w", err)
	}
	i, err := l.rankOf(m.Rank)
	if err != nil {
		return RollbackReply{}, fmt.Errorf("rollback sequence %d: %w", m.Seq, err)
	}
	if err := ctx.Err(); err != nil {
		return RollbackReply{}, err
	}
	rk := l.ranks[i]
	if m.Lens != nil {
		return RollbackReply{}, l.truncateRank(i, m.Seq, sq, m)
	}
	c := l.cfg
	S := c.PageSize
	if m.Drop < 1 || m.Drop > m.Len {
		return RollbackReply{}, fmt.Errorf("rollback sequence %d: %w: drop %d of %d tokens", m.Seq, ErrBadMessage, m.Drop, m.Len)
	}
	for layer := range c.Layers {
		if err := l.checkLen(i, m.Seq, sq, layer, m.Len); err != nil {
			return RollbackReply{}, fmt.Errorf("rollback: %w", err)
		}
	}
	newLen := m.Len - m.Drop
	p := sq.layout.Place(rk.id.CP)
	n := ownedRange(p, S, newLen, m.Len)
	// The page the new end cuts, if any, and whether this rank owns it.
	cut := -1
	if newLen%S != 0 {
		cut = newLen / S
	}
	ownsCut := cut >= 0 && p.Owner(cut) == p.Rank
	rec := c.KVHeadsPerRank() * 2 * c.HeadDim
	if rk.mirror != nil && cut >= 0 && !ownsCut {
		if len(m.Tail) != c.Layers {
			return RollbackReply{}, fmt.Errorf("rollback sequence %d on rank %v: %w: %d tail records, want one per layer (%d)", m.Seq, rk.id, ErrBadMessage, len(m.Tail), c.Layers)
		}
		for layer, t := range m.Tail {
			if len(t) != rec || !finiteOrInf(t) {
				return RollbackReply{}, fmt.Errorf("rollback sequence %d on rank %v: %w: layer %d tail record has %d floats, want %d", m.Seq, rk.id, ErrBadMessage, layer, len(t), rec)
			}
		}
	} else if m.Tail != nil {
		return RollbackReply{}, fmt.Errorf("rollback sequence %d on rank %v: %w: tail records this rank does not need", m.Seq, rk.id, ErrBadMessage)
	}
	if n > 0 {
		if err := rk.sh.Rollback(sq.local[i], n); err != nil {
			if changedBy(err) {
				err = fmt.Errorf("%w: %w", ErrChanged, err)
			}
			return RollbackReply{}, fmt.Errorf("rollback sequence %d on rank %v: %w", m.Seq, rk.id, err)
		}
	}
	if rk.mirror == nil {
		return RollbackReply{}, nil
	}
	var rep RollbackReply
	tail := m.Tail
	if ownsCut {
		// The owner rescanned the cut page: its records are the truth.
		table, err := rk.sh.Store().AppendPageTable(nil, sq.local[i])
		if err != nil {
			return RollbackReply{}, fmt.Errorf("rollback sequence %d on rank %v: %w: %w", m.Seq, rk.id, ErrChanged, err)
		}
		lp := p.Local(cut)
		// Past the commit point: the caller's deadline must not stop the
		// mirror from following the pages it has already cut.
		rctx := context.WithoutCancel(ctx)
		for layer := range c.Layers {
			pg, err := rk.sh.ReadPages(rctx, layer, table[lp:lp+1])
			if err != nil {
				return RollbackReply{}, fmt.Errorf("rollback sequence %d on rank %v: %w: %w", m.Seq, rk.id, ErrChanged, err)
			}
			rep.Tail = append(rep.Tail, pg.Summary)
		}
		tail = rep.Tail
	}
	if err := rk.mirror.Truncate(m.Seq, newLen); err != nil {
		return RollbackReply{}, fmt.Errorf("rollback sequence %d on rank %v: %w: %w", m.Seq, rk.id, ErrChanged, err)
	}
	for layer, t := range tail {
		if err := rk.mirror.SetPage(m.Seq, layer, cut, t); err != nil {
			return RollbackReply{}, fmt.Errorf("rollback sequence %d on rank %v: %w: %w", m.Seq, rk.id, ErrChanged, err)
		}
	}
	return rep, nil
}

// truncateRank is Rollback with Lens (l.mu held, hosted rank i of
// live sequence sq): every layer of the rank cut to its share of
// m.Lens[layer] global tokens.
func (l *Local) truncateRank(i int, seq uint64, sq *seqState, m RollbackRequest) error {
	rk := l.ranks[i]
	c := l.cfg
	switch {
	case len(m.Lens) != c.Layers:
		return fmt.Errorf("rollback sequence %d: %w: %d lengths for %d layers", seq, ErrBadMessage, len(m.Lens), c.Layers)
	case m.Len != 0 || m.Drop != 0 || m.Tail != nil:
		return fmt.Errorf("rollback sequence %d: %w: per-layer lengths with a length, drop or tail", seq, ErrBadMessage)
	case rk.mirror != nil:
		return fmt.Errorf("rollback sequence %d on rank %v: %w: per-layer rollback under replicated selection", seq, rk.id, ErrBadMessage)
	}
	p := sq.layout.Place(rk.id.CP)
	st := rk.sh.Store()
	to := make([]int, c.Layers)
	for layer, n := range m.Lens {
		if n < 0 {
			return fmt.Errorf("rollback sequence %d: %w: layer %d to length %d", seq, ErrBadMessage, layer, n)
		}
		have, err := st.LayerLen(sq.local[i], layer)
		if err != nil {
			return fmt.Errorf("rollback sequence %d on rank %v: %w", seq, rk.id, err)
		}
		to[layer] = owned(p, c.PageSize, n)
		if to[layer] > have {
			return fmt.Errorf("rollback sequence %d on rank %v: %w: layer %d holds %d tokens, fewer than its %d of length %d", seq, rk.id, ErrBadMessage, layer, have, to[layer], n)
		}
	}
	if err := rk.sh.Truncate(sq.local[i], to); err != nil {
		if changedBy(err) || !errors.Is(err, pagestore.ErrOutOfRange) {
			// A failure part-way may have cut some layers.
			err = fmt.Errorf("%w: %w", ErrChanged, err)
		}
		return fmt.Errorf("rollback sequence %d on rank %v: %w", seq, rk.id, err)
	}
	return nil
}

// finiteOrInf reports whether x holds no NaN (summary records of empty
// heads are +-Inf).
func finiteOrInf(x []float32) bool {
	for _, v := range x {
		if v != v {
			return false
		}
	}
	return true
}

// changedBy reports whether a page store error of an append or rollback
// leaves the rank changed: a data error after the store began, or a
// persistence error (the operation took effect in memory, not on disk:
// pagestore.ErrPersist), so that the caller breaks the sequence instead
// of retrying what this rank already holds.
func changedBy(err error) bool {
	return errors.Is(err, pagestore.ErrData) || errors.Is(err, pagestore.ErrPersist)
}

// roomLocked fails with ErrTooManySequences when the worker holds
// Config.MaxSequences sequences (live and parked); l.mu held.
func (l *Local) roomLocked() error {
	if n, limit := len(l.seqs)+len(l.parked), l.cfg.MaxSequences(); n >= limit {
		return fmt.Errorf("%w: the grid holds %d sequences, its limit (Config.MaxSequences: CP %d x capacity %d pages, at least %d)",
			ErrTooManySequences, n, l.cfg.CP, l.cfg.Capacity, MinSequences)
	}
	return nil
}
