package pagestore

import (
	"context"
	"fmt"
)

// Rollback: dropping the last tokens of a sequence. Whole
// pages past the new end are released; when the new end falls inside a
// page, that page's summaries are recomputed for every layer and head
// from the remaining keys (copying the page first if it is shared).

// CheckRollback reports, changing nothing, whether Rollback(id, n) would
// succeed: the range, even layers, and a free page for the copy-on-write of
// a shared page the rollback cuts in the middle.
func (s *Store) CheckRollback(id SeqID, n int) error {
	if n <= 0 {
		return fmt.Errorf("check rollback seq %d by %d tokens: %w: n must be >= 1", id, n, ErrOutOfRange)
	}
	sq, err := s.lock(id)
	if err != nil {
		return fmt.Errorf("check rollback seq %d: %w", id, err)
	}
	defer sq.mu.Unlock()
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	if _, _, _, err := s.rollbackPlan(sq, n); err != nil {
		return fmt.Errorf("check rollback seq %d by %d tokens: %w", id, n, err)
	}
	return nil
}

// rollbackPlan validates a rollback of n >= 1 tokens of sq (sq locked,
// poolMu held) and returns the new length, the number of pages kept, and
// whether the kept tail page is shared and must be copied before its
// summaries are rescanned (a page the rollback frees can serve as the copy).
func (s *Store) rollbackPlan(sq *seq, n int) (newLen, keep int, copyTail bool, err error) {
	if err := s.checkEven(sq); err != nil {
		return 0, 0, false, err
	}
	L := sq.lens[0]
	if n > L {
		return 0, 0, false, fmt.Errorf("%w: sequence has %d", ErrOutOfRange, L)
	}
	S := s.cfg.PageSize
	newLen = L - n
	keep = (newLen + S - 1) / S
	if newLen%S == 0 || s.ref[sq.pages[keep-1]] <= 1 {
		return newLen, keep, false, nil
	}
	avail := len(s.free)
	for _, p := range sq.pages[keep:] {
		if s.ref[p] == 1 {
			avail++
		}
	}
	if avail == 0 {
		return 0, 0, false, fmt.Errorf("copy-on-write of shared tail page needs 1 page, 0 free: %w", ErrPoolExhausted)
	}
	return newLen, keep, true, nil
}

// Rollback drops the last n tokens of every layer. n must be in [1, Len]
// and all layers must have the same length; nothing changes when an
// error is returned, except for an error of the [PageData] (wrapped in
// [ErrData]): the sequence is then rolled back but its tail page's
// summary may still cover dropped keys (a looser bound), and an error
// wrapping [ErrPersist] (rolled back in memory, not on disk). See
// [Store.Append] on data that reports failures late.
func (s *Store) Rollback(id SeqID, n int) error {
	if n <= 0 {
		return fmt.Errorf("rollback seq %d by %d tokens: %w: n must be >= 1", id, n, ErrOutOfRange)
	}
	sq, err := s.lock(id)
	if err != nil {
		return fmt.Errorf("rollback seq %d: %w", id, err)
	}
	defer s.unlock(sq, true)
	return s.cut(id, sq, n)
}

// cut rolls sq (locked) back by n tokens and persists it.
func (s *Store) cut(id SeqID, sq *seq, n int) error {
	what := fmt.Sprintf("rollback seq %d by %d tokens", id, n)
	if err := s.cutLocked(what, id, sq, n); err != nil || s.pers == nil {
		return err
	}
	// A reopened sealed page gives up its slot (its payload changes),
	// and the manifest shrinks to the pages still sealed.
	S := s.cfg.PageSize
	sealed := sq.lens[0] / S
	if sq.sealedUpTo > sealed && sq.lens[0]%S != 0 {
		s.pers.dropPage(sq.pages[sealed])
	}
	sq.sealedUpTo = min(sq.sealedUpTo, sealed)
	s.noteLen(id, sq)
	if err := s.persistSeq(id, sq); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// cutLocked is cut in memory (sq locked); rollbackPlan validates and
// plans under poolMu.
func (s *Store) cutLocked(what string, id SeqID, sq *seq, n int) error {
	S := s.cfg.PageSize
	if s.res != nil {
		// Bring the page to be rescanned (or copied) in before anything
		// changes: a tier failure then fails the cut cleanly.
		s.poolMu.Lock()
		newLen, keep, _, err := s.rollbackPlan(sq, n)
		s.poolMu.Unlock()
		if err == nil && newLen%S != 0 {
			if err := s.res.ensureOne(sq.pages[keep-1]); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
	}
	s.poolMu.Lock()
	newLen, keep, copyTail, err := s.rollbackPlan(sq, n)
	if err != nil {
		s.poolMu.Unlock()
		return fmt.Errorf("%s: %w", what, err)
	}
	sq.cuts++          // (even if the cut fails part-way: a cache only rebuilds)
	tail := newLen % S // valid slots of a reopened page, 0 if none
	dropped := sq.pages[keep:]
	var old, cp int32 = -1, -1
	if copyTail {
		old = sq.pages[keep-1]
	}
	s.setPins(sq, sq.pages[:keep]) // unpin the dropped pages before they are freed
	for _, p := range dropped {
		s.unrefLocked(p)
	}
	if old >= 0 {
		cp = s.popLocked()
	}
	s.poolMu.Unlock()

	sq.pages = sq.pages[:keep]
	for l := range sq.lens {
		sq.lens[l] = newLen
	}
	at := max(keep-1, 0)
	if old >= 0 {
		if err := s.copyPage(sq, cp, old, keep-1); err != nil {
			// Keep the shared page (its summary still covers the
			// dropped keys: a looser bound, never a wrong one) and give
			// the copy back.
			s.poolMu.Lock()
			s.unrefLocked(cp)
			s.poolMu.Unlock()
			_ = s.data.Table(id, at, sq.pages[at:], keep) // best effort
			return fmt.Errorf("%s: %w: %w", what, ErrData, err)
		}
		sq.pages[keep-1] = cp
		s.setPins(sq, sq.pages)
		s.poolMu.Lock()
		s.unrefLocked(old)
		s.poolMu.Unlock()
	}
	if err := s.data.Table(id, at, sq.pages[at:], keep); err != nil {
		_ = s.data.Table(id, at, sq.pages[at:], keep) // best effort, as in Append
		return fmt.Errorf("%s: %w: %w", what, ErrData, err)
	}
	if tail == 0 {
		return nil
	}
	if err := s.data.Rescan(sq.pages[keep-1], tail); err != nil {
		return fmt.Errorf("%s: %w: %w", what, ErrData, err)
	}
	return nil
}

// Truncate cuts every layer l of sequence id to lens[l] tokens (at most
// its length; layers may differ, before and after): the tokens of each
// layer past its new length are dropped, and the summaries of the pages
// that keep some of them are exactly those of a sequence that never held
// them. Recovery uses it to undo the appends of an interrupted step,
// which may have reached some layers and not others.
//
// It is composed of the store's exact operations: it pads every layer to
// the longest one with zeros, rolls all layers back to the shortest new
// length, and appends again, per layer, the tokens it keeps past that
// length (read before the cut). Nothing changes when the lengths are
// refused; a failure part-way (a full pool, a persistence or data error)
// leaves every layer at most at its new length, some perhaps shorter.
// The sequence must not be used concurrently.
func (s *Store) Truncate(id SeqID, lens []int) error {
	c := s.cfg
	if len(lens) != c.Layers {
		return fmt.Errorf("truncate seq %d: %w: %d lengths for %d layers", id, ErrOutOfRange, len(lens), c.Layers)
	}
	have := make([]int, c.Layers)
	for l := range have {
		n, err := s.LayerLen(id, l)
		if err != nil {
			return fmt.Errorf("truncate seq %d: %w", id, err)
		}
		if lens[l] < 0 || lens[l] > n {
			return fmt.Errorf("truncate seq %d: %w: layer %d to %d tokens, it has %d", id, ErrOutOfRange, l, lens[l], n)
		}
		have[l] = n
	}
	lo, hi := minLen(lens), maxLen(have)
	if lo == hi || equalInts(lens, have) {
		return nil
	}
	table, err := s.AppendPageTable(nil, id)
	if err != nil {
		return fmt.Errorf("truncate seq %d: %w", id, err)
	}
	// Keep, per layer, the tokens in [lo, lens[l]) token-major.
	S, tok := c.PageSize, c.KVHeads*c.HeadDim
	D := c.HeadDim
	blk := c.PageElems()
	pk, pv := make([]float32, blk), make([]float32, blk)
	keepK, keepV := make([][]float32, c.Layers), make([][]float32, c.Layers)
	ctx := context.Background()
	for l := range lens {
		for pos := lo; pos < lens[l]; {
			p := pos / S
			if err := s.ReadKV(ctx, l, table[p], pk, pv); err != nil {
				return fmt.Errorf("truncate seq %d: %w", id, err)
			}
			for ; pos < lens[l] && pos/S == p; pos++ {
				r := pos % S
				for h := range c.KVHeads {
					o := h*S*D + r*D
					keepK[l] = append(keepK[l], pk[o:o+D]...)
					keepV[l] = append(keepV[l], pv[o:o+D]...)
				}
			}
		}
	}
	for l, n := range have {
		if n < hi {
			z := make([]float32, (hi-n)*tok)
			if err := s.Append(id, l, z, z); err != nil {
				return fmt.Errorf("truncate seq %d: pad layer %d: %w", id, l, err)
			}
		}
	}
	if hi > lo {
		if err := s.Rollback(id, hi-lo); err != nil {
			return fmt.Errorf("truncate seq %d: %w", id, err)
		}
	}
	for l := range lens {
		if len(keepK[l]) > 0 {
			if err := s.Append(id, l, keepK[l], keepV[l]); err != nil {
				return fmt.Errorf("truncate seq %d: append layer %d again: %w", id, l, err)
			}
		}
	}
	return nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
