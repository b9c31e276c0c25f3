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

// newDeviceShard is a device-resident shard on be (closed when the test
// ends; a backend whose Close is registered with t.Cleanup before it
// outlives it).
func newDeviceShard(t *testing.T, layers, qh, kvh, d, s, capacity int, pol plan.Policy, be kernels.Backend) *Shard {
	t.Helper()
	sh, err := New(Config{Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: capacity},
		Policy: pol, DeviceResident: true}, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	return sh
}

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
	t.Cleanup(func() { cpu.Close() })
	qd := &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}
	syncSh := newDeviceShard(t, layers, qh, kvh, d, s, 256, pol, backendtest.FakeDevice{CPU: cpu})
	queued := newDeviceShard(t, layers, qh, kvh, d, s, 256, pol, qd)
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

// TestFailedSyncWritesNothingLater: a Sync that fails (here, cancelled)
// leaves nothing queued, so a caller that abandons the step and reuses its
// result is not overwritten by the next Sync (found by review).
func TestFailedSyncWritesNothingLater(t *testing.T) {
	const layers, qh, kvh, d, s = 2, 4, 2, 8, 4
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = s, 3*s, 1
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	t.Cleanup(func() { cpu.Close() })
	qd := &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}
	sh := newDeviceShard(t, layers, qh, kvh, d, s, 64, pol, qd)
	rng := rand.New(rand.NewPCG(1, 2))
	id := sh.Store().Create()
	for l := range layers {
		if err := sh.Append(id, l, randVec(rng, 30*kvh*d, 1), randVec(rng, 30*kvh*d, 1)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	var res StepResult
	if err := sh.Step(ctx, 1, []SeqStep{{Seq: id, Q: randVec(rng, qh*d, 1)}}, StepOptions{Queue: true}, &res); err != nil || !res.Queued {
		t.Fatalf("queued %v, %v", res.Queued, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if sh.Sync(cctx) == nil {
		t.Fatal("a cancelled Sync succeeded")
	}
	for i := range res.O {
		res.O[i] = 42
	}
	if err := sh.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if res.O[0] != 42 {
		t.Fatalf("the abandoned output was written after its Sync failed: %v", res.O[0])
	}
	// A failing step clears Queued.
	if err := sh.Step(ctx, layers, []SeqStep{{Seq: id, Q: randVec(rng, qh*d, 1)}}, StepOptions{Queue: true}, &res); err == nil || res.Queued {
		t.Fatalf("bad layer: err %v, queued %v", err, res.Queued)
	}
}
