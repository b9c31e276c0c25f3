package tier

import (
	"fmt"
	"sync"
)

// Allocator hands out the slots of one tier: a free list that never hands
// out a slot that is allocated, and takes back only allocated slots. It is
// bookkeeping only; stale data is kept out by the tier itself: free a slot
// in the tier ([Tier.Free]) before releasing it here, and a reallocated
// slot reads [ErrEmpty] until it is written.
//
// Fresh slots are handed out in increasing order (0, 1, 2, ...), released
// ones last-in first-out, so a disk tier's slab files fill from the front.
// The zero value is unusable; create one with [NewAllocator]. An Allocator
// is safe for concurrent use.
type Allocator struct {
	mu   sync.Mutex
	free []int32 // stack: the next slot to hand out is last
	used []bool
	n    int // allocated
}

// NewAllocator returns an allocator of slots slots in which the slots used
// are allocated and the others free. Pass the slots a reopened tier holds
// (the disk tier's Used) to rebuild its state. A used slot out of range
// ([ErrSlot]) or listed twice is an error.
func NewAllocator(slots int, used ...int) (*Allocator, error) {
	if slots < 1 || slots > 1<<31-1 {
		return nil, fmt.Errorf("tier: new allocator: %d slots: %w", slots, ErrSlot)
	}
	a := &Allocator{used: make([]bool, slots)}
	for _, s := range used {
		if err := CheckSlot(s, slots); err != nil {
			return nil, fmt.Errorf("tier: new allocator: used %w", err)
		}
		if a.used[s] {
			return nil, fmt.Errorf("tier: new allocator: used slot %d listed twice", s)
		}
		a.used[s] = true
		a.n++
	}
	a.free = make([]int32, 0, slots-a.n)
	for s := slots - 1; s >= 0; s-- {
		if !a.used[s] {
			a.free = append(a.free, int32(s))
		}
	}
	return a, nil
}

// Slots returns the number of slots.
func (a *Allocator) Slots() int { return len(a.used) }

// Alloc returns a free slot and marks it allocated, or an error wrapping
// [ErrFull] when none is free.
func (a *Allocator) Alloc() (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.free) == 0 {
		return 0, fmt.Errorf("tier: alloc: all %d slots in use: %w", len(a.used), ErrFull)
	}
	s := a.free[len(a.free)-1]
	a.free = a.free[:len(a.free)-1]
	a.used[s] = true
	a.n++
	return int(s), nil
}

// Release returns an allocated slot to the free list. Releasing a slot that
// is not allocated returns an error wrapping [ErrEmpty] (a double release)
// and changes nothing; so does a slot out of range ([ErrSlot]).
func (a *Allocator) Release(slot int) error {
	if err := CheckSlot(slot, len(a.used)); err != nil {
		return fmt.Errorf("tier: release: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.used[slot] {
		return fmt.Errorf("tier: release slot %d: not allocated: %w", slot, ErrEmpty)
	}
	a.used[slot] = false
	a.n--
	a.free = append(a.free, int32(slot))
	return nil
}

// InUse returns the number of allocated slots.
func (a *Allocator) InUse() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}
