package tier_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/pagestore/tier/tiertest"
	"github.com/questrt/questrt/plan"
)

func newMemory(t *testing.T, slots, size int) tier.Tier {
	m, err := tier.NewMemory(slots, size)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMemoryConformance(t *testing.T) { tiertest.Run(t, newMemory) }

func TestNewMemoryBadArgs(t *testing.T) {
	if _, err := tier.NewMemory(0, 8); !errors.Is(err, tier.ErrSlot) {
		t.Errorf("NewMemory(0 slots) = %v, want ErrSlot", err)
	}
	if _, err := tier.NewMemory(1, 0); !errors.Is(err, tier.ErrSize) {
		t.Errorf("NewMemory(0 bytes) = %v, want ErrSize", err)
	}
}

func TestMemoryUsed(t *testing.T) {
	m, _ := tier.NewMemory(5, 4)
	ctx := context.Background()
	for _, s := range []int{4, 1, 2} {
		if err := m.Write(ctx, s, []byte{1, 2, 3, 4}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Free(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := m.Used(); !slices.Equal(got, []int{1, 4}) {
		t.Errorf("Used = %v, want [1 4]", got)
	}
	_ = m.Close()
	if got := m.Used(); got != nil {
		t.Errorf("Used after Close = %v, want nil", got)
	}
}

func TestPagePayloadBytes(t *testing.T) {
	llama := plan.Geometry{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16, DType: plan.BFloat16}
	for _, c := range []struct {
		layers int
		g      plan.Geometry
		want   int
	}{
		{32, llama, 2 << 20},
		{1, llama, 64 << 10},
		{32, plan.Geometry{KVHeads: 8, HeadDim: 128, PageSize: 16}, 4 << 20}, // float32
		{0, llama, 0},
		{1, plan.Geometry{KVHeads: 8, HeadDim: 128, PageSize: 16, DType: 9}, 0},
		{1, plan.Geometry{KVHeads: 8, HeadDim: 0, PageSize: 16}, 0},
	} {
		if got := tier.PagePayloadBytes(c.layers, c.g); got != c.want {
			t.Errorf("PagePayloadBytes(%d, %+v) = %d, want %d", c.layers, c.g, got, c.want)
		}
	}
}
