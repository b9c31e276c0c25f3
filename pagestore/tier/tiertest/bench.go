package tiertest

import (
	"context"
	"testing"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// Size is one payload size of [Bench].
type Size struct {
	Name  string
	Bytes int
}

// BenchSizes returns the payload sizes [Bench] measures: a Llama-3.1-8B
// page (32 layers x 2 x 8 KV heads x 16 tokens x 128 dims x 2 bytes =
// 2 MiB) and one layer of it (64 KiB).
func BenchSizes() []Size {
	g := plan.Geometry{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16, DType: plan.BFloat16}
	return []Size{
		{"page-2MiB", tier.PagePayloadBytes(32, g)},
		{"layer-64KiB", tier.PagePayloadBytes(1, g)},
	}
}

// BenchSlots is the number of slots [Bench] cycles through (64 MiB of
// payload at 2 MiB).
const BenchSlots = 32

// NewBenchTier is [NewTier] for benchmarks.
type NewBenchTier func(b *testing.B, slots, payloadBytes int) tier.Tier

// Bench measures Write and Read throughput (bytes per second, from
// b.SetBytes) of the tiers newTier returns, one payload per call,
// cycling through BenchSlots slots; Read reads slots written beforehand.
func Bench(b *testing.B, newTier NewBenchTier) {
	for _, sz := range BenchSizes() {
		b.Run(sz.Name+"/Write", func(b *testing.B) {
			tr := benchTier(b, newTier, sz.Bytes)
			p := Payload(0, 0, sz.Bytes)
			ctx := context.Background()
			b.SetBytes(int64(sz.Bytes))
			for i := 0; b.Loop(); i++ {
				if err := tr.Write(ctx, i%BenchSlots, p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(sz.Name+"/Read", func(b *testing.B) {
			tr := benchTier(b, newTier, sz.Bytes)
			ctx := context.Background()
			for s := range BenchSlots {
				if err := tr.Write(ctx, s, Payload(s, 0, sz.Bytes)); err != nil {
					b.Fatal(err)
				}
			}
			dst := make([]byte, sz.Bytes)
			b.SetBytes(int64(sz.Bytes))
			for i := 0; b.Loop(); i++ {
				if err := tr.Read(ctx, i%BenchSlots, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchTier(b *testing.B, newTier NewBenchTier, size int) tier.Tier {
	b.Helper()
	tr := newTier(b, BenchSlots, size)
	b.Cleanup(func() {
		if err := tr.Close(); err != nil {
			b.Error(err)
		}
	})
	return tr
}
