package pagestore

import (
	"context"
	"fmt"
	"time"

	"github.com/questrt/questrt/kernels"
)

// Fetch is a prefetch reservation: the payload of physical page Page is
// to be read from the tier into device slot Slot (see
// [Store.ReservePrefetch] and [Store.LoadPrefetch]). A Fetch is a value;
// copies name the same reservation.
type Fetch struct {
	Page, Slot int32
	gen        uint32 // the page's generation when reserved
}

// ReservePrefetch reserves device slots for pages that a coming step is
// expected to attend, appends a [Fetch] per reservation to dst and
// returns it; [Store.LoadPrefetch] then reads them, typically on another
// goroutine. It reserves nothing for a page that is resident, already
// reserved, pinned, or has no payload in the tier (never written, or
// recycled). A slot is a free slot, or else the slot of a resident page
// that is clean (evicting it writes nothing), unpinned, neither in keep
// (the pages of the step in progress, which it may still be reading) nor
// in pages, and cold: wanted by none of the last age step recalls (age
// 0: no such condition; a shard passes its layer count + 1, the recalls
// of this step and of every layer's step for the previous token, so that
// a speculative page never displaces one the model has just used),
// chosen by the eviction policy among those; it stops at the first page
// for which there is none. So a prefetch never evicts a pinned page, a
// kept, predicted or recently used page, or a page whose only current
// copy is on the device, and never writes to the tier. Pages are
// reserved in their order (put the likeliest first); pages out of range
// are skipped. Without offload it returns dst unchanged.
//
// A reserved page is not resident: its slot is taken but nobody reads it
// until the read is published. An operation that needs the page first
// waits for a read in flight, or reads the page itself into the reserved
// slot if the read has not started; one that lacks room gives back
// reservations whose read has not started. Either way the page is read
// into one slot, at most once by the prefetch.
func (s *Store) ReservePrefetch(pages, keep []int32, age int, dst []Fetch) []Fetch {
	r := s.res
	if r == nil || len(pages) == 0 {
		return dst
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.age = uint64(max(age, 0))
	// Neither keep nor pages themselves may be victims: a prefetch never
	// evicts a page it predicts.
	r.begin()
	for _, set := range [2][]int32{keep, pages} {
		for _, p := range set {
			if p >= 0 && int(p) < len(r.mark) {
				r.mark[p] = r.epoch
			}
		}
	}
	for _, p := range pages {
		if p < 0 || int(p) >= len(r.slot) || r.slot[p] >= 0 || r.pend[p] >= 0 || r.pins[p] > 0 || !r.clean[p] {
			continue
		}
		sl, ok := r.prefetchSlot()
		if !ok {
			break
		}
		r.pend[p], r.owner[sl] = sl, p
		r.npend++
		r.st.PrefetchIssued++
		dst = append(dst, Fetch{Page: p, Slot: sl, gen: r.gen[p]})
	}
	return dst
}

// prefetchEligible accepts the victims of a prefetch: clean unpinned
// resident pages that the operation in progress does not need and no
// step recall wanted in the last r.age ticks (any, with age 0).
type prefetchEligible struct{ r *residency }

func (e prefetchEligible) Evictable(p int32) bool {
	r := e.r
	return r.Evictable(p) && r.clean[p] && (r.age == 0 || r.used[p]+r.age <= r.tick)
}

// prefetchSlot takes a free slot, or evicts a clean page for one (mu
// held).
func (r *residency) prefetchSlot() (int32, bool) {
	if len(r.free) == 0 {
		if r.syncUses(context.Background()) != nil {
			return 0, false
		}
		v := r.ev.Victim(prefetchEligible{r})
		if v < 0 {
			return 0, false
		}
		// Clean: evict writes nothing and cannot fail.
		if err := r.evict(context.Background(), v); err != nil {
			return 0, false
		}
	}
	sl := r.free[len(r.free)-1]
	r.free = r.free[:len(r.free)-1]
	return sl, true
}

// LoadPrefetch performs reservation f: it reads the page's payload from
// the tier into the reserved slot without holding the residency lock
// (and without any other lock of the store), then, under the lock,
// publishes it: the page is resident, clean, and counts as a prefetch
// hit when a step recall wants it before it leaves. It does nothing and
// returns nil when the reservation is gone (an operation took it over,
// it was given back, or the page was recycled). A failed read frees the
// slot and returns the tier's error, wrapped; the page stays in the
// tier, and a step that needs it reads it itself (and fails if the tier
// fails it again). buf is the caller's scratch of
// [Config.PayloadBytes] bytes; it must not be shared with another
// LoadPrefetch running at the same time.
func (s *Store) LoadPrefetch(ctx context.Context, f Fetch, buf []byte) error {
	r := s.res
	if r == nil {
		return nil
	}
	if len(buf) != len(r.buf) {
		return fmt.Errorf("prefetch page %d: %w: buffer of %d bytes, payload %d", f.Page, ErrBadShape, len(buf), len(r.buf))
	}
	p, sl := f.Page, f.Slot
	if p < 0 || int(p) >= len(r.slot) {
		return fmt.Errorf("prefetch: %w: page %d outside the pool of %d", ErrOutOfRange, p, len(r.slot))
	}
	r.mu.Lock()
	if r.pend[p] != sl || r.loading[p] || r.gen[p] != f.gen || r.fault != nil {
		r.mu.Unlock()
		return nil
	}
	r.loading[p] = true
	r.nload++
	r.mu.Unlock()

	// The slot is reserved: nobody else reads or writes it until it is
	// published below.
	var err error
	if r.dev == nil {
		err = r.tier.Read(ctx, int(p), buf)
		if err == nil {
			r.unpackFrom(sl, buf)
		}
	} else {
		// A device pool: one queued copy from the tier into the
		// reserved slot, ordered before every later kernel that reads
		// it. A copy of a page recycled meanwhile lands in a slot that
		// is given back below and overwritten by its next user.
		one := [1]kernels.SlotMove{{Page: p, Slot: sl}}
		if merr := r.dev.MoveSlots(ctx, nil, one[:]); merr != nil {
			err = fmt.Errorf("device copy from the tier: %w", merr)
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.wakeLoads()
	r.loading[p] = false
	r.nload--
	r.unpend(p)
	if err != nil || r.gen[p] != f.gen {
		r.owner[sl] = -1
		r.free = append(r.free, sl)
		if err != nil {
			r.st.PrefetchFailed++
			return fmt.Errorf("prefetch page %d: %w", p, err)
		}
		r.st.PrefetchWasted++ // recycled while being read
		return nil
	}
	r.setSlot(p, sl)
	r.ntier--
	if r.pins[p] > 0 {
		r.pinnedRes++
	}
	r.pf[p] = true
	r.adm[p] = r.tick
	r.ev.Admit(p, r.tick)
	r.st.PrefetchLoaded++
	r.st.PrefetchBytes += int64(len(buf))
	return nil
}

// Offloaded returns the number of pages whose K/V only the tier holds
// (what a prefetch could bring in; 0 without offload). It is O(1).
func (s *Store) Offloaded() int {
	r := s.res
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ntier
}

// CancelPrefetch gives back the reservations of fs whose read has not
// started (a prefetcher shutting down with work queued); the others are
// left alone. Without offload it does nothing.
func (s *Store) CancelPrefetch(fs []Fetch) {
	r := s.res
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range fs {
		p := f.Page
		if p >= 0 && int(p) < len(r.pend) && r.pend[p] == f.Slot && !r.loading[p] && r.gen[p] == f.gen {
			r.giveBack(p)
		}
	}
	r.wakeLoads()
}

// unpend forgets page p's reservation (mu held); its slot stays with
// the caller.
func (r *residency) unpend(p int32) {
	r.pend[p] = -1
	r.npend--
}

// giveBack frees the slot of reservation p, whose read has not started
// (mu held).
func (r *residency) giveBack(p int32) {
	sl := r.pend[p]
	r.unpend(p)
	r.owner[sl] = -1
	r.free = append(r.free, sl)
	r.st.PrefetchWasted++
}

// cancelQueued gives back every reservation whose read has not started
// and whose page the operation in progress does not need (mu held), and
// returns how many.
func (r *residency) cancelQueued() int {
	if r.npend == r.nload {
		return 0
	}
	n := 0
	for _, p := range r.owner {
		if p >= 0 && r.slot[p] < 0 && !r.loading[p] && r.mark[p] != r.epoch {
			r.giveBack(p)
			n++
		}
	}
	return n
}

// waitLoads waits (mu held, released meanwhile) until a prefetch read in
// flight ends, or ctx does (its error, wrapped).
func (r *residency) waitLoads(ctx context.Context) error {
	t0 := time.Now()
	r.st.PrefetchWaits++
	if r.loaded == nil {
		r.loaded = make(chan struct{})
	}
	ch := r.loaded
	r.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = fmt.Errorf("waiting for a prefetch read: %w", ctx.Err())
	}
	r.mu.Lock()
	r.st.PrefetchWait += time.Since(t0)
	return err
}

// wakeLoads wakes the operations waiting in waitLoads (mu held).
func (r *residency) wakeLoads() {
	if r.loaded != nil {
		close(r.loaded)
		r.loaded = nil
	}
}
