package pagestore

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// tableSlots is a countingSlots with a device page -> slot table
// (SlotTable) kept as the device would: entries written in order, use
// stamps written by the "steps" (stamp).
type tableSlots struct {
	countingSlots
	slot   []int32
	use    []uint64
	writes int
	fail   error
}

func newTableSlots(pages int) *tableSlots {
	d := &tableSlots{slot: make([]int32, pages), use: make([]uint64, pages)}
	for i := range d.slot {
		d.slot[i] = -1
	}
	return d
}

func (d *tableSlots) WriteSlotTable(pages, slots []int32) error {
	for i, p := range pages {
		d.slot[p] = slots[i]
	}
	d.writes++
	return nil
}

func (d *tableSlots) ReadSlotTable(context.Context) ([]int32, []uint64, error) {
	if d.fail != nil {
		return nil, nil, d.fail
	}
	return slices.Clone(d.slot), slices.Clone(d.use), nil
}

// stamp is a step attending pages through the table at tick.
func (d *tableSlots) stamp(t *testing.T, tick uint64, pages ...int32) {
	t.Helper()
	for _, p := range pages {
		if d.slot[p] < 0 {
			t.Fatalf("a step attends page %d through the table, which gives it no slot", p)
		}
		d.use[p] = tick
	}
}

func newTableStore(t *testing.T, capacity, budget int) (*Store, *tableSlots) {
	t.Helper()
	cfg := Config{Layers: 1, Geometry: plan.Geometry{QHeads: 1, KVHeads: 1, HeadDim: 4, PageSize: 1}, Capacity: capacity, DeviceBudget: budget}
	tr, err := tier.NewMemory(cfg.Capacity, cfg.PayloadBytes())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tier = tr
	d := newTableSlots(capacity)
	s, err := NewWithSlots(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	return s, d
}

// TestSlotTableFollowsResidency: random appends, forks, rollbacks,
// releases (recycled pages), recalls that evict and steps through the
// table: after every operation the device's table equals the store's
// map (CheckResidency compares them), and StepResident says yes exactly
// when no page with data is only in the tier.
func TestSlotTableFollowsResidency(t *testing.T) {
	s, d := newTableStore(t, 64, 12)
	rng := rand.New(rand.NewPCG(4, 4))
	k := []float32{1, 2, 3, 4}
	var live []SeqID
	resident := 0
	for op := range 400 {
		switch r := rng.IntN(8); {
		case len(live) == 0 || (r == 0 && len(live) < 4):
			id := s.Create()
			if err := s.Append(id, 0, k, k); err != nil {
				t.Fatal(err)
			}
			live = append(live, id)
		case r == 1 && len(live) < 4:
			id, err := s.Fork(live[rng.IntN(len(live))])
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, id)
		case r == 2:
			id := live[rng.IntN(len(live))]
			if n, _ := s.Len(id); n > 1 {
				if err := s.Rollback(id, 1+rng.IntN(n-1)); err != nil {
					t.Fatal(err)
				}
			}
		case r == 3 && len(live) > 1:
			i := rng.IntN(len(live))
			if err := s.Release(live[i]); err != nil {
				t.Fatal(err)
			}
			live = slices.Delete(live, i, i+1)
		case r == 4:
			table, err := s.AppendPageTable(nil, live[rng.IntN(len(live))])
			if err != nil {
				t.Fatal(err)
			}
			if len(table) > 8 {
				table = table[len(table)-8:]
			}
			if err := s.Recall(context.Background(), table); err != nil {
				t.Fatal(err)
			}
		case r == 5:
			tierOnly := s.ResidencyStats().TierOnly
			tick, ok, err := s.StepResident()
			if err != nil {
				t.Fatal(err)
			}
			if ok != (tierOnly == 0) {
				t.Fatalf("op %d: StepResident %v with %d pages only in the tier", op, ok, tierOnly)
			}
			if ok {
				resident++
				table, err := s.AppendPageTable(nil, live[rng.IntN(len(live))])
				if err != nil {
					t.Fatal(err)
				}
				d.stamp(t, tick, table...)
			}
		default:
			if err := s.Append(live[rng.IntN(len(live))], 0, k, k); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CheckResidency(); err != nil {
			t.Fatalf("op %d: %v", op, err)
		}
	}
	st := s.ResidencyStats()
	if resident == 0 || st.ResidentSteps != int64(resident) || st.Evictions == 0 || d.writes == 0 {
		t.Fatalf("not exercised: %d resident steps, %+v, %d table writes", resident, st, d.writes)
	}
}

// TestStepResidentUses: the pages a step attended through the table
// (their device use stamps) count as used when the store next evicts:
// of 8 resident pages admitted in order, the 4 oldest were attended by a
// step, so the 4 new pages evict the 4 others. A failed read of the
// stamps is a device fault (ErrData).
func TestStepResidentUses(t *testing.T) {
	s, d := newTableStore(t, 32, 8)
	id := s.Create()
	k := []float32{1, 2, 3, 4}
	for range 8 {
		if err := s.Append(id, 0, k, k); err != nil {
			t.Fatal(err)
		}
	}
	table, _ := s.AppendPageTable(nil, id)
	tick, ok, err := s.StepResident()
	if err != nil || !ok {
		t.Fatalf("8 pages on 8 slots: StepResident %v, %v", ok, err)
	}
	d.stamp(t, tick, table[:4]...)
	for range 4 {
		if err := s.Append(id, 0, k, k); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range table[:8] {
		if got := s.DeviceSlot(p) >= 0; got != (i < 4) {
			t.Fatalf("page %d resident %v: the step's pages should stay, the others go", i, got)
		}
	}
	if _, ok, _ := s.StepResident(); ok {
		t.Fatal("StepResident with pages only in the tier")
	}
	if err := s.CheckResidency(); err != nil {
		t.Fatal(err)
	}
	// A step through the table, then a failed read of its stamps.
	table, _ = s.AppendPageTable(nil, id)
	if err := s.Recall(context.Background(), table[8:]); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(id); err != nil {
		t.Fatal(err)
	}
	id = s.Create()
	if err := s.Append(id, 0, k, k); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.StepResident(); err != nil || !ok {
		t.Fatalf("after the release: StepResident %v, %v", ok, err)
	}
	d.fail = errors.New("device lost")
	if err := s.Recall(context.Background(), []int32{0}); !errors.Is(err, ErrData) || !errors.Is(err, d.fail) {
		t.Fatalf("recall over a failed read of the use stamps: %v, want ErrData", err)
	}
}
