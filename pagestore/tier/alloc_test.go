package tier_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/questrt/questrt/pagestore/tier"
)

func TestAllocatorOrderAndFull(t *testing.T) {
	a, err := tier.NewAllocator(3)
	if err != nil {
		t.Fatal(err)
	}
	for want := range 3 {
		if s, err := a.Alloc(); err != nil || s != want {
			t.Fatalf("Alloc = %d, %v, want %d", s, err, want)
		}
	}
	if _, err := a.Alloc(); !errors.Is(err, tier.ErrFull) {
		t.Fatalf("Alloc on full = %v, want ErrFull", err)
	}
	if err := a.Release(1); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(1); !errors.Is(err, tier.ErrEmpty) {
		t.Errorf("double Release = %v, want ErrEmpty", err)
	}
	if err := a.Release(3); !errors.Is(err, tier.ErrSlot) {
		t.Errorf("Release(3) = %v, want ErrSlot", err)
	}
	if s, _ := a.Alloc(); s != 1 {
		t.Errorf("Alloc after Release(1) = %d, want 1", s)
	}
	if a.InUse() != 3 || a.Slots() != 3 {
		t.Errorf("InUse %d Slots %d", a.InUse(), a.Slots())
	}
}

func TestAllocatorUsed(t *testing.T) {
	a, err := tier.NewAllocator(5, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for {
		s, err := a.Alloc()
		if err != nil {
			break
		}
		got = append(got, s)
	}
	if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 4 {
		t.Errorf("free slots handed out %v, want [1 2 4]", got)
	}
	if _, err := tier.NewAllocator(5, 5); !errors.Is(err, tier.ErrSlot) {
		t.Errorf("used slot 5 of 5: %v, want ErrSlot", err)
	}
	if _, err := tier.NewAllocator(5, 1, 1); err == nil {
		t.Error("used slot listed twice: no error")
	}
	if _, err := tier.NewAllocator(0); !errors.Is(err, tier.ErrSlot) {
		t.Errorf("0 slots: %v, want ErrSlot", err)
	}
}

// TestAllocatorNeverTwice checks against a model, with goroutines, that no
// slot is handed out while allocated.
func TestAllocatorNeverTwice(t *testing.T) {
	const slots, workers, ops = 64, 4, 2000
	a, _ := tier.NewAllocator(slots)
	var mu sync.Mutex
	held := map[int]bool{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			var mine []int
			for range ops {
				if len(mine) > 0 && r.IntN(2) == 0 {
					i := r.IntN(len(mine))
					s := mine[i]
					mine = append(mine[:i], mine[i+1:]...)
					mu.Lock()
					delete(held, s)
					mu.Unlock()
					if err := a.Release(s); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				s, err := a.Alloc()
				if errors.Is(err, tier.ErrFull) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if held[s] {
					t.Errorf("slot %d handed out twice", s)
				}
				held[s] = true
				mu.Unlock()
				mine = append(mine, s)
			}
		})
	}
	wg.Wait()
	if a.InUse() != len(held) {
		t.Errorf("InUse %d, held %d", a.InUse(), len(held))
	}
}
