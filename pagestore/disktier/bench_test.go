package disktier_test

import (
	"testing"

	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/pagestore/tier/tiertest"
)

// BenchmarkDisk measures the disk tier in each durability mode. Reads come
// from the page cache (the payloads were just written): they measure the
// read path and its checksum, not the device.
func BenchmarkDisk(b *testing.B) {
	for _, d := range []disktier.Durability{disktier.SyncOnWrite, disktier.SyncNone} {
		b.Run(d.String(), func(b *testing.B) {
			tiertest.Bench(b, func(b *testing.B, slots, size int) tier.Tier {
				c := disktier.DefaultConfig()
				c.Dir = b.TempDir()
				c.Slots = slots
				c.PayloadBytes = size
				c.Durability = d
				tr, err := disktier.Open(c)
				if err != nil {
					b.Fatal(err)
				}
				return tr
			})
		})
	}
}
