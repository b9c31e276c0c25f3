package worker

import (
	"context"
	"fmt"
	"slices"
)

// MaxKeysPages bounds the pages of one Keys call.
const MaxKeysPages = 1 << 16

// Keys implements Worker.
func (l *Local) Keys(ctx context.Context, m KeysRequest, rep *KeysReply) error {
	l.lock()
	defer l.unlock()
	rep.K = rep.K[:0]
	if l.closed {
		return ErrClosed
	}
	if l.step != nil {
		return fmt.Errorf("keys of sequence %d: %w: step %d is open", m.Seq, ErrStepOpen, l.step.id)
	}
	i, ok := l.byRank[m.Rank]
	if !ok {
		return fmt.Errorf("keys: %w: %v", ErrNotHosted, m.Rank)
	}
	sq, err := l.lookup(m.Seq)
	if err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	if err := l.checkLayer(m.Layer); err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	sh := l.ranks[i].sh
	table, err := sh.Store().AppendPageTable(nil, sq.local[i])
	if err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	if m.From < 0 || m.Count < 0 || m.Count > MaxKeysPages || m.From > len(table)-m.Count {
		return fmt.Errorf("keys: %w: pages [%d, %d+%d) outside the rank's %d pages of sequence %d (at most %d per call)",
			ErrBadMessage, m.From, m.From, m.Count, len(table), m.Seq, MaxKeysPages)
	}
	kr, err := sh.PageKeys(m.Layer, slices.Clone(table[m.From:m.From+m.Count]))
	if err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	for p := range m.Count {
		k, err := kr.Keys(ctx, p)
		if err != nil {
			return fmt.Errorf("keys: %w", err)
		}
		if p == 0 {
			rep.K = slices.Grow(rep.K[:0], m.Count*len(k)) // exactly: no append growth
		}
		rep.K = append(rep.K, k...)
	}
	return nil
}
