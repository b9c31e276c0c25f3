package tier_test

import (
	"testing"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/pagestore/tier/tiertest"
)

func BenchmarkMemory(b *testing.B) {
	tiertest.Bench(b, func(b *testing.B, slots, size int) tier.Tier {
		m, err := tier.NewMemory(slots, size)
		if err != nil {
			b.Fatal(err)
		}
		return m
	})
}
