package shard

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestQueuedStepsMatchSynchronous runs every layer of a decode step
// queued (StepOptions.Queue, one Sync per step) on a pretend device that
// writes queued outputs only at Sync, against the same steps run one
// synchronous call each on a twin shard: the outputs are bit-identical,
// nothing is readable before Sync, and steps that cannot be queued (dense
// layers are fused too; Phased and Diagnostics are not) run at once.
func TestQueuedStepsMatchSynchronous(t *testing.T) {
	const layers, qh, kvh, d, s = 4, 4, 2, 8, 4
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = s, 3*s, 1
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	qd := &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}
	mk := func(be kernels.Backend) *Shard {
		sh, err := New(Config{Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 256},
			Policy: pol, DeviceResident: true}, be)
		if err != nil {
			t.Fatal(err)
		}
		return sh
	}
	syncSh, queued := mk(backendtest.FakeDevice{CPU: cpu}), mk(qd)
	defer syncSh.Close()
	defer queued.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	vec := func(n int) []float32 { return randVec(rng, n, 1) }
	var ida, idb []pagestore.SeqID
	for _, n := range []int{37, 90, 5} { // lengths off page boundaries
		a, b := syncSh.Store().Create(), queued.Store().Create()
		for l := range layers {
			k, v := vec(n*kvh*d), vec(n*kvh*d)
			if err := syncSh.Append(a, l, k, v); err != nil {
				t.Fatal(err)
			}
			if err := queued.Append(b, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
		ida, idb = append(ida, a), append(idb, b)
	}
	ctx := context.Background()
	for step := range 3 {
		want := make([]StepResult, layers)
		got := make([]StepResult, layers)
		before := qd.Queued()
		for l := range layers {
			var ra, rb []SeqStep
			for i := range ida {
				q, k, v := vec(qh*d), vec(kvh*d), vec(kvh*d)
				ra = append(ra, SeqStep{Seq: ida[i], Q: q, K: k, V: v})
				rb = append(rb, SeqStep{Seq: idb[i], Q: q, K: k, V: v})
			}
			if err := syncSh.Step(ctx, l, ra, StepOptions{}, &want[l]); err != nil {
				t.Fatal(err)
			}
			if err := queued.Step(ctx, l, rb, StepOptions{Queue: true}, &got[l]); err != nil {
				t.Fatal(err)
			}
			if !got[l].Queued {
				t.Fatalf("step %d layer %d: not queued", step, l)
			}
			if !math.IsNaN(float64(got[l].O[0])) {
				t.Fatalf("step %d layer %d: the queued output is readable before Sync", step, l)
			}
		}
		if n := qd.Queued() - before; n != layers {
			t.Fatalf("step %d: %d backend steps queued, want %d", step, n, layers)
		}
		if err := queued.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		for l := range layers {
			if !slices.Equal(want[l].O, got[l].O) || !slices.Equal(want[l].LSE, got[l].LSE) {
				t.Fatalf("step %d layer %d: queued outputs differ from the synchronous step", step, l)
			}
		}
	}
	// Not queued: phased, diagnostics, and a backend without a queue.
	rb := []SeqStep{{Seq: idb[0], Q: vec(qh * d)}}
	for _, opt := range []StepOptions{{Queue: true, Phased: true}, {Queue: true, Diagnostics: true}} {
		var res StepResult
		if err := queued.Step(ctx, 1, rb, opt, &res); err != nil {
			t.Fatal(err)
		}
		if res.Queued || math.IsNaN(float64(res.O[0])) {
			t.Fatalf("%+v: queued %v, output %v", opt, res.Queued, res.O[0])
		}
	}
	var res StepResult
	if err := syncSh.Step(ctx, 1, []SeqStep{{Seq: ida[0], Q: vec(qh * d)}}, StepOptions{Queue: true}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Queued || syncSh.Sync(ctx) != nil {
		t.Fatal("a backend without a queue queued a step")
	}
}
