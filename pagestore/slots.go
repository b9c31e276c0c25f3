package pagestore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// SlotData holds the pages of an offloading store whose device pool is a
// device's memory ([NewWithSlots]): the summaries of every physical page
// and the K/V of [Config.DeviceBudget] device slots, in every layer, and
// the moves of page payloads between those slots and the store's tier
// ([Config.Tier], which the device reads and writes directly). The store
// decides which page holds which slot; SlotData only stores. Calls may
// run concurrently, but never two on the same page or slot at once: the
// residency lock serializes those that move or write K/V, except a
// prefetch's MoveSlots, which runs outside it into a slot reserved for
// it, and ResetSummaries, Table and Drop run under the sequence's lock
// only (their pages belong to that sequence). Inputs are checked. Calls
// may be queued (a device stream): their order is the order of the
// calls. A failed MoveSlots of an operation's copies makes the store
// fail from then on (the residency maps already moved; errors wrap
// ErrData).
type SlotData interface {
	// WriteSlots is [PageData.Write] with K/V addressed by slot: page
	// pages[i] has its K/V in slot slots[i].
	WriteSlots(layer int, pages, slots []int32, slot int, k, v []float32) error
	// ResetSummaries is [PageData.Reset].
	ResetSummaries(pages []int32) error
	// CopySlot copies, in every layer l, the first valid[l] slots of K and
	// V of device slot srcSlot to dstSlot, and the summaries of page src
	// to page dst.
	CopySlot(dst, src, dstSlot, srcSlot int32, valid []int) error
	// RescanSlot recomputes the summaries of page p in every layer from
	// the first valid keys stored in its slot.
	RescanSlot(p, slot int32, valid int) error
	// Table and Drop are [PageData.Table] and [PageData.Drop].
	Table(id SeqID, at int, pages []int32, n int) error
	Drop(id SeqID) error
	// MoveSlots copies, for every save, the K/V of slot Slot (all layers)
	// to the tier's page Page, then, for every load, the tier's page
	// Page to slot Slot, in the tier's payload layout.
	MoveSlots(ctx context.Context, saves, loads []kernels.SlotMove) error
	// ReadSlotKV copies the K and V of one layer of slot into k and v
	// (PageElems floats each). For diagnostics and tests.
	ReadSlotKV(ctx context.Context, layer int, slot int32, k, v []float32) error
}

// NewWithSlots makes an offloading store whose device pool lives in a
// device's memory: data holds the summaries of cfg.Capacity pages and the
// K/V of cfg.DeviceBudget slots, and cfg.Tier (required) holds the pages
// out of the device, in memory data's device moves payloads to and from
// directly, in the tier layout of cfg.DType (fp8 records: their codes and
// scales as stored, packFP8's layout, which [Store.ReadKV] decodes).
// Everything else is as with [New] and offload: recall on selection,
// eviction, pins, prefetch reservations, the same counters.
// [Store.Layer], [Store.PageKV] and [Store.PageSummary] are unavailable;
// [Store.ReadKV] works. Persistence ([Config.DataDir]) is not available
// with outside data.
func NewWithSlots(cfg Config, data SlotData) (*Store, error) {
	sz, err := cfg.sizes()
	if err != nil {
		return nil, err
	}
	switch {
	case !cfg.Offload():
		return nil, fmt.Errorf("%w: NewWithSlots needs a device budget (Config.DeviceBudget > 0)", ErrInvalidConfig)
	case cfg.Tier == nil:
		return nil, fmt.Errorf("%w: NewWithSlots needs a tier the device maps (Config.Tier)", ErrInvalidConfig)
	case data == nil:
		return nil, fmt.Errorf("%w: nil slot data", ErrInvalidConfig)
	case cfg.DataDir != "":
		return nil, fmt.Errorf("%w: DataDir %q: persistence needs the store's own pools (New), not outside page data", ErrInvalidConfig, cfg.DataDir)
	}
	r, err := newResidency(cfg, nil, data)
	if err != nil {
		return nil, err
	}
	s := newStore(cfg, sz, &slotPages{res: r, d: data, pageSize: cfg.PageSize, tok: cfg.KVHeads * cfg.HeadDim})
	s.res = r
	return s, nil
}

// slotPages is the PageData of a [NewWithSlots] store: it brings the
// pages a change touches into the device pool first (as hostData does
// with offload) and hands SlotData their slots.
type slotPages struct {
	res           *residency
	d             SlotData
	pageSize, tok int // S, and the floats of one token's k (KVHeads*HeadDim)
	one, sl       [1]int32
}

func (p *slotPages) Write(layer int, pages []int32, slot int, k, v []float32) error {
	r := p.res
	r.mu.Lock()
	defer r.mu.Unlock()
	S, per := p.pageSize, p.tok
	n := len(k) / per
	for t, i := 0, 0; t < n; i++ {
		cnt := min(S-slot, n-t)
		// One page at a time: a write may span more pages than the
		// device holds; the pages written before this one may be
		// evicted (saved after their writes: the device keeps order).
		if _, err := r.ensure(context.Background(), pages[i:i+1], false); err != nil {
			return err
		}
		r.clean[pages[i]] = false
		p.one[0], p.sl[0] = pages[i], r.slot[pages[i]]
		if err := p.d.WriteSlots(layer, p.one[:], p.sl[:], slot, k[t*per:(t+cnt)*per], v[t*per:(t+cnt)*per]); err != nil {
			return err
		}
		t += cnt
		slot = 0
	}
	return nil
}

func (p *slotPages) Reset(pages []int32) error { return p.d.ResetSummaries(pages) }

func (p *slotPages) Copy(dst, src int32, valid []int) error {
	r := p.res
	r.mu.Lock()
	defer r.mu.Unlock()
	two := [2]int32{dst, src}
	if _, err := r.ensure(context.Background(), two[:], false); err != nil {
		return err
	}
	r.clean[dst] = false
	return p.d.CopySlot(dst, src, r.slot[dst], r.slot[src], valid)
}

func (p *slotPages) Rescan(pg int32, valid int) error {
	r := p.res
	r.mu.Lock()
	defer r.mu.Unlock()
	p.one[0] = pg
	if _, err := r.ensure(context.Background(), p.one[:], false); err != nil {
		return err
	}
	return p.d.RescanSlot(pg, r.slot[pg], valid)
}

func (p *slotPages) Table(id SeqID, at int, pages []int32, n int) error {
	return p.d.Table(id, at, pages, n)
}

func (p *slotPages) Drop(id SeqID) error { return p.d.Drop(id) }

// decodeElems converts little-endian 16-bit elements of type dt in b to
// float32 (the payload of a device pool's tier; float32 payloads go
// through residency.unpackInto).
func decodeElems(dst []float32, b []byte, dt plan.DType) {
	switch dt {
	case plan.BFloat16:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
	case plan.Float16:
		for i := range dst {
			dst[i] = kernels.HalfToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
}
