package serveengine

import (
	"context"
	"errors"
	"testing"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// smallSpec is a 2-layer grid of 4 query and 2 KV heads of 8, pages of
// 4 tokens, on cp x tp ranks of 16 pages each.
func smallSpec(cp, tp int) (completion.GridSpec, model.Geometry) {
	g := model.Geometry{Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8}
	layers, pg := g.Shape()
	pol := plan.DefaultPolicy()
	pol.PageSize = 4
	pg.PageSize = pol.PageSize
	return completion.GridSpec{Layers: layers, Geometry: pg, Policy: pol, CapacityPages: 16, CP: cp, TP: tp,
		Selection: plan.Exact, MemoryLimit: -1}, g
}

// TestEnginesUsage: an engine of a GridSpec holds what its sequences
// append (pages of 4 tokens on each of 2 CP ranks, striped), and after
// Close a sequence's release fails with completion.ErrEngineClosed, still
// wrapping engine.ErrClosed.
func TestEnginesUsage(t *testing.T) {
	spec, g := smallSpec(2, 1)
	e, err := Engines().New(spec)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()
	if u := e.Usage(); u != (completion.EngineUsage{FreePages: 16}) {
		t.Errorf("empty engine: usage %+v, want no sequence, 0 used, 16 free", u)
	}
	ctx := context.Background()
	a, err := e.NewAttention(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	const tokens = 12 // 3 pages: 2 on rank 0, 1 on rank 1 (striped)
	kv := make([]float32, tokens*g.KVHeads*g.HeadDim)
	for l := range g.Layers {
		if err := a.Sequence().Append(ctx, l, kv, kv); err != nil {
			t.Fatal(err)
		}
	}
	if u := e.Usage(); u != (completion.EngineUsage{Sequences: 1, UsedPages: 2, FreePages: 14}) {
		t.Errorf("one sequence of %d tokens: usage %+v, want 1 sequence, 2 used and 14 free on the fuller rank", tokens, u)
	}
	if _, err := e.NewAttention(ctx, model.Geometry{Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 8}); err == nil {
		t.Error("attention for a model of 3 layers on an engine of 2: no error")
	}
	closed = true
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(); !errors.Is(err, completion.ErrEngineClosed) || !errors.Is(err, engine.ErrClosed) {
		t.Errorf("release after Close: %v, want completion.ErrEngineClosed wrapping engine.ErrClosed", err)
	}
}

// TestEnginesValidate: a spec whose TP does not divide the KV heads is
// refused without opening an engine; EngineConfig keeps the engine's
// defaults for what a spec does not set.
func TestEnginesValidate(t *testing.T) {
	spec, _ := smallSpec(1, 1)
	if err := Engines().Validate(spec); err != nil {
		t.Errorf("a 1 x 1 grid: %v", err)
	}
	spec.TP = 3
	if err := Engines().Validate(spec); err == nil {
		t.Error("TP 3 over 2 KV heads: no error")
	}
	ec, def := EngineConfig(spec), engine.DefaultConfig()
	if ec.StepTimeout != def.StepTimeout || ec.BlockPages != def.BlockPages || ec.TP != 3 || ec.CapacityPages != 16 || ec.PageSize != 4 {
		t.Errorf("EngineConfig: step timeout %v, block %d, tp %d, %d pages of %d; want %v, %d, 3, 16 of 4",
			ec.StepTimeout, ec.BlockPages, ec.TP, ec.CapacityPages, ec.PageSize, def.StepTimeout, def.BlockPages)
	}
}

// TestDeviceBytes: the device memory of smallSpec's pools of 16 pages,
// computed by hand per page of one rank holding both KV heads: 2 layers
// x 2 heads x (K and V of 4 x 8 elements + a 2 x 8 summary) = 2 x 2 x
// (64 + 16) elements, as float32 (1280 bytes), bf16 (640), or fp8 (2 x 2
// x (64 one-byte codes + 2 float32 scales + 16 float32 summary
// elements) = 544), and 8 bytes of page table; gpu.Reserve (256 MiB)
// once. TP 2 splits the heads (the same pool bytes) over two tables; CP
// 2 doubles the pages. Without DeviceResident: nothing.
func TestDeviceBytes(t *testing.T) {
	const reserve = 256 << 20
	for _, c := range []struct {
		cp, tp int
		dt     plan.DType
		want   int64
	}{
		{1, 1, plan.Float32, 16*(1280+8) + reserve},
		{1, 1, plan.BFloat16, 16*(640+8) + reserve},
		{1, 1, plan.Float16, 16*(640+8) + reserve},
		{1, 1, plan.FP8, 16*(544+8) + reserve},
		{1, 2, plan.Float32, 16*(1280+2*8) + reserve},
		{2, 1, plan.BFloat16, 2*16*(640+8) + reserve},
	} {
		spec, _ := smallSpec(c.cp, c.tp)
		spec.Geometry.DType, spec.DeviceResident = c.dt, true
		got, err := Engines().DeviceBytes(spec)
		if err != nil || got != c.want {
			t.Errorf("%d x %d %v: %d bytes (%v), want %d", c.cp, c.tp, c.dt, got, err, c.want)
		}
	}
	spec, _ := smallSpec(1, 1)
	if got, err := Engines().DeviceBytes(spec); got != 0 || err != nil {
		t.Errorf("host pages: %d device bytes (%v), want 0", got, err)
	}
}
