package pagestore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// SlotTable is implemented by [SlotData] whose device keeps a page ->
// slot table of its own (kernels.SlotTables): the store writes every
// residency change into it, so that a step whose pages are all resident
// reads K/V by page through the table ([Store.StepResident]) with no
// per-page work on the host, and the steps' use stamps, written on the
// device, come back only when an eviction or a recall needs the
// recency.
type SlotTable interface {
	// WriteSlotTable sets the slot of page pages[i] to slots[i] (-1:
	// not resident). Queued in order with MoveSlots.
	WriteSlotTable(pages, slots []int32) error
	// ReadSlotTable waits for the queued work and returns the table's
	// slots and the pages' use stamps (the tick of the last step that
	// attended each page through the table, 0 for none).
	ReadSlotTable(ctx context.Context) (slots []int32, uses []uint64, err error)
}

// setSlot records that page p holds slot s (-1: none), in the host map
// and, queued, in the device's table.
func (r *residency) setSlot(p, s int32) {
	r.slot[p] = s
	if r.tab != nil {
		r.tabPages = append(r.tabPages, p)
		r.tabSlots = append(r.tabSlots, s)
	}
}

// flushTable writes the queued slot table changes to the device (mu
// held). A failure is a device fault (r.fault).
func (r *residency) flushTable() error {
	if r.tab == nil || len(r.tabPages) == 0 {
		return nil
	}
	err := r.tab.WriteSlotTable(r.tabPages, r.tabSlots)
	r.tabPages, r.tabSlots = r.tabPages[:0], r.tabSlots[:0]
	if err != nil {
		r.fault = fmt.Errorf("%w: device slot table write failed, the table's contents are unknown: %w", ErrData, err)
		return r.fault
	}
	return nil
}

// StepResident is the bookkeeping of a step that attends through the
// device's page -> slot table ([SlotTable]) without a recall: it reports
// ok when the store keeps such a table and every page that holds data is
// resident (no page only in the tier, no prefetch reservation: O(1)),
// so that any selection is resident. Then it writes the queued table
// changes, counts the step ([ResidencyStats.ResidentSteps]) and returns
// the tick the step stamps into the device's use entries of the pages
// it attends; the store applies those stamps to its eviction order
// lazily, before its next eviction or step recall. Without ok nothing
// changed and the caller recalls the pages as usual.
func (s *Store) StepResident() (tick uint64, ok bool, err error) {
	r := s.res
	if r == nil || r.tab == nil {
		return 0, false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fault != nil {
		return 0, false, r.fault
	}
	if r.ntier != 0 || r.npend != 0 || r.nload != 0 {
		return 0, false, nil
	}
	if err := r.flushTable(); err != nil {
		return 0, false, err
	}
	r.tick++
	r.devUses = true
	r.st.ResidentSteps++
	return r.tick, true, nil
}

// syncUses applies the use stamps the device wrote since the last sync
// to the evictor (mu held): every resident page stamped after its last
// use the host knows of (a step recall or its admission) is touched at
// its stamp's tick, in tick order (ties: lower page first). Pages a step
// recall or an admission used after a device step are not moved behind
// that step's pages retroactively: within the window since the last
// sync, host uses and device uses are ordered as they are applied.
func (r *residency) syncUses(ctx context.Context) error {
	if !r.devUses {
		return nil
	}
	if err := r.flushTable(); err != nil {
		return err
	}
	_, uses, err := r.tab.ReadSlotTable(ctx)
	if err != nil {
		r.fault = fmt.Errorf("%w: device slot table read failed: %w", ErrData, err)
		return r.fault
	}
	if len(uses) != len(r.slot) {
		return fmt.Errorf("%w: device slot table of %d pages, the pool has %d", ErrData, len(uses), len(r.slot))
	}
	r.touch = r.touch[:0]
	for p, t := range uses {
		if t != 0 && r.slot[p] >= 0 && t > r.used[p] && t > r.adm[p] {
			r.touch = append(r.touch, pageUse{int32(p), t})
		}
	}
	slices.SortFunc(r.touch, func(a, b pageUse) int {
		if c := cmp.Compare(a.tick, b.tick); c != 0 {
			return c
		}
		return cmp.Compare(a.p, b.p)
	})
	for _, u := range r.touch {
		r.ev.Touch(u.p, u.tick)
		r.used[u.p] = u.tick
	}
	r.devUses = false
	return nil
}

// pageUse is one page's use at a tick.
type pageUse struct {
	p    int32
	tick uint64
}

// checkTable compares the device's slot table with the host map (mu
// held), after writing the queued changes.
func (r *residency) checkTable(ctx context.Context) error {
	if r.tab == nil {
		return nil
	}
	if err := r.flushTable(); err != nil {
		return err
	}
	slots, _, err := r.tab.ReadSlotTable(ctx)
	if err != nil {
		return fmt.Errorf("read the device slot table: %w", err)
	}
	if len(slots) != len(r.slot) {
		return fmt.Errorf("device slot table of %d pages, the pool has %d", len(slots), len(r.slot))
	}
	for p, s := range r.slot {
		if slots[p] != s {
			return fmt.Errorf("page %d: slot %d, the device's slot table says %d", p, s, slots[p])
		}
	}
	return nil
}
