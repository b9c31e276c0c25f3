package pagestore

import (
	"fmt"
	"slices"

	"github.com/questrt/questrt/internal/invariants"
)

// unlock releases sq after a change to its pages or lengths; in builds
// with the invariants or race tag it first checks the sequence's own
// invariants (checkSeqLocked; the O(pages) part only when table, the
// page table, may have changed) and panics on a violation: a bug of this
// package, never bad input.
func (s *Store) unlock(sq *seq, table bool) {
	if invariants.Enabled && !sq.released {
		if err := s.checkSeqLocked(sq, table); err != nil {
			sq.mu.Unlock()
			panic(fmt.Sprintf("pagestore: invariant: %v", err))
		}
	}
	sq.mu.Unlock()
}

// checkSeqLocked checks what holds for one sequence at any time its
// mutex is free, whatever the other sequences do: its page table covers
// exactly its longest layer (ceil(max len / S) pages, no layer past it),
// names distinct pages of the pool, and every page it names is
// referenced (it holds a reference itself). O(layers), and O(pages of
// sq) more with table; sq locked.
func (s *Store) checkSeqLocked(sq *seq, table bool) error {
	S := s.cfg.PageSize
	hi := maxLen(sq.lens)
	if want := (hi + S - 1) / S; len(sq.pages) != want {
		return fmt.Errorf("%d pages for a longest layer of %d tokens (pages of %d): want %d", len(sq.pages), hi, S, want)
	}
	for l, n := range sq.lens {
		if n < 0 {
			return fmt.Errorf("layer %d holds %d tokens", l, n)
		}
	}
	if !table {
		return nil
	}
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	// Duplicates by stamps of a per-store scratch (poolMu held), made
	// once: a check allocates nothing, so that tests measuring
	// allocations (replay's footprint test) read the same under -race.
	if len(s.inv.seen) != s.cfg.Capacity {
		s.inv.seen = make([]invMark, s.cfg.Capacity)
	}
	s.inv.gen++
	gen := s.inv.gen
	for i, p := range sq.pages {
		if p < 0 || int(p) >= s.cfg.Capacity {
			return fmt.Errorf("logical page %d is physical page %d, outside the pool of %d", i, p, s.cfg.Capacity)
		}
		if m := s.inv.seen[p]; m.gen == gen {
			return fmt.Errorf("logical pages %d and %d are both physical page %d", m.idx, i, p)
		}
		s.inv.seen[p] = invMark{gen: gen, idx: i}
		if s.ref[p] < 1 {
			return fmt.Errorf("logical page %d (physical %d) has refcount %d", i, p, s.ref[p])
		}
	}
	return nil
}

// invScratch is the scratch of checkSeqLocked (poolMu guards it).
type invScratch struct {
	seen []invMark // per physical page, the last check that met it
	gen  uint64
}

// invMark is a page met by check gen at logical page idx.
type invMark struct {
	gen uint64
	idx int
}

// CheckInvariants checks the whole pool against the sequences: every
// page's refcount is the number of live page tables naming it, the free
// list holds each page of refcount 0 once and nothing else, every
// sequence passes its own checks, and (offloading) the residency
// bookkeeping holds (CheckResidency). O(Capacity + pages of every
// sequence), for tests and debugging: the store must be quiet (no call
// in progress), since a change moves a refcount and a page table one
// after the other.
func (s *Store) CheckInvariants() error {
	s.seqMu.RLock()
	ids := make([]SeqID, 0, len(s.seqs))
	for id := range s.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	count := make([]int32, s.cfg.Capacity)
	for _, id := range ids {
		sq := s.seqs[id]
		sq.mu.Lock()
		err := s.checkSeqLocked(sq, true)
		for _, p := range sq.pages {
			if p >= 0 && int(p) < len(count) {
				count[p]++
			}
		}
		sq.mu.Unlock()
		if err != nil {
			s.seqMu.RUnlock()
			return fmt.Errorf("seq %d: %w", id, err)
		}
	}
	s.seqMu.RUnlock()
	s.poolMu.Lock()
	onFree := make([]bool, s.cfg.Capacity)
	var err error
	for _, p := range s.free {
		switch {
		case p < 0 || int(p) >= s.cfg.Capacity:
			err = fmt.Errorf("free list holds page %d, outside the pool of %d", p, s.cfg.Capacity)
		case onFree[p]:
			err = fmt.Errorf("free list holds page %d twice", p)
		case s.ref[p] != 0:
			err = fmt.Errorf("free list holds page %d of refcount %d", p, s.ref[p])
		}
		if err != nil {
			break
		}
		onFree[p] = true
	}
	for p := 0; err == nil && p < s.cfg.Capacity; p++ {
		switch {
		case s.ref[p] != count[p]:
			err = fmt.Errorf("page %d has refcount %d, %d page tables name it", p, s.ref[p], count[p])
		case s.ref[p] == 0 && !onFree[p]:
			err = fmt.Errorf("page %d has refcount 0 and is not on the free list", p)
		}
	}
	s.poolMu.Unlock()
	if err != nil {
		return err
	}
	return s.CheckResidency()
}
