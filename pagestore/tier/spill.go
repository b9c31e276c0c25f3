package tier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// SpillConfig configures a [Spill].
type SpillConfig struct {
	// Budget is the most payloads the upper tier holds at once, in
	// 1 .. Slots (a budget of Slots never spills).
	Budget int
	// PromoteOnRead moves a payload read from the lower tier back into
	// the upper one after the Read has filled dst (spilling the least
	// recently used upper payload when the budget is full). Promotion is
	// best effort: it never fails or delays the Read beyond that one
	// spill, it is skipped when every upper payload is in use by other
	// calls, and a failed promotion (a spill the lower tier refused)
	// leaves the payload below and is counted in [SpillStats.SpillErrors].
	// Off (the default), a payload stays below until it is written again
	// or freed: a read never writes to the lower tier.
	PromoteOnRead bool
}

// Validate reports the first problem with c for a tier of slots slots, or
// nil; the error wraps [ErrSize].
func (c SpillConfig) Validate(slots int) error {
	if c.Budget < 1 || c.Budget > slots {
		return fmt.Errorf("tier: spill config: budget %d payloads, want 1 .. %d (the slots): %w", c.Budget, slots, ErrSize)
	}
	return nil
}

// SpillStats is a snapshot of a [Spill]'s residency and counters.
type SpillStats struct {
	// Budget is the most payloads the upper tier may hold.
	Budget int
	// Upper and Lower are the slots holding a payload in each tier now.
	Upper, Lower int
	// Spills counts payloads moved from the upper tier to the lower one to
	// make room, SpilledBytes their bytes; SpillErrors the spills that
	// failed (the payload stayed above).
	Spills, SpilledBytes, SpillErrors int64
	// UpperReads and LowerReads count the Reads served by each tier.
	UpperReads, LowerReads int64
	// Promotions counts payloads moved up by reads (PromoteOnRead).
	Promotions int64
}

// Where a slot's payload lives.
const (
	inNone uint8 = iota
	inUpper
	inLower
)

// errNoPlace: a call that may not wait found the upper tier full and no
// payload in it free to spill.
var errNoPlace = errors.New("tier: spill: no upper place free")

// Spill is a Tier made of two: an upper tier (host memory, typically a
// [Memory]) that holds at most Budget payloads, and a lower tier (any
// Tier, typically a disk tier) for the rest. Every slot's payload lives in
// exactly one of them:
//
//   - Write stores the payload in the upper tier. When the upper tier is
//     full, its least recently used payload (by Write and Read) moves to
//     the lower tier first: written there, then freed above. A Write of a
//     slot that lives below frees the lower copy once the upper one is
//     written.
//   - Read reads from wherever the slot lives (see
//     [SpillConfig.PromoteOnRead] for moving it up).
//   - Free frees the slot wherever it lives.
//
// A failure of the lower tier during a spill leaves the payload to spill
// in the upper tier (nothing is lost) and fails the Write that needed the
// room with the lower tier's error wrapped (errors.Is finds ErrInjected,
// ErrCorrupt, an I/O error, ...); the written slot is then unchanged.
// Errors of the lower tier's Read and Free pass through wrapped the same
// way. The transient state of a spill (the payload in both tiers) is never
// visible: a slot's calls, the spill included, run under one lock per
// slot.
//
// Spill keeps the Tier contract (see the package documentation): calls on
// one slot are linearizable, calls on distinct slots run in parallel
// except that a Write that needs room, with every upper payload busy in
// other calls, waits for one of them to finish (ending early with ctx's
// error, having changed nothing). A call whose ctx is done when it starts
// changes nothing; a ctx that ends during a spill aborts the spill (the
// payload stays above) and the Write.
//
// Ownership: a Spill owns both tiers. Close waits for calls in flight, then
// closes the upper and the lower tier and returns their errors joined;
// do not use or close them directly afterwards (a second Close of either
// returns nil by the Tier contract, so closing them again is harmless).
// Both tiers must be given empty, or be tiers with a Used method
// ([Memory], the disk tier) whose payloads are then adopted.
//
// Create it with [NewSpill].
type Spill struct {
	upper, lower Tier
	cfg          SpillConfig
	slots, size  int

	closeMu sync.Mutex
	life    sync.RWMutex // held for reading by every call, for writing by Close
	closed  bool

	locks []sync.Mutex // one per slot: held for a whole call on the slot, and by a spill of it

	mu         sync.Mutex // guards what follows
	loc        []uint8    // where each slot's payload lives
	prev, next []int32    // LRU list of upper slots; index slots is the sentinel, next of it the most recent
	used       int        // upper places taken: upper payloads plus reservations in flight
	nUpper     int
	nLower     int
	wake       chan struct{} // closed when a slot lock or a place is released while someone waits

	waiters atomic.Int64

	spills, spillErrs, upperReads, lowerReads, promotions atomic.Int64

	bufs sync.Pool // *[]byte of size bytes, for spills
}

var _ Tier = (*Spill)(nil)

// usedLister is the method of [Memory] and the disk tier that lists the
// slots holding a payload.
type usedLister interface{ Used() []int }

// NewSpill returns a Spill over upper and lower, which must have the same
// Slots and PayloadBytes and be distinct. When a tier has a Used method
// its payloads are adopted (at most cfg.Budget in upper, none in both);
// otherwise it must be empty. The Spill owns both tiers from then on, even
// when NewSpill fails: it closes them then.
func NewSpill(upper, lower Tier, cfg SpillConfig) (s *Spill, err error) {
	defer func() {
		if err != nil {
			if upper != nil {
				upper.Close()
			}
			if lower != nil && lower != upper {
				lower.Close()
			}
		}
	}()
	if upper == nil || lower == nil {
		return nil, errors.New("tier: new spill: a nil tier")
	}
	if upper == lower {
		return nil, errors.New("tier: new spill: upper and lower are the same tier")
	}
	slots, size := upper.Slots(), upper.PayloadBytes()
	if lower.Slots() != slots {
		return nil, fmt.Errorf("tier: new spill: upper has %d slots, lower %d: %w", slots, lower.Slots(), ErrSlot)
	}
	if lower.PayloadBytes() != size {
		return nil, fmt.Errorf("tier: new spill: upper payloads are %d bytes, lower %d: %w", size, lower.PayloadBytes(), ErrSize)
	}
	if err := cfg.Validate(slots); err != nil {
		return nil, fmt.Errorf("tier: new spill: %w", err)
	}
	s = &Spill{
		upper: upper, lower: lower, cfg: cfg, slots: slots, size: size,
		locks: make([]sync.Mutex, slots),
		loc:   make([]uint8, slots),
		prev:  make([]int32, slots+1),
		next:  make([]int32, slots+1),
		wake:  make(chan struct{}),
	}
	s.prev[slots], s.next[slots] = int32(slots), int32(slots)
	s.bufs.New = func() any { b := make([]byte, size); return &b }
	if u, ok := lower.(usedLister); ok {
		for _, sl := range u.Used() {
			s.loc[sl] = inLower
			s.nLower++
		}
	}
	if u, ok := upper.(usedLister); ok {
		for _, sl := range u.Used() {
			if s.loc[sl] == inLower {
				return nil, fmt.Errorf("tier: new spill: slot %d holds a payload in both tiers", sl)
			}
			s.loc[sl] = inUpper
			s.pushFront(sl)
			s.nUpper++
		}
		if s.nUpper > cfg.Budget {
			return nil, fmt.Errorf("tier: new spill: upper holds %d payloads, over the budget of %d: %w", s.nUpper, cfg.Budget, ErrSize)
		}
		s.used = s.nUpper
	}
	return s, nil
}

// Slots implements Tier.
func (s *Spill) Slots() int { return s.slots }

// PayloadBytes implements Tier.
func (s *Spill) PayloadBytes() int { return s.size }

// Config returns the configuration the Spill was made with.
func (s *Spill) Config() SpillConfig { return s.cfg }

// Stats returns a snapshot of the residency and the counters.
func (s *Spill) Stats() SpillStats {
	s.mu.Lock()
	up, low := s.nUpper, s.nLower
	s.mu.Unlock()
	n := s.spills.Load()
	return SpillStats{
		Budget: s.cfg.Budget, Upper: up, Lower: low,
		Spills: n, SpilledBytes: n * int64(s.size), SpillErrors: s.spillErrs.Load(),
		UpperReads: s.upperReads.Load(), LowerReads: s.lowerReads.Load(),
		Promotions: s.promotions.Load(),
	}
}

// LRU list operations; s.mu held.

func (s *Spill) pushFront(sl int) {
	h := int32(s.slots)
	n := s.next[h]
	s.prev[sl], s.next[sl] = h, n
	s.prev[n], s.next[h] = int32(sl), int32(sl)
}

func (s *Spill) pushBack(sl int) {
	h := int32(s.slots)
	p := s.prev[h]
	s.prev[sl], s.next[sl] = p, h
	s.next[p], s.prev[h] = int32(sl), int32(sl)
}

func (s *Spill) remove(sl int) {
	p, n := s.prev[sl], s.next[sl]
	s.next[p], s.prev[n] = n, p
}

func (s *Spill) touch(sl int) {
	s.remove(sl)
	s.pushFront(sl)
}

// begin checks the common arguments and holds s.life for reading; the
// caller releases it when err is nil. n < 0 skips the size check.
func (s *Spill) begin(ctx context.Context, op string, slot, n int) error {
	if err := CheckContext(ctx); err != nil {
		return fmt.Errorf("tier: spill %s slot %d: %w", op, slot, err)
	}
	if err := CheckSlot(slot, s.slots); err != nil {
		return fmt.Errorf("tier: spill %s: %w", op, err)
	}
	if n >= 0 {
		if err := CheckSize(n, s.size); err != nil {
			return fmt.Errorf("tier: spill %s slot %d: %w", op, slot, err)
		}
	}
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return fmt.Errorf("tier: spill %s slot %d: %w", op, slot, ErrClosed)
	}
	return nil
}

// unlockSlot releases slot's lock and wakes the calls waiting for an
// upper place (the slot may be spillable now).
func (s *Spill) unlockSlot(slot int) {
	s.locks[slot].Unlock()
	s.signal()
}

func (s *Spill) signal() {
	if s.waiters.Load() == 0 {
		return
	}
	s.mu.Lock()
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
}

// release gives back an upper place taken by [Spill.place] and not used.
func (s *Spill) release() {
	s.mu.Lock()
	s.used--
	s.mu.Unlock()
	s.signal()
}

// place takes an upper place for slot (whose lock the caller holds and
// which is not in the upper tier), spilling the least recently used upper
// payload that no other call holds when the budget is full. With wait it
// waits, until ctx ends, for a payload to become free to spill; without,
// it returns errNoPlace. On error no place is taken and nothing changed.
func (s *Spill) place(ctx context.Context, slot int, wait bool) error {
	for {
		s.mu.Lock()
		if s.used < s.cfg.Budget {
			s.used++
			s.mu.Unlock()
			return nil
		}
		// Count as a waiter before trying the locks, so that an unlock
		// after a failed TryLock wakes this call.
		s.waiters.Add(1)
		victim := -1
		h := int32(s.slots)
		for v := s.prev[h]; v != h; v = s.prev[v] {
			if int(v) != slot && s.locks[v].TryLock() {
				victim = int(v)
				break
			}
		}
		if victim >= 0 {
			s.waiters.Add(-1)
			s.remove(victim) // no other call picks it while it spills
			s.mu.Unlock()
			return s.spill(ctx, victim)
		}
		ch := s.wake
		s.mu.Unlock()
		if !wait {
			s.waiters.Add(-1)
			return errNoPlace
		}
		err := waitWake(ctx, ch)
		s.waiters.Add(-1)
		if err != nil {
			return fmt.Errorf("waiting for room in the upper tier (budget %d, every payload in use): %w", s.cfg.Budget, err)
		}
	}
}

// waitWake waits for ch to close, for at most a millisecond (a safety net
// against a missed wake-up), or until ctx ends.
func waitWake(ctx context.Context, ch <-chan struct{}) error {
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// spill moves upper payload v (locked by the caller's place, taken off
// the LRU list) to the lower tier and unlocks it. Its upper place passes
// to the caller. On error v stays above, as the least recently used.
func (s *Spill) spill(ctx context.Context, v int) (err error) {
	defer s.unlockSlot(v)
	defer func() {
		if err != nil {
			s.spillErrs.Add(1)
			s.mu.Lock()
			s.pushBack(v)
			s.mu.Unlock()
			err = fmt.Errorf("spill slot %d to the lower tier: %w", v, err)
		}
	}()
	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	now := context.WithoutCancel(ctx)
	if err := s.upper.Read(now, v, *bp); err != nil {
		return fmt.Errorf("read it above: %w", err)
	}
	if err := s.lower.Write(ctx, v, *bp); err != nil {
		return err
	}
	if err := s.upper.Free(now, v); err != nil {
		// Keep the upper copy, the only one the Spill knows of.
		if ferr := s.lower.Free(now, v); ferr != nil {
			err = errors.Join(err, fmt.Errorf("undo the lower copy: %w", ferr))
		}
		return fmt.Errorf("free it above: %w", err)
	}
	s.mu.Lock()
	s.loc[v] = inLower
	s.nUpper--
	s.nLower++
	s.mu.Unlock()
	s.spills.Add(1)
	return nil
}

// Write implements Tier: the payload lands in the upper tier, after a
// spill when the upper tier is full.
func (s *Spill) Write(ctx context.Context, slot int, payload []byte) error {
	if err := s.begin(ctx, "write", slot, len(payload)); err != nil {
		return err
	}
	defer s.life.RUnlock()
	s.locks[slot].Lock()
	defer s.unlockSlot(slot)
	if err := s.moveUp(ctx, slot, payload, true); err != nil {
		return fmt.Errorf("tier: spill write slot %d: %w", slot, err)
	}
	return nil
}

// moveUp writes payload to slot in the upper tier (slot's lock held),
// taking a place for it when it is not there yet and freeing a lower copy.
// On error slot is unchanged (but for an upper tier's I/O error on an
// overwrite, as the Tier contract allows).
func (s *Spill) moveUp(ctx context.Context, slot int, payload []byte, wait bool) error {
	now := context.WithoutCancel(ctx)
	s.mu.Lock()
	where := s.loc[slot]
	if where == inUpper {
		s.touch(slot)
	}
	s.mu.Unlock()
	if where == inUpper {
		return s.upper.Write(now, slot, payload)
	}
	if err := s.place(ctx, slot, wait); err != nil {
		return err
	}
	if err := s.upper.Write(now, slot, payload); err != nil {
		s.release()
		return err
	}
	if where == inLower {
		if err := s.lower.Free(now, slot); err != nil && !errors.Is(err, ErrEmpty) {
			// Back to the old state: the payload below. (ErrEmpty: the
			// lower tier lost it already; the new payload replaces it.)
			if ferr := s.upper.Free(now, slot); ferr != nil {
				err = errors.Join(err, fmt.Errorf("undo the upper copy: %w", ferr))
			}
			s.release()
			return fmt.Errorf("free the lower copy: %w", err)
		}
	}
	s.mu.Lock()
	s.loc[slot] = inUpper
	s.pushFront(slot)
	s.nUpper++
	if where == inLower {
		s.nLower--
	}
	s.mu.Unlock()
	return nil
}

// Read implements Tier: it reads from the tier slot lives in.
func (s *Spill) Read(ctx context.Context, slot int, dst []byte) error {
	if err := s.begin(ctx, "read", slot, len(dst)); err != nil {
		return err
	}
	defer s.life.RUnlock()
	s.locks[slot].Lock()
	defer s.unlockSlot(slot)
	s.mu.Lock()
	where := s.loc[slot]
	if where == inUpper {
		s.touch(slot)
	}
	s.mu.Unlock()
	switch where {
	case inUpper:
		if err := s.upper.Read(context.WithoutCancel(ctx), slot, dst); err != nil {
			return fmt.Errorf("tier: spill read slot %d above: %w", slot, err)
		}
		s.upperReads.Add(1)
	case inLower:
		if err := s.lower.Read(ctx, slot, dst); err != nil {
			return fmt.Errorf("tier: spill read slot %d below: %w", slot, err)
		}
		s.lowerReads.Add(1)
		if s.cfg.PromoteOnRead {
			if err := s.moveUp(ctx, slot, dst, false); err == nil {
				s.promotions.Add(1)
			}
		}
	default:
		return fmt.Errorf("tier: spill read slot %d: %w", slot, ErrEmpty)
	}
	return nil
}

// Free implements Tier: it frees slot in the tier it lives in.
func (s *Spill) Free(ctx context.Context, slot int) error {
	if err := s.begin(ctx, "free", slot, -1); err != nil {
		return err
	}
	defer s.life.RUnlock()
	s.locks[slot].Lock()
	defer s.unlockSlot(slot)
	s.mu.Lock()
	where := s.loc[slot]
	s.mu.Unlock()
	switch where {
	case inUpper:
		if err := s.upper.Free(context.WithoutCancel(ctx), slot); err != nil {
			return fmt.Errorf("tier: spill free slot %d above: %w", slot, err)
		}
		s.mu.Lock()
		s.loc[slot] = inNone
		s.remove(slot)
		s.nUpper--
		s.used--
		s.mu.Unlock()
	case inLower:
		if err := s.lower.Free(ctx, slot); err != nil {
			if errors.Is(err, ErrEmpty) { // the lower tier lost it: empty now
				s.mu.Lock()
				s.loc[slot] = inNone
				s.nLower--
				s.mu.Unlock()
			}
			return fmt.Errorf("tier: spill free slot %d below: %w", slot, err)
		}
		s.mu.Lock()
		s.loc[slot] = inNone
		s.nLower--
		s.mu.Unlock()
	default:
		return fmt.Errorf("tier: spill free slot %d: %w", slot, ErrEmpty)
	}
	return nil
}

// Close implements Tier: after the calls in flight it closes the upper
// and the lower tier (a Spill owns both) and returns their errors joined.
// Calls of Close after the first return nil.
func (s *Spill) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	s.life.Lock()
	if s.closed {
		s.life.Unlock()
		return nil
	}
	s.closed = true
	s.life.Unlock()
	var errs []error
	if err := s.upper.Close(); err != nil {
		errs = append(errs, fmt.Errorf("upper: %w", err))
	}
	if err := s.lower.Close(); err != nil {
		errs = append(errs, fmt.Errorf("lower: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tier: spill close: %w", err)
	}
	return nil
}
