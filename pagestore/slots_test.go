package pagestore

import (
	"context"
	"errors"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// countingSlots is a SlotData that stores nothing and fails MoveSlots
// once fail is set: the store's reaction to a device fault.
type countingSlots struct {
	moves int
	fail  error
}

func (d *countingSlots) WriteSlots(int, []int32, []int32, int, []float32, []float32) error {
	return nil
}
func (d *countingSlots) ResetSummaries([]int32) error                     { return nil }
func (d *countingSlots) CopySlot(int32, int32, int32, int32, []int) error { return nil }
func (d *countingSlots) RescanSlot(int32, int32, int) error               { return nil }
func (d *countingSlots) Table(SeqID, int, []int32, int) error             { return nil }
func (d *countingSlots) Drop(SeqID) error                                 { return nil }
func (d *countingSlots) ReadSlotKV(context.Context, int, int32, []float32, []float32) error {
	return nil
}
func (d *countingSlots) MoveSlots(_ context.Context, saves, loads []kernels.SlotMove) error {
	if d.fail != nil {
		return d.fail
	}
	d.moves += len(saves) + len(loads)
	return nil
}

// TestSlotStoreDeviceFault: once the device's copies to or from the tier
// fail, the residency maps cannot be trusted (they moved ahead of the
// copies): the operation fails wrapping ErrData and the device's error,
// and so does every later one that needs the device pool, instead of
// serving wrong K/V.
func TestSlotStoreDeviceFault(t *testing.T) {
	cfg := Config{Layers: 1, Geometry: plan.Geometry{QHeads: 1, KVHeads: 1, HeadDim: 4, PageSize: 1}, Capacity: 16, DeviceBudget: 2}
	tr, err := tier.NewMemory(cfg.Capacity, cfg.PayloadBytes())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tier = tr
	d := &countingSlots{}
	s, err := NewWithSlots(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	id := s.Create()
	k := []float32{1, 2, 3, 4}
	for range 4 { // 4 pages, 2 slots: the first two are saved to the tier
		if err := s.Append(id, 0, k, k); err != nil {
			t.Fatal(err)
		}
	}
	if d.moves == 0 {
		t.Fatal("no page moved to the tier")
	}
	table, _ := s.AppendPageTable(nil, id)
	device := errors.New("device lost")
	d.fail = device
	err = s.Recall(context.Background(), table[:1])
	if !errors.Is(err, ErrData) || !errors.Is(err, device) {
		t.Fatalf("recall over a failing device: %v, want ErrData wrapping the device's error", err)
	}
	d.fail = nil // the device "comes back": the store must still refuse
	if err := s.Recall(context.Background(), table[1:2]); !errors.Is(err, ErrData) {
		t.Fatalf("recall after a device fault: %v, want ErrData", err)
	}
	kk, vv := make([]float32, 4), make([]float32, 4)
	if err := s.ReadKV(context.Background(), 0, table[0], kk, vv); !errors.Is(err, ErrData) {
		t.Fatalf("read after a device fault: %v, want ErrData", err)
	}
	if err := s.Append(id, 0, k, k); !errors.Is(err, ErrData) {
		t.Fatalf("append after a device fault: %v, want ErrData", err)
	}
}
