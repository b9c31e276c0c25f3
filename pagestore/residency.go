package pagestore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// ResidencyStats is a snapshot of an offloading store's device pool and
// of its traffic with the tier (see [Config.DeviceBudget]). The counters
// are cumulative since [New]. A store without offload reports zeros.
type ResidencyStats struct {
	// DeviceBudget is the number of device slots.
	DeviceBudget int
	// Resident is the number of pages whose K/V are in a device slot.
	Resident int
	// TierOnly is the number of pages whose K/V are only in the tier (the
	// host pages, with the default memory tier).
	TierOnly int
	// CleanResident is the number of resident pages whose tier copy is
	// current: evicting one writes nothing.
	CleanResident int
	// Pinned is the number of pages pinned by some sequence's window;
	// PinnedResident those of them that are resident.
	Pinned, PinnedResident int
	// Recalls counts step recalls ([Store.Recall]); Hits and Misses the
	// pages they wanted that were already resident or had to be brought
	// in.
	Recalls, Hits, Misses int64
	// BytesIn and BytesOut are the payload bytes read from the tier into
	// device slots and written from device slots to the tier (by steps and
	// appends alike).
	BytesIn, BytesOut int64
	// Evictions counts pages that left the device; WriteBacks those of
	// them that had to be written to the tier first (no current copy).
	Evictions, WriteBacks int64
	// Stall is the time spent inside step recalls: tier reads,
	// write-backs, bookkeeping and waits for prefetch reads in flight.
	Stall time.Duration

	// Prefetch (see [Store.ReservePrefetch]). PrefetchPending is the
	// number of reservations not yet published (queued or being read);
	// their slots count neither as resident nor as free.
	PrefetchPending int
	// PrefetchIssued counts pages reserved for a prefetch; PrefetchLoaded
	// those whose payload a prefetch read brought in (PrefetchBytes
	// bytes, not in BytesIn, which counts the reads of the operations
	// themselves); PrefetchFailed the prefetch reads that failed (a tier
	// error or cancellation: the page stays in the tier, and a step
	// that needs it reads it itself).
	PrefetchIssued, PrefetchLoaded, PrefetchFailed int64
	PrefetchBytes                                  int64
	// PrefetchHits counts pages a step recall wanted that were resident
	// only because a prefetch brought them in (counted in Hits too);
	// PrefetchWasted the prefetched pages (or reservations) that left
	// the device before any step used them: evicted, recycled, or given
	// back under pressure or at shutdown.
	PrefetchHits, PrefetchWasted int64
	// PrefetchTaken counts reservations that an operation needed before
	// their read had started: it read the page itself into the reserved
	// slot (a miss, not a prefetch hit).
	PrefetchTaken int64
	// ResidentSteps counts steps that found every page with data
	// resident and attended through the device's page -> slot table
	// ([Store.StepResident]) instead of recalling: their pages count
	// neither as hits nor as misses.
	ResidentSteps int64
	// PrefetchWaits counts the times an operation waited for a prefetch
	// read in flight (of a page it needed, or to free room), and
	// PrefetchWait the time it waited (part of Stall for step recalls).
	PrefetchWaits int64
	PrefetchWait  time.Duration
}

// HitRate returns Hits / (Hits + Misses), or 1 when no page was wanted.
func (r ResidencyStats) HitRate() float64 {
	if r.Hits+r.Misses == 0 {
		return 1
	}
	return float64(r.Hits) / float64(r.Hits+r.Misses)
}

// residency is the device pool of an offloading store: which physical
// page holds which device slot, what the tier holds, the pins and the
// evictor. Every field is guarded by mu; tier I/O runs with mu held, so
// residency changes (and the K/V writes of an offloading store's PageData)
// serialize, except a prefetch read (see prefetch.go), which runs
// without mu into a slot reserved for it. Lock order: a sequence, the
// sequence map, the pool, then mu.
type residency struct {
	mu       sync.Mutex
	budget   int
	layers   []LayerData // the pool arrays: K/V of budget slots
	blk      int         // elements of one slot's K (or V) in one layer
	heads    int         // KV heads: fp8 records (scales) per slot's K (or V) in one layer
	fp8      bool        // the host pool arrays hold fp8 records (packFP8's payloads; a device pool's are its own)
	tier     tier.Tier
	ownTier  bool
	ev       Evictor
	nativeLE bool

	// dev, when set, holds the pool on a device (NewWithSlots): K/V
	// payloads move between its slots and the tier by queued device
	// copies (saves, then loads, flushed at the end of each operation),
	// not through layers and buf.
	dev          SlotData
	dt           plan.DType // the payload's element type
	saves, loads []kernels.SlotMove
	fault        error // set when a flush failed: the store is unusable

	slot      []int32  // page -> device slot, -1 when not resident
	owner     []int32  // slot -> page, -1 when free
	free      []int32  // free slots, a stack
	clean     []bool   // page: tier slot p holds the page's current K/V
	pins      []int32  // page: pins by sequence windows
	pinnedRes int      // resident pages with pins > 0
	mark      []uint32 // page: == epoch while the operation in progress needs it
	epoch     uint32
	tick      uint64
	buf       []byte // one payload

	// Prefetch reservations (prefetch.go). A reserved page holds its slot
	// in owner but not in slot (it is not resident: nobody reads the slot
	// until the reservation is published).
	pend    []int32       // page -> slot reserved by a prefetch, -1 when none
	loading []bool        // page: its prefetch read is in flight (outside mu)
	gen     []uint32      // page: bumped when the page is recycled
	pf      []bool        // page: resident by a prefetch no operation has used yet
	used    []uint64      // page: the tick of the last step recall that wanted it
	adm     []uint64      // page: the tick it was last admitted (made resident)
	npend   int           // pages with pend >= 0
	age     uint64        // ReservePrefetch in progress: victims unused for more ticks
	ntier   int           // pages whose K/V only the tier holds (clean, not resident)
	nload   int           // pages loading
	loaded  chan struct{} // closed when a prefetch read ends; nil: nobody waits

	st ResidencyStats // the counters (Recalls ... PrefetchWait)

	// The device's page -> slot table (SlotTable; slottable.go), when
	// dev keeps one: the slot changes queued for it, and whether steps
	// stamped uses into it since the last syncUses.
	tab                SlotTable
	tabPages, tabSlots []int32
	devUses            bool
	touch              []pageUse
}

func newResidency(cfg Config, layers []LayerData, dev SlotData) (*residency, error) {
	r := &residency{
		budget:   cfg.DeviceBudget,
		layers:   layers,
		dev:      dev,
		dt:       cfg.DType,
		blk:      cfg.PageElems(),
		heads:    cfg.KVHeads,
		fp8:      cfg.DType == plan.FP8 && dev == nil,
		tier:     cfg.Tier,
		nativeLE: binary.NativeEndian.Uint16([]byte{1, 0}) == 1,
		slot:     make([]int32, cfg.Capacity),
		owner:    make([]int32, cfg.DeviceBudget),
		free:     make([]int32, cfg.DeviceBudget),
		clean:    make([]bool, cfg.Capacity),
		pins:     make([]int32, cfg.Capacity),
		mark:     make([]uint32, cfg.Capacity),
		buf:      make([]byte, cfg.PayloadBytes()),
		pend:     make([]int32, cfg.Capacity),
		loading:  make([]bool, cfg.Capacity),
		gen:      make([]uint32, cfg.Capacity),
		pf:       make([]bool, cfg.Capacity),
		used:     make([]uint64, cfg.Capacity),
		adm:      make([]uint64, cfg.Capacity),
	}
	r.tab, _ = dev.(SlotTable)
	ev, err := NewEvictor(cfg.Eviction, cfg.Capacity, cfg.scoreDecay())
	if err != nil {
		return nil, err
	}
	r.ev = ev
	for p := range r.slot {
		r.slot[p], r.pend[p] = -1, -1
	}
	for s := range r.owner {
		r.owner[s] = -1
		r.free[s] = int32(cfg.DeviceBudget - 1 - s) // slot 0 first
	}
	if r.tier == nil {
		m, err := tier.NewMemory(cfg.Capacity, cfg.PayloadBytes())
		if err != nil {
			return nil, fmt.Errorf("pagestore: host tier: %w", err)
		}
		r.tier, r.ownTier = m, true
	}
	return r, nil
}

// Evictable implements Eligible: unpinned pages that the operation in
// progress does not need.
func (r *residency) Evictable(p int32) bool { return r.pins[p] == 0 && r.mark[p] != r.epoch }

// begin starts an operation: no page is marked needed.
func (r *residency) begin() {
	r.epoch++
	if r.epoch == 0 { // wrapped: old marks could collide
		clear(r.mark)
		r.epoch = 1
	}
}

// room is the number of slots not held by pinned pages.
func (r *residency) room() int { return r.budget - r.pinnedRes }

// ensure makes pages resident (mu held), marking them needed so that none
// of them is evicted for another. It checks first that they fit: it fails
// with ErrDeviceFull, changing nothing, when the missing pages outnumber
// the free slots and the resident pages that may be evicted. It returns
// the number of pages that were missing. A tier failure leaves the pages
// brought in so far resident and the others where they were. step says
// that a step recall asks (prefetch hits are counted).
//
// Prefetch reservations: a needed page whose prefetch read is in flight
// is waited for (mu is released meanwhile, so the marks are set again
// afterwards; the wait ends early, failing, when ctx does); one whose
// read has not started is read here into its
// reserved slot (the prefetcher then skips it). When the pages do not
// fit, reservations of pages not needed are given back first, then reads
// in flight waited for (their pages become evictable), before
// ErrDeviceFull.
func (r *residency) ensure(ctx context.Context, pages []int32, step bool) (int, error) {
	if r.fault != nil {
		return 0, r.fault
	}
	missing, err := r.ensurePages(ctx, pages, step)
	// The bookkeeping of the queued copies is committed: issue them even
	// when ctx ended meanwhile.
	if ferr := r.flush(context.WithoutCancel(ctx)); ferr != nil && err == nil {
		err = ferr
	}
	return missing, err
}

// flush issues the device copies queued by evictions and loads (device
// pool only): every save, then every load, so a slot written back and
// reloaded in one operation is saved before it is overwritten. The
// residency maps already say where the pages are after the copies, so a
// failure is a device fault the maps cannot be trusted after: the store
// fails from then on (r.fault, wrapping ErrData), every later operation
// that needs the device pool returning it.
func (r *residency) flush(ctx context.Context) error {
	if err := r.flushTable(); err != nil {
		return err
	}
	if r.dev == nil || len(r.saves)+len(r.loads) == 0 {
		return nil
	}
	err := r.dev.MoveSlots(ctx, r.saves, r.loads)
	r.saves, r.loads = r.saves[:0], r.loads[:0]
	if err != nil {
		r.fault = fmt.Errorf("%w: device copies to and from the tier failed, the device pool's contents are unknown: %w", ErrData, err)
		return r.fault
	}
	return nil
}

func (r *residency) ensurePages(ctx context.Context, pages []int32, step bool) (int, error) {
	missing := 0
	for {
		r.begin()
		missing = 0
		queued := 0 // missing pages with a reserved slot
		held := 0   // resident unpinned pages of pages: not evictable now
		wait := false
		for _, p := range pages {
			if r.mark[p] == r.epoch {
				continue // listed twice
			}
			r.mark[p] = r.epoch
			switch {
			case r.loading[p]:
				wait = true
			case r.slot[p] < 0:
				missing++
				if r.pend[p] >= 0 {
					queued++
				}
			case r.pins[p] == 0:
				held++
			}
		}
		if wait {
			if err := r.waitLoads(ctx); err != nil {
				return 0, err
			}
			continue
		}
		if fresh := missing - queued; fresh > len(r.free) {
			// The resident pages that are neither pinned nor needed
			// (Evictable), counted in O(1): resident ones are the slots
			// neither free nor reserved for a prefetch.
			evictable := r.budget - len(r.free) - r.npend - r.pinnedRes - held
			if fresh > len(r.free)+evictable {
				if r.cancelQueued() > 0 {
					continue
				}
				if r.nload > 0 {
					if err := r.waitLoads(ctx); err != nil {
						return 0, err
					}
					continue
				}
				return 0, fmt.Errorf("%d pages to bring in, %d device slots free and %d evictable (budget %d, %d held by pinned pages): %w",
					missing, len(r.free), evictable, r.budget, r.pinnedRes, ErrDeviceFull)
			}
		}
		break
	}
	if r.dev != nil {
		// Past here the maps change ahead of the device copies, which
		// run whatever happens to ctx: give up now or never.
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
	for _, p := range pages {
		if r.slot[p] >= 0 {
			if r.pf[p] {
				r.pf[p] = false
				if step {
					r.st.PrefetchHits++
				}
			}
			continue
		}
		var err error
		if s := r.pend[p]; s >= 0 {
			// Reserved, its read not started: read it here, once.
			r.unpend(p)
			r.st.PrefetchTaken++
			err = r.loadInto(ctx, p, s)
		} else {
			err = r.load(ctx, p)
		}
		if err != nil {
			return missing, err
		}
	}
	return missing, nil
}

// load gives non-resident page p a slot and reads its payload from the
// tier when the tier holds it (a page never written has none).
func (r *residency) load(ctx context.Context, p int32) error {
	s, err := r.takeSlot(ctx)
	if err != nil {
		return fmt.Errorf("bring in page %d: %w", p, err)
	}
	return r.loadInto(ctx, p, s)
}

// loadInto reads page p into slot s, which the caller took (a failed
// read gives s back), and makes p resident.
func (r *residency) loadInto(ctx context.Context, p, s int32) error {
	if r.clean[p] && r.dev != nil {
		r.loads = append(r.loads, kernels.SlotMove{Page: p, Slot: s})
		r.st.BytesIn += int64(len(r.buf))
		r.ntier--
	} else if r.clean[p] {
		if err := r.tier.Read(ctx, int(p), r.buf); err != nil {
			r.owner[s] = -1
			r.free = append(r.free, s)
			return fmt.Errorf("bring in page %d: %w", p, err)
		}
		r.unpack(s)
		r.st.BytesIn += int64(len(r.buf))
		r.ntier--
	}
	r.setSlot(p, s)
	r.owner[s] = p
	if r.pins[p] > 0 {
		r.pinnedRes++
	}
	r.adm[p] = r.tick
	r.ev.Admit(p, r.tick)
	return nil
}

// takeSlot pops a free slot, evicting a page when none is free.
func (r *residency) takeSlot(ctx context.Context) (int32, error) {
	if len(r.free) == 0 {
		if err := r.syncUses(ctx); err != nil {
			return 0, err
		}
		v := r.ev.Victim(r)
		if v < 0 {
			return 0, fmt.Errorf("no device slot free or evictable (budget %d, %d held by pinned pages): %w", r.budget, r.pinnedRes, ErrDeviceFull)
		}
		if err := r.evict(ctx, v); err != nil {
			return 0, err
		}
	}
	s := r.free[len(r.free)-1]
	r.free = r.free[:len(r.free)-1]
	return s, nil
}

// evict moves resident page v out of the device, writing its payload to
// the tier first unless the tier's copy is current. A failed write leaves
// v resident.
func (r *residency) evict(ctx context.Context, v int32) error {
	s := r.slot[v]
	if !r.clean[v] && r.dev != nil {
		r.saves = append(r.saves, kernels.SlotMove{Page: v, Slot: s})
		r.clean[v] = true
		r.st.BytesOut += int64(len(r.buf))
		r.st.WriteBacks++
	} else if !r.clean[v] {
		r.pack(s)
		if err := r.tier.Write(ctx, int(v), r.buf); err != nil {
			return fmt.Errorf("evict page %d: %w", v, err)
		}
		r.clean[v] = true
		r.st.BytesOut += int64(len(r.buf))
		r.st.WriteBacks++
	}
	r.setSlot(v, -1)
	r.owner[s] = -1
	r.free = append(r.free, s)
	r.ev.Remove(v, false)
	r.st.Evictions++
	r.ntier++
	if r.pf[v] {
		r.pf[v] = false
		r.st.PrefetchWasted++
	}
	return nil
}

// drop forgets a page that returned to the free list: its slot is freed
// and its tier copy no longer counts (the tier slot is overwritten when
// the recycled page is next evicted; it is never read before).
//
// A prefetch reservation of p is given back; one whose read is in flight
// keeps its slot until the read ends, and the reader then discards the
// payload (the page's generation changed).
func (r *residency) drop(p int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.slot[p] < 0 && r.clean[p] {
		r.ntier--
	}
	if s := r.slot[p]; s >= 0 {
		r.setSlot(p, -1)
		r.owner[s] = -1
		r.free = append(r.free, s)
		if r.pins[p] > 0 {
			r.pinnedRes--
		}
	}
	if r.pend[p] >= 0 && !r.loading[p] {
		r.giveBack(p)
	}
	if r.pf[p] {
		r.pf[p] = false
		r.st.PrefetchWasted++
	}
	r.gen[p]++
	r.clean[p] = false
	r.ev.Remove(p, true)
}

func (r *residency) pin(p int32) {
	if r.pins[p] == 0 && r.slot[p] >= 0 {
		r.pinnedRes++
	}
	r.pins[p]++
}

func (r *residency) unpin(p int32) {
	r.pins[p]--
	if r.pins[p] == 0 && r.slot[p] >= 0 {
		r.pinnedRes--
	}
}

// f32bytes views f as its bytes (little-endian hosts only).
func f32bytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// pack copies slot s's K/V of every layer into r.buf in the tier layout:
// layer-major, K then V, each the slot's [KVHeads][PageSize][HeadDim]
// block, little-endian float32; fp8 records go as stored, codes and
// scales (packFP8's layout, that of persistence).
func (r *residency) pack(s int32) {
	if r.fp8 {
		packFP8(r.layers, r.blk, r.heads, s, r.buf)
		return
	}
	o, n := int(s)*r.blk, r.blk
	b := r.buf
	for _, ld := range r.layers {
		for _, a := range [2][]float32{ld.K[o : o+n], ld.V[o : o+n]} {
			if r.nativeLE {
				copy(b, f32bytes(a))
			} else {
				for i, x := range a {
					binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
				}
			}
			b = b[4*n:]
		}
	}
}

// unpack copies r.buf into slot s (the inverse of pack).
func (r *residency) unpack(s int32) { r.unpackFrom(s, r.buf) }

// unpackFrom copies payload b into slot s.
func (r *residency) unpackFrom(s int32, b []byte) {
	if r.fp8 {
		unpackFP8(r.layers, r.blk, r.heads, s, b)
		return
	}
	o, n := int(s)*r.blk, r.blk
	for _, ld := range r.layers {
		for _, a := range [2][]float32{ld.K[o : o+n], ld.V[o : o+n]} {
			r.unpackInto(a, b[:4*n])
			b = b[4*n:]
		}
	}
}

func (r *residency) unpackInto(a []float32, b []byte) {
	if r.nativeLE {
		copy(f32bytes(a), b)
		return
	}
	for i := range a {
		a[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// readKV copies page p's K and V of one layer into k and v (blk floats
// each) from wherever they live: its slot, the tier, or nowhere (a page
// never written reads zeros).
func (r *residency) readKV(ctx context.Context, layer int, p int32, k, v []float32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fault != nil {
		return r.fault
	}
	if s := r.slot[p]; s >= 0 {
		if r.dev != nil {
			return r.dev.ReadSlotKV(ctx, layer, s, k, v)
		}
		ld := r.layers[layer]
		o := int(s) * r.blk
		if r.fp8 {
			decodeFP8Records(ld, r.blk, r.heads, s, k, v)
			return nil
		}
		copy(k, ld.K[o:o+r.blk])
		copy(v, ld.V[o:o+r.blk])
		return nil
	}
	if !r.clean[p] {
		clear(k)
		clear(v)
		return nil
	}
	// The tier's payload (whose reads, for a device pool's tier, wait for
	// the device's queued copies) in the pool's element type.
	if err := r.tier.Read(ctx, int(p), r.buf); err != nil {
		return fmt.Errorf("read page %d: %w", p, err)
	}
	if r.dt == plan.FP8 { // the host pools' packFP8 or a device pool's records: one layout
		decodeFP8Payload(layer, r.blk, r.heads, r.buf, k, v)
		return nil
	}
	n := r.dt.Bytes() * r.blk
	off := layer * 2 * n
	if r.dt == plan.Float32 {
		r.unpackInto(k, r.buf[off:off+n])
		r.unpackInto(v, r.buf[off+n:off+2*n])
		return nil
	}
	decodeElems(k, r.buf[off:off+n], r.dt)
	decodeElems(v, r.buf[off+n:off+2*n], r.dt)
	return nil
}

func (r *residency) stats() ResidencyStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	st.DeviceBudget = r.budget
	st.Resident = r.budget - len(r.free) - r.npend
	st.PinnedResident = r.pinnedRes
	st.PrefetchPending = r.npend
	for p, s := range r.slot {
		switch {
		case s >= 0 && r.clean[p]:
			st.CleanResident++
		case s < 0 && r.clean[p]:
			st.TierOnly++
		}
		if r.pins[p] > 0 {
			st.Pinned++
		}
	}
	return st
}

// check verifies the maps against each other and against the pool's
// refcounts (ref, read by the caller under the pool lock).
func (r *residency) check(ref []int32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	used := 0
	pinnedRes := 0
	pend, load := 0, 0
	for p, s := range r.slot {
		if ps := r.pend[p]; ps >= 0 {
			pend++
			if r.loading[p] {
				load++
			}
			if s >= 0 || int(ps) >= r.budget || r.owner[ps] != int32(p) {
				return fmt.Errorf("page %d reserved slot %d (owner %d) for a prefetch, and holds slot %d", p, ps, r.owner[min(int(ps), r.budget-1)], s)
			}
			if !r.loading[p] && (ref[p] == 0 || !r.clean[p]) {
				return fmt.Errorf("page %d: a queued prefetch of a page with ref %d, clean %v", p, ref[p], r.clean[p])
			}
		} else if r.loading[p] {
			return fmt.Errorf("page %d loading without a reserved slot", p)
		}
		if r.pf[p] && s < 0 {
			return fmt.Errorf("page %d marked prefetched but not resident", p)
		}
		if s >= 0 {
			used++
			if int(s) >= r.budget || r.owner[s] != int32(p) {
				return fmt.Errorf("page %d holds slot %d, whose owner is %d", p, s, r.owner[min(int(s), r.budget-1)])
			}
			if ref[p] == 0 {
				return fmt.Errorf("free page %d holds slot %d", p, s)
			}
			if r.pins[p] > 0 {
				pinnedRes++
			}
		}
		if ref[p] == 0 && (r.clean[p] || r.pins[p] != 0) {
			return fmt.Errorf("free page %d: clean %v pins %d", p, r.clean[p], r.pins[p])
		}
		if r.pins[p] < 0 {
			return fmt.Errorf("page %d has %d pins", p, r.pins[p])
		}
	}
	for s, p := range r.owner {
		if p >= 0 && r.slot[p] != int32(s) && r.pend[p] != int32(s) {
			return fmt.Errorf("slot %d owned by page %d, which holds slot %d", s, p, r.slot[p])
		}
	}
	if used+pend+len(r.free) != r.budget {
		return fmt.Errorf("%d slots used, %d reserved and %d free, budget %d", used, pend, len(r.free), r.budget)
	}
	if pend != r.npend || load != r.nload {
		return fmt.Errorf("%d reservations (%d loading), counters say %d (%d)", pend, load, r.npend, r.nload)
	}
	tierOnly := 0
	for p, s := range r.slot {
		if s < 0 && r.clean[p] {
			tierOnly++
		}
	}
	if tierOnly != r.ntier {
		return fmt.Errorf("%d pages only in the tier, counter says %d", tierOnly, r.ntier)
	}
	if pinnedRes != r.pinnedRes {
		return fmt.Errorf("%d pinned resident pages, counter says %d", pinnedRes, r.pinnedRes)
	}
	return nil
}

// ensureOne makes page p resident (ensure, taking mu).
func (r *residency) ensureOne(p int32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	one := [1]int32{p}
	_, err := r.ensure(context.Background(), one[:], false)
	return err
}

// checkRoom reports, changing nothing, ErrDeviceFull when a write to the
// existing pages touched and to fresh new pages would need a device slot
// and every slot is held by a pinned page.
func (r *residency) checkRoom(touched []int32, fresh int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	need := fresh > 0
	for _, p := range touched {
		need = need || r.slot[p] < 0
	}
	if need && r.room() < 1 {
		return fmt.Errorf("every one of the %d device slots is held by a pinned page: %w", r.budget, ErrDeviceFull)
	}
	return nil
}
