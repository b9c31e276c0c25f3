package disktier_test

import (
	"context"
	"fmt"
	"os"

	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
)

// Example writes a payload to a disk tier, closes it, and recovers the slot
// and its allocation state after reopening.
func Example() {
	dir, err := os.MkdirTemp("", "disktier-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	cfg := disktier.DefaultConfig()
	cfg.Dir = dir
	cfg.Slots = 8
	cfg.PayloadBytes = 64 << 10 // one layer of a Llama-3.1-8B page
	ctx := context.Background()

	d, err := disktier.Open(cfg)
	if err != nil {
		panic(err)
	}
	payload := make([]byte, cfg.PayloadBytes)
	payload[7] = 7
	if err := d.Write(ctx, 3, payload); err != nil { // durable on return (SyncOnWrite)
		panic(err)
	}
	if err := d.Close(); err != nil {
		panic(err)
	}

	d, err = disktier.Open(cfg)
	if err != nil {
		panic(err)
	}
	defer d.Close()
	slots, _ := tier.NewAllocator(d.Slots(), d.Used()...)
	back := make([]byte, cfg.PayloadBytes)
	err = d.Read(ctx, 3, back)
	next, _ := slots.Alloc()
	fmt.Println("used", d.Used(), "read", err, back[7], "next free", next)
	// Output: used [3] read <nil> 7 next free 0
}
