package shard

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
)

// slotData is the pagestore.SlotData of a DeviceResident shard with
// offload: one slot pool per layer in a backend's memory (summaries of
// every page, K/V of DeviceBudget slots), the backend's host tier, which
// the device reads and writes directly, and a device copy of the page
// tables that the store keeps current entry by entry (Table writes only
// the entries that changed), which the steps' ranking reads.
type slotData struct {
	ss     kernels.SlotStore
	pools  []any // per layer
	tier   kernels.HostTier
	tables any // the device page tables (kernels.Batch.Tables)
	pages  int // pool size (the pages the tables index)
	// gen counts the page table changes (Table and Drop calls): a step
	// whose sequences saw none since its last copy of their host page
	// tables reuses the copy (LocalStep.hostTab).
	gen atomic.Uint64
}

var _ pagestore.SlotData = (*slotData)(nil)

func (d *slotData) WriteSlots(layer int, pages, slots []int32, slot int, k, v []float32) error {
	return d.ss.WriteSlotTokens(context.Background(), d.pools[layer], pages, slots, slot, k, v)
}

func (d *slotData) ResetSummaries(pages []int32) error {
	for l, p := range d.pools {
		if err := d.ss.Rescan(context.Background(), p, pages, 0); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

// CopySlot copies whole slots: the slots past valid hold unspecified data.
func (d *slotData) CopySlot(dst, src, dstSlot, srcSlot int32, _ []int) error {
	for l, p := range d.pools {
		if err := d.ss.CopySlot(context.Background(), p, dst, src, dstSlot, srcSlot); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

func (d *slotData) RescanSlot(page, slot int32, valid int) error {
	for l, p := range d.pools {
		if err := d.ss.RescanSlot(context.Background(), p, page, slot, valid); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

// Table writes the changed entries to the device page tables (the steps
// rank through them; they attend by slot, from the host page tables).
func (d *slotData) Table(id pagestore.SeqID, at int, pages []int32, n int) error {
	d.gen.Add(1)
	return d.ss.WriteTable(context.Background(), d.tables, uint64(id), at, pages, n, d.pages)
}

func (d *slotData) Drop(id pagestore.SeqID) error {
	d.gen.Add(1)
	return d.ss.DropTable(context.Background(), d.tables, uint64(id))
}

func (d *slotData) MoveSlots(ctx context.Context, saves, loads []kernels.SlotMove) error {
	return d.ss.MoveSlots(ctx, d.pools, d.tier, saves, loads)
}

func (d *slotData) ReadSlotKV(ctx context.Context, layer int, slot int32, k, v []float32) error {
	kk, vv, err := d.ss.ReadSlotKV(ctx, d.pools[layer], slot)
	if err != nil {
		return err
	}
	if len(kk) != len(k) || len(vv) != len(v) {
		return fmt.Errorf("read slot %d: %d and %d floats, want %d", slot, len(kk), len(vv), len(k))
	}
	copy(k, kk)
	copy(v, vv)
	return nil
}

// newDeviceOffload builds the store of a DeviceResident shard with
// offload: the backend's slot pools and host tier (s.dev, s.hostTier).
func (s *Shard) newDeviceOffload(cfg Config) error {
	ss, ok := s.be.(kernels.SlotStore)
	if !ok {
		return fmt.Errorf("shard: %w: backend %s cannot offload device-resident pages (DeviceResident with a device budget needs a kernels.SlotStore)", pagestore.ErrInvalidConfig, s.be.Name())
	}
	c := cfg.Store
	if c.Tier != nil {
		return fmt.Errorf("shard: %w: a DeviceResident shard's tier is its backend's host tier; Store.Tier must be nil", pagestore.ErrInvalidConfig)
	}
	c.DType = ss.PoolDType()
	// The host tier is pinned memory for every page: check it like the
	// host pools of pagestore.New.
	what := fmt.Sprintf("pinned host tier of %d pages x %d bytes", c.Capacity, c.PayloadBytes())
	if err := memlimit.Check(what, memlimit.Mul(int64(c.Capacity), int64(c.PayloadBytes())), c.MemoryLimit); err != nil {
		return fmt.Errorf("shard: %w", err)
	}
	ctx := context.Background()
	t, err := ss.NewHostTier(ctx, c.Capacity, c.PayloadBytes())
	if err != nil {
		return fmt.Errorf("shard: host tier of %d pages: %w", c.Capacity, err)
	}
	s.hostTier = t
	s.ds = ss
	for l := range c.Layers {
		pool, err := ss.NewSlotPool(ctx, c.Capacity, c.DeviceBudget, c.KVHeads, c.HeadDim, c.PageSize)
		if err != nil {
			return fmt.Errorf("shard: device slot pool for layer %d: %w", l, err)
		}
		s.dev = append(s.dev, pool)
	}
	tables, err := ss.NewTables(ctx)
	if err != nil {
		return fmt.Errorf("shard: device page tables: %w", err)
	}
	s.tables = tables
	c.Tier = t
	s.slots = &slotData{ss: ss, pools: s.dev, tier: t, tables: tables, pages: c.Capacity}
	var data pagestore.SlotData = s.slots
	if sts, ok := ss.(kernels.SlotTables); ok {
		tab, err := sts.NewSlotTable(ctx, c.Capacity)
		if err != nil {
			return fmt.Errorf("shard: device slot table: %w", err)
		}
		s.slotTab, s.slotTabs = tab, sts
		data = &tableSlotData{slotData: s.slots, st: sts, tab: tab}
	}
	st, err := pagestore.NewWithSlots(c, data)
	if err != nil {
		return fmt.Errorf("shard: %w", err)
	}
	s.store = st
	s.off = newOffload(c)
	if cfg.PrefetchPages > 0 {
		s.pfPlan = newPrefetchPlan(cfg)
		s.pf = newPrefetcher(st)
	}
	return nil
}

// tableSlotData is the slotData of a backend that keeps a device page ->
// slot table (kernels.SlotTables): the store writes its residency
// changes into it, and the fused steps of an all-resident shard read K/V
// through it.
type tableSlotData struct {
	*slotData
	st  kernels.SlotTables
	tab any
}

var _ pagestore.SlotTable = (*tableSlotData)(nil)

func (d *tableSlotData) WriteSlotTable(pages, slots []int32) error {
	return d.st.WriteSlotTable(context.Background(), d.tab, pages, slots)
}

func (d *tableSlotData) ReadSlotTable(ctx context.Context) ([]int32, []uint64, error) {
	return d.st.ReadSlotTable(ctx, d.tab)
}
