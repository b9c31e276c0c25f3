package tier_test

import (
	"context"
	"fmt"
	"os"

	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
)

// ExampleNewSpill keeps at most two payloads in host memory and spills the
// least recently used one to a disk tier when a third is written; reads
// come from wherever a slot lives.
func ExampleNewSpill() {
	dir, err := os.MkdirTemp("", "spill-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	const slots, size = 8, 4096
	dc := disktier.DefaultConfig()
	dc.Dir, dc.Slots, dc.PayloadBytes = dir, slots, size
	disk, err := disktier.Open(dc)
	if err != nil {
		panic(err)
	}
	host, err := tier.NewMemory(slots, size)
	if err != nil {
		panic(err)
	}
	t, err := tier.NewSpill(host, disk, tier.SpillConfig{Budget: 2})
	if err != nil {
		panic(err)
	}
	defer t.Close() // closes host and disk too

	ctx := context.Background()
	p := make([]byte, size)
	for s := range 3 {
		p[0] = byte(10 + s)
		if err := t.Write(ctx, s, p); err != nil {
			panic(err)
		}
	}
	for s := range 3 {
		if err := t.Read(ctx, s, p); err != nil {
			panic(err)
		}
		fmt.Println("slot", s, "first byte", p[0])
	}
	st := t.Stats()
	fmt.Printf("host %d, disk %d, spilled %d bytes; reads: %d from host, %d from disk\n",
		st.Upper, st.Lower, st.SpilledBytes, st.UpperReads, st.LowerReads)
	// Output:
	// slot 0 first byte 10
	// slot 1 first byte 11
	// slot 2 first byte 12
	// host 2, disk 1, spilled 4096 bytes; reads: 2 from host, 1 from disk
}
