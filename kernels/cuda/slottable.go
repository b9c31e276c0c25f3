//go:build cuda

package cuda

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
)

// The page -> slot table of a slot pool (kernels.SlotTables, slots.cu):
// a fused step over resident pages scores the summaries by page and
// attends K/V by slot through it, and stamps the pages it attends with
// the step's tick, all on the device: one small kernel between the top-K
// and the attention (quest_slot_resolve) over the listed pages only.

var _ kernels.SlotTables = (*Backend)(nil)

// SlotTable is a device page -> slot table: Slot holds an int32 slot per
// page (-1: not resident), Use a uint64 use stamp per page.
type SlotTable struct {
	Slot, Use cu.DevicePtr
	Pages     int
	// WriteSlotTable's scratch: page -> epoch of the write that last
	// listed it (its entries run in parallel on the device, so a page
	// written twice in one call goes up once, with its last slot).
	seen  []uint32
	epoch uint32
}

func slotTableOf(t any) (*SlotTable, error) {
	st, ok := t.(*SlotTable)
	if !ok {
		return nil, fmt.Errorf("cuda: slot table %T is not a *cuda.SlotTable", t)
	}
	if st.Slot == 0 || st.Use == 0 {
		return nil, errors.New("cuda: the slot table is freed")
	}
	return st, nil
}

// NewSlotTable implements kernels.SlotTables.
func (b *Backend) NewSlotTable(ctx context.Context, pages int) (any, error) {
	if pages < 1 {
		return nil, fmt.Errorf("cuda: slot table of %d pages", pages)
	}
	t := &SlotTable{Pages: pages}
	err := b.do(ctx, func() error {
		var err error
		if t.Slot, err = cu.MemAlloc(int64(pages) * 4); err != nil {
			return fmt.Errorf("cuda: slot table of %d pages: %w", pages, err)
		}
		if t.Use, err = cu.MemAlloc(int64(pages) * 8); err != nil {
			cu.MemFree(t.Slot)
			return fmt.Errorf("cuda: slot table uses of %d pages: %w", pages, err)
		}
		if err := cu.MemsetD32(t.Slot, 0xffffffff, int64(pages)); err != nil {
			freeSlotTable(t)
			return fmt.Errorf("cuda: clear slot table: %w", err)
		}
		if err := cu.MemsetD32(t.Use, 0, 2*int64(pages)); err != nil {
			freeSlotTable(t)
			return fmt.Errorf("cuda: clear slot table uses: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

func freeSlotTable(t *SlotTable) {
	for _, p := range []cu.DevicePtr{t.Slot, t.Use} {
		if p != 0 {
			cu.MemFree(p)
		}
	}
	t.Slot, t.Use = 0, 0
}

// FreeSlotTable implements kernels.SlotTables.
func (b *Backend) FreeSlotTable(ctx context.Context, table any) error {
	t, err := slotTableOf(table)
	if err != nil {
		return err
	}
	return b.do(ctx, func() error {
		freeSlotTable(t)
		return nil
	})
}

// WriteSlotTable implements kernels.SlotTables with one upload and one
// kernel, queued.
func (b *Backend) WriteSlotTable(ctx context.Context, table any, pages, slots []int32) error {
	t, err := slotTableOf(table)
	if err != nil {
		return err
	}
	if len(pages) != len(slots) {
		return fmt.Errorf("cuda write slot table: %d slots for %d pages", len(slots), len(pages))
	}
	for i, p := range pages {
		if p < 0 || int(p) >= t.Pages || slots[i] < -1 {
			return fmt.Errorf("cuda write slot table: entry (page %d, slot %d) outside the table of %d pages", p, slots[i], t.Pages)
		}
	}
	if len(pages) == 0 {
		return nil
	}
	return b.do(ctx, func() error {
		if t.Slot == 0 {
			return errors.New("cuda write slot table: the table is freed")
		}
		// The last entry of each page, pages then slots (the kernel's
		// threads write in no order).
		if t.seen == nil {
			t.seen = make([]uint32, t.Pages)
		}
		if t.epoch++; t.epoch == 0 {
			clear(t.seen)
			t.epoch = 1
		}
		b.slotIn, b.slotIn2 = b.slotIn[:0], b.slotIn2[:0]
		for i := len(pages) - 1; i >= 0; i-- {
			if p := pages[i]; t.seen[p] != t.epoch {
				t.seen[p] = t.epoch
				b.slotIn, b.slotIn2 = append(b.slotIn, p), append(b.slotIn2, slots[i])
			}
		}
		n := len(b.slotIn)
		b.slotIn = append(b.slotIn, b.slotIn2...)
		in, err := upload(b, "slottab.in", b.slotIn)
		if err != nil {
			return err
		}
		return b.launch("quest_slot_table_write", [3]int{(n + 255) / 256, 1, 1}, 256, 0, u(t.Slot), u(in), uint64(n))
	})
}

// ReadSlotTable implements kernels.SlotTables: it waits for the device.
func (b *Backend) ReadSlotTable(ctx context.Context, table any) ([]int32, []uint64, error) {
	t, err := slotTableOf(table)
	if err != nil {
		return nil, nil, err
	}
	slots, uses := make([]int32, t.Pages), make([]uint64, t.Pages)
	err = b.do(ctx, func() error {
		if err := cu.MemcpyDtoH(unsafe.Pointer(&slots[0]), t.Slot, int64(t.Pages)*4); err != nil {
			return fmt.Errorf("cuda: read slot table: %w", err)
		}
		if err := cu.MemcpyDtoH(unsafe.Pointer(&uses[0]), t.Use, int64(t.Pages)*8); err != nil {
			return fmt.Errorf("cuda: read slot table uses: %w", err)
		}
		b.settle() // every queued step is done: fill their outputs
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return slots, uses, nil
}

// slotUse resolves a call's Layer.Slots on device layer dl: nil when the
// call has none.
func slotUse(l kernels.Layer, dl *DeviceLayer) (*SlotTable, error) {
	if err := kernels.CheckSlotUse(l, dl.Slots > 0); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if l.Slots == nil {
		return nil, nil
	}
	t, err := slotTableOf(l.Slots.Table)
	if err != nil {
		return nil, err
	}
	if t.Pages != dl.Pages {
		return nil, fmt.Errorf("cuda: slot table of %d pages for a pool of %d", t.Pages, dl.Pages)
	}
	return t, nil
}

// bySlot readdresses the attention of a by slot through table t (device
// goroutine only): one kernel over the attention's work items writes the
// slots of the listed pages at their batch positions in a scratch array
// that replaces a.pg (the score has read the physical pages already),
// and, with stamp, the listed pages' use stamps (tick). pdl launches it
// as a programmatic dependent of the top-K that wrote the lists; the
// attention may then be its dependent in turn.
func (b *Backend) bySlot(t *SlotTable, total int, a *attendArgs, stamp bool, tick uint64, pdl bool) error {
	if total == 0 || a.items == 0 {
		return nil
	}
	sg, err := b.buf("slottab.pages", int64(total)*4)
	if err != nil {
		return err
	}
	use := cu.DevicePtr(0)
	if stamp {
		use = t.Use
	}
	if err := b.launchMode(pdl, "quest_slot_resolve", [3]int{a.items, 1, 1}, 64, 0,
		u(a.ind), u(a.pg), u(a.iSeq), u(a.iLo), u(a.iHi), u(a.lists), u(t.Slot), u(use), u(sg), tick); err != nil {
		return err
	}
	a.pg = sg
	return nil
}
