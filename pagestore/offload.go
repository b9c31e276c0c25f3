package pagestore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Recall makes the K/V of the physical pages resident in the device pool
// for a step that is about to attend them: a page already resident is a
// hit; a missing one takes a free slot or evicts a resident page that is
// neither pinned nor in pages (writing it to the tier first unless the
// tier's copy is current), then reads its payload from the tier. Every
// page of pages counts as used by the step for the eviction policy. A
// page whose prefetch read is in flight is waited for (a hit, and a
// prefetch hit); a reserved one whose read has not started is read here
// (a miss); reservations of other pages are given back, or their reads
// waited for, when the pages do not fit otherwise (see
// [Store.ReservePrefetch]).
//
// It fails with ErrDeviceFull, changing nothing, when pages do not fit
// beside the pinned pages (see [Store.DeviceRoom]). A tier failure
// returns its error (wrapping the tier's sentinel: errors.Is works) with
// the page; the pages brought in before it stay resident, the rest where
// they were, and no sequence changes. Pages must be allocated (named by
// some page table); the caller keeps their sequences from changing until
// it has read them (the shard holds its lock from Recall to attention).
// Without offload it does nothing.
func (s *Store) Recall(ctx context.Context, pages []int32) error {
	r := s.res
	if r == nil {
		return nil
	}
	for _, p := range pages {
		if p < 0 || int(p) >= s.cfg.Capacity {
			return fmt.Errorf("recall: %w: page %d outside the pool of %d", ErrOutOfRange, p, s.cfg.Capacity)
		}
	}
	t0 := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("recall: %w", err)
	}
	// Uses stamped on the device by earlier steps (StepResident) come
	// before this recall's.
	if err := r.syncUses(ctx); err != nil {
		return fmt.Errorf("recall: %w", err)
	}
	r.tick++
	missing, err := r.ensure(ctx, pages, true)
	r.st.Recalls++
	if err == nil {
		r.st.Misses += int64(missing)
		r.st.Hits += int64(len(pages) - missing)
		for _, p := range pages {
			r.ev.Touch(p, r.tick)
			r.used[p] = r.tick
		}
	}
	r.st.Stall += time.Since(t0)
	if err != nil {
		return fmt.Errorf("recall %d pages (%d missing): %w", len(pages), missing, err)
	}
	return nil
}

// DeviceRoom returns the device slots that the pages of a step can use:
// DeviceBudget minus the resident pinned pages that are not among pages
// (listed once each). It appends the pages of pages that are pinned to
// pinned and returns it: pinned pages stay resident once recalled, so a
// step attending its pages in several passes keeps them in the first.
// Without offload it returns Capacity and pinned unchanged.
func (s *Store) DeviceRoom(pages, pinned []int32) (int, []int32) {
	r := s.res
	if r == nil {
		return s.cfg.Capacity, pinned
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	in := 0 // resident pinned pages among pages
	for _, p := range pages {
		if r.pins[p] > 0 {
			pinned = append(pinned, p)
			if r.slot[p] >= 0 {
				in++
			}
		}
	}
	return r.budget - (r.pinnedRes - in), pinned
}

// AppendSlots appends to dst the device slot of each physical page of
// phys, or -1 for a page that is not resident, and returns the extended
// slice. Without offload a page's slot is its id. It does not allocate
// when dst has room.
func (s *Store) AppendSlots(dst, phys []int32) []int32 {
	r := s.res
	if r == nil {
		return append(dst, phys...)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range phys {
		dst = append(dst, r.slot[p])
	}
	return dst
}

// DeviceSlot returns the device slot of physical page p, or -1 when it is
// not resident (the page's id without offload).
func (s *Store) DeviceSlot(p int32) int32 {
	r := s.res
	if r == nil {
		return p
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.slot[p]
}

// ReadKV copies the [KVHeads][PageSize][HeadDim] K and V of physical page
// p in layer into k and v (each KVHeads*PageSize*HeadDim floats), wherever
// they live: the pool, a device slot, or the tier (read without bringing
// the page in); fp8 records are dequantized (what attention reads). For
// diagnostics and tests: it copies.
func (s *Store) ReadKV(ctx context.Context, layer int, p int32, k, v []float32) error {
	if err := s.checkLayer(layer); err != nil {
		return fmt.Errorf("read kv: %w", err)
	}
	if p < 0 || int(p) >= s.cfg.Capacity {
		return fmt.Errorf("read kv: %w: page %d outside the pool of %d", ErrOutOfRange, p, s.cfg.Capacity)
	}
	blk := s.cfg.PageElems()
	if len(k) != blk || len(v) != blk {
		return fmt.Errorf("read kv: %w: k %d and v %d floats, want %d", ErrBadShape, len(k), len(v), blk)
	}
	if s.res == nil {
		h := s.hostData()
		ld := h.layers[layer]
		o := int(p) * h.pageBlk
		if h.fp8 {
			decodeFP8Records(ld, h.pageBlk, s.cfg.KVHeads, p, k, v)
			return nil
		}
		copy(k, ld.K[o:o+h.pageBlk])
		copy(v, ld.V[o:o+h.pageBlk])
		return nil
	}
	return s.res.readKV(ctx, layer, p, k, v)
}

// ResidencyStats returns a snapshot of the device pool and the tier
// traffic (zeros without offload).
func (s *Store) ResidencyStats() ResidencyStats {
	if s.res == nil {
		return ResidencyStats{}
	}
	return s.res.stats()
}

// CheckResidency verifies the residency bookkeeping of an offloading store
// (page and slot maps against each other and the refcounts, pins, counts)
// and every sequence's pins against its page table; nil without offload.
// It is O(Capacity), for tests and debugging; the store must be quiet.
func (s *Store) CheckResidency() error {
	if s.res == nil {
		return nil
	}
	want := make([]int32, s.cfg.Capacity)
	s.seqMu.RLock()
	for id, sq := range s.seqs {
		sq.mu.Lock()
		n := len(sq.pages)
		first := min(s.cfg.PinFirst, n)
		from := max(n-s.cfg.pinLast(), first)
		exp := append(append([]int32(nil), sq.pages[:first]...), sq.pages[from:]...)
		got := sq.pinned
		ok := len(got) == len(exp)
		for i := 0; ok && i < len(exp); i++ {
			ok = got[i] == exp[i]
		}
		for _, p := range got {
			want[p]++
		}
		sq.mu.Unlock()
		if !ok {
			s.seqMu.RUnlock()
			return fmt.Errorf("seq %d pins %v, its windows hold %v", id, got, exp)
		}
	}
	s.seqMu.RUnlock()
	s.poolMu.Lock()
	ref := append([]int32(nil), s.ref...)
	s.poolMu.Unlock()
	if err := s.res.check(ref); err != nil {
		return err
	}
	s.res.mu.Lock()
	defer s.res.mu.Unlock()
	if err := s.res.checkTable(context.Background()); err != nil {
		return err
	}
	for p, n := range want {
		if s.res.pins[p] != n {
			return fmt.Errorf("page %d has %d pins, the sequences hold %d", p, s.res.pins[p], n)
		}
	}
	return nil
}

// Close releases the store's own memory tier (offload with a nil
// [Config.Tier]); a tier the config gave stays open, the caller's. Later
// operations that need the tier fail with its ErrClosed. A persisting
// store ([Config.DataDir]) first persists every sequence in full, tail
// pages included, stops its flusher and closes its data directory; the
// store must be quiet, and later operations that persist fail with
// ErrPersist. When it cannot save every sequence (a full disk) it still
// closes, and returns an error wrapping the failures' (ErrDiskFull, ...):
// the sequences come back at a restart at their last committed lengths.
// Calls after the first return nil.
func (s *Store) Close() error {
	var err error
	if s.pers != nil {
		err = s.closePersist()
	}
	if s.res == nil || !s.res.ownTier {
		return err
	}
	return errors.Join(err, s.res.tier.Close())
}
