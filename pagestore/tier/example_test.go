package tier_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// Example offloads one page's payload to a tier through an allocator, reads
// it back, and recycles the slot: the next owner reads ErrEmpty, not the
// old bytes.
func Example() {
	g := plan.Geometry{KVHeads: 1, HeadDim: 2, PageSize: 2, DType: plan.Float32}
	size := tier.PagePayloadBytes(2, g) // 2 layers x K,V x 1 head x 2 tokens x 2 dims x 4 bytes
	host, err := tier.NewMemory(4, size)
	if err != nil {
		panic(err)
	}
	defer host.Close()
	slots, _ := tier.NewAllocator(host.Slots())
	ctx := context.Background()

	payload := make([]byte, size)
	payload[0] = 42
	s, _ := slots.Alloc()
	if err := host.Write(ctx, s, payload); err != nil {
		panic(err)
	}
	back := make([]byte, size)
	_ = host.Read(ctx, s, back)
	fmt.Println(size, "bytes in slot", s, "first byte", back[0])

	// Recycle: free in the tier, then release the slot.
	_ = host.Free(ctx, s)
	_ = slots.Release(s)
	again, _ := slots.Alloc()
	err = host.Read(ctx, again, back)
	fmt.Println("slot", again, "reads ErrEmpty:", errors.Is(err, tier.ErrEmpty))
	// Output:
	// 64 bytes in slot 0 first byte 42
	// slot 0 reads ErrEmpty: true
}
