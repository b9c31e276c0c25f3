package backendtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// errSlotPool is returned by the page-addressed K/V operations of
// kernels.DeviceStore on a slot pool, whose K/V are addressed by slot.
var errSlotPool = errors.New("fake device: a slot pool's K/V are addressed by slot (use the kernels.SlotStore methods)")

// PoolDType implements kernels.SlotStore: the pools' type, f.DType.
func (f FakeDevice) PoolDType() plan.DType { return f.DType }

// NewSlotPool implements kernels.SlotStore: summaries of pages pages, K/V
// of slots slots.
func (f FakeDevice) NewSlotPool(_ context.Context, pages, slots, kvh, d, s int) (any, error) {
	if pages < 1 || slots < 1 || slots > pages {
		return nil, fmt.Errorf("fake device: slot pool of %d slots for %d pages", slots, pages)
	}
	return f.newPool(pages, slots, kvh, d, s, slots)
}

func slotPool(pool any) (*FakePool, error) {
	p, err := fakePool(pool)
	if err != nil {
		return nil, err
	}
	if p.slots == 0 {
		return nil, errors.New("fake device: not a slot pool")
	}
	return p, nil
}

func (p *FakePool) slot(sl int32) error {
	if sl < 0 || int(sl) >= p.slots {
		return fmt.Errorf("fake device: slot %d outside the %d slots", sl, p.slots)
	}
	return nil
}

// WriteSlotTokens implements kernels.SlotStore.
func (FakeDevice) WriteSlotTokens(_ context.Context, pool any, pages, slots []int32, slot int, k, v []float32) error {
	p, err := slotPool(pool)
	if err != nil {
		return err
	}
	return p.write(pages, slots, p.slot, slot, k, v)
}

// RescanSlot implements kernels.SlotStore.
func (FakeDevice) RescanSlot(_ context.Context, pool any, page, slot int32, valid int) error {
	p, err := slotPool(pool)
	if err != nil {
		return err
	}
	if err := errors.Join(p.page(page), p.slot(slot)); err != nil {
		return err
	}
	if valid < 0 || valid > p.s {
		return fmt.Errorf("fake device: rescan of %d valid slots outside 0..%d", valid, p.s)
	}
	p.rescan(page, slot, valid)
	return nil
}

// CopySlot implements kernels.SlotStore.
func (FakeDevice) CopySlot(_ context.Context, pool any, dst, src, dstSlot, srcSlot int32) error {
	p, err := slotPool(pool)
	if err != nil {
		return err
	}
	if err := errors.Join(p.page(dst), p.page(src), p.slot(dstSlot), p.slot(srcSlot)); err != nil {
		return err
	}
	p.copyKV(dstSlot, srcSlot)
	sum := p.kvh * 2 * p.d
	copy(p.Summary[int(dst)*sum:][:sum], p.Summary[int(src)*sum:])
	return nil
}

// ReadSlotKV implements kernels.SlotStore.
func (FakeDevice) ReadSlotKV(_ context.Context, pool any, slot int32) ([]float32, []float32, error) {
	p, err := slotPool(pool)
	if err != nil {
		return nil, nil, err
	}
	if err := p.slot(slot); err != nil {
		return nil, nil, err
	}
	k, v := p.readKV(slot)
	return k, v, nil
}

// FakeHostTier is the pretend host tier of a FakeDevice: payloads in a
// byte array in the tier layout of the pools' type (FakePool.move),
// written by MoveSlots as the device would and by Write as the host
// would.
type FakeHostTier struct {
	mu      sync.Mutex
	payload int
	data    []byte
	full    []bool
	closed  bool
}

// NewHostTier implements kernels.SlotStore.
func (FakeDevice) NewHostTier(_ context.Context, pages, payload int) (kernels.HostTier, error) {
	if pages < 1 || payload < 1 {
		return nil, fmt.Errorf("fake device: host tier of %d pages of %d bytes", pages, payload)
	}
	return &FakeHostTier{payload: payload, data: make([]byte, pages*payload), full: make([]bool, pages)}, nil
}

// Slots implements kernels.HostTier.
func (t *FakeHostTier) Slots() int { return len(t.full) }

// PayloadBytes implements kernels.HostTier.
func (t *FakeHostTier) PayloadBytes() int { return t.payload }

func (t *FakeHostTier) check(ctx context.Context, slot, n int) error {
	switch {
	case t.closed:
		return tier.ErrClosed
	case ctx.Err() != nil:
		return ctx.Err()
	case slot < 0 || slot >= len(t.full):
		return fmt.Errorf("fake host tier: slot %d outside %d: %w", slot, len(t.full), tier.ErrSlot)
	case n >= 0 && n != t.payload:
		return fmt.Errorf("fake host tier: %d bytes, payload %d: %w", n, t.payload, tier.ErrSize)
	}
	return nil
}

// Write implements kernels.HostTier.
func (t *FakeHostTier) Write(ctx context.Context, slot int, b []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ctx, slot, len(b)); err != nil {
		return err
	}
	copy(t.data[slot*t.payload:][:t.payload], b)
	t.full[slot] = true
	return nil
}

// Read implements kernels.HostTier.
func (t *FakeHostTier) Read(ctx context.Context, slot int, dst []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ctx, slot, len(dst)); err != nil {
		return err
	}
	if !t.full[slot] {
		return fmt.Errorf("fake host tier: slot %d: %w", slot, tier.ErrEmpty)
	}
	copy(dst, t.data[slot*t.payload:][:t.payload])
	return nil
}

// Free implements kernels.HostTier.
func (t *FakeHostTier) Free(ctx context.Context, slot int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ctx, slot, -1); err != nil {
		return err
	}
	if !t.full[slot] {
		return fmt.Errorf("fake host tier: slot %d: %w", slot, tier.ErrEmpty)
	}
	t.full[slot] = false
	return nil
}

// Close implements kernels.HostTier.
func (t *FakeHostTier) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	return nil
}

// MoveSlots implements kernels.SlotStore: every save, then every load, of
// every pool's slot, in the tier layout (layer-major, each layer as
// FakePool.move writes it).
func (FakeDevice) MoveSlots(ctx context.Context, pools []any, ht kernels.HostTier, saves, loads []kernels.SlotMove) error {
	t, ok := ht.(*FakeHostTier)
	if !ok {
		return fmt.Errorf("fake device: host tier %T is not a *FakeHostTier", ht)
	}
	ps := make([]*FakePool, len(pools))
	size := 0
	for i, pool := range pools {
		p, err := slotPool(pool)
		if err != nil {
			return err
		}
		ps[i] = p
		size += p.payloadBytes()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if size != t.payload {
		return fmt.Errorf("fake device: %d pools of %d payload bytes do not make a %d-byte payload", len(ps), size, t.payload)
	}
	// Everything is checked before anything moves: a load of a page
	// nobody saved (nor wrote) fails with tier.ErrEmpty.
	saved := map[int32]bool{}
	for pass, moves := range [2][]kernels.SlotMove{saves, loads} {
		for _, m := range moves {
			if err := t.check(ctx, int(m.Page), -1); err != nil {
				return err
			}
			if err := ps[0].slot(m.Slot); err != nil {
				return err
			}
			if pass == 0 {
				saved[m.Page] = true
			} else if !t.full[m.Page] && !saved[m.Page] {
				return fmt.Errorf("fake device: load of tier page %d, which holds no payload: %w", m.Page, tier.ErrEmpty)
			}
		}
	}
	for pass, moves := range [2][]kernels.SlotMove{saves, loads} {
		for _, m := range moves {
			b := t.data[int(m.Page)*t.payload:][:t.payload]
			for _, p := range ps {
				b = p.move(m.Slot, b, pass == 0)
			}
			if pass == 0 {
				t.full[m.Page] = true
			}
		}
	}
	return nil
}

// fakeSlotTable is a pretend device page -> slot table (kernels.SlotTables).
type fakeSlotTable struct {
	mu   sync.Mutex
	slot []int32
	use  []uint64
	free bool
}

var _ kernels.SlotTables = FakeDevice{}

func slotTable(t any) (*fakeSlotTable, error) {
	st, ok := t.(*fakeSlotTable)
	if !ok || st.free {
		return nil, fmt.Errorf("fake device: slot table %T is not a live *fakeSlotTable", t)
	}
	return st, nil
}

// NewSlotTable implements kernels.SlotTables.
func (FakeDevice) NewSlotTable(_ context.Context, pages int) (any, error) {
	if pages < 1 {
		return nil, fmt.Errorf("fake device: slot table of %d pages", pages)
	}
	t := &fakeSlotTable{slot: make([]int32, pages), use: make([]uint64, pages)}
	for i := range t.slot {
		t.slot[i] = -1
	}
	return t, nil
}

// FreeSlotTable implements kernels.SlotTables.
func (FakeDevice) FreeSlotTable(_ context.Context, table any) error {
	t, err := slotTable(table)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.free = true
	return nil
}

// WriteSlotTable implements kernels.SlotTables.
func (FakeDevice) WriteSlotTable(_ context.Context, table any, pages, slots []int32) error {
	t, err := slotTable(table)
	if err != nil {
		return err
	}
	if len(pages) != len(slots) {
		return fmt.Errorf("fake device: %d slots for %d pages", len(slots), len(pages))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, p := range pages {
		if p < 0 || int(p) >= len(t.slot) || slots[i] < -1 {
			return fmt.Errorf("fake device: slot table entry (page %d, slot %d) outside the table of %d pages", p, slots[i], len(t.slot))
		}
	}
	for i, p := range pages {
		t.slot[p] = slots[i]
	}
	return nil
}

// ReadSlotTable implements kernels.SlotTables.
func (FakeDevice) ReadSlotTable(_ context.Context, table any) ([]int32, []uint64, error) {
	t, err := slotTable(table)
	if err != nil {
		return nil, nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.slot), slices.Clone(t.use), nil
}

// bySlot readdresses b (host pages) by device slot through l.Slots's
// table for attention on a slot pool: every page a row of lists reads
// must have a slot (the others read slot 0, as on the GPU). With stamp
// set it writes the table's use stamps of the listed pages.
func (f FakeDevice) bySlot(l kernels.Layer, b *kernels.Batch, rows int, lists *kernels.Lists, stamp bool) (*kernels.Batch, error) {
	t, err := slotTable(l.Slots.Table)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := &kernels.Batch{Indptr: b.Indptr, LastLen: b.LastLen, Pages: make([]int32, len(b.Pages))}
	for j, p := range b.Pages {
		if p < 0 || int(p) >= len(t.slot) {
			return nil, fmt.Errorf("fake device: page %d outside the slot table of %d pages", p, len(t.slot))
		}
		c.Pages[j] = max(t.slot[p], 0)
	}
	for i := range b.Len() {
		pages := b.Pages[b.Indptr[i]:b.Indptr[i+1]]
		for r := range rows {
			listed := pages
			if !lists.All {
				k := i*rows + r
				listed = nil
				for _, lp := range lists.Pages[lists.Indptr[k]:lists.Indptr[k+1]] {
					listed = append(listed, pages[lp])
				}
			}
			for _, p := range listed {
				if t.slot[p] < 0 {
					return nil, fmt.Errorf("fake device: page %d is attended through the slot table but has no slot", p)
				}
				if stamp {
					t.use[p] = l.Slots.Tick
				}
			}
		}
	}
	return c, nil
}
