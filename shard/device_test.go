package shard

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestDeviceResidentFollowsStore runs the same operations (prefill, decode
// steps, fork with copy-on-write tails, rollbacks inside and across pages)
// on a plain shard and on one whose pages and page tables live only on a
// pretend device: every step's output and diagnostics must be identical,
// on float32 pages and on fp8 records (quantized on append by the store
// and, independently, by the pretend device).
func TestDeviceResidentFollowsStore(t *testing.T) {
	for _, dt := range []plan.DType{plan.Float32, plan.FP8} {
		for _, sel := range []plan.Selector{plan.Quest, plan.Oracle} {
			t.Run(dt.String()+"_"+sel.String(), func(t *testing.T) { testDeviceResident(t, dt, sel) })
		}
	}
}

func testDeviceResident(t *testing.T, dt plan.DType, sel plan.Selector) {
	const layers, qh, kvh, d, s = 2, 4, 2, 8, 4
	pol := plan.DefaultPolicy()
	pol.Selector = sel
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = s, 3*s, 1
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	mk := func(dev bool) *Shard {
		var be kernels.Backend = cpu
		if dev {
			be = backendtest.FakeDevice{CPU: cpu, DType: dt}
		}
		sh, err := New(Config{Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s, DType: dt}, Capacity: 64},
			Policy: pol, DeviceResident: dev}, be)
		if err != nil {
			t.Fatal(err)
		}
		return sh
	}
	plain, dev := mk(false), mk(true)
	defer dev.Close()
	if _, err := New(Config{Store: pagestore.Config{Layers: 1, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 4}, Policy: pol, DeviceResident: true}, cpu); err == nil {
		t.Fatal("DeviceResident accepted a backend without device memory")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func(n int) []float32 { return randVec(rng, n, 1) }
	type pair struct{ a, b pagestore.SeqID }
	both := func(f func(sh *Shard, id pagestore.SeqID) error, p pair) {
		t.Helper()
		if err := f(plain, p.a); err != nil {
			t.Fatal(err)
		}
		if err := f(dev, p.b); err != nil {
			t.Fatal(err)
		}
	}
	appendBoth := func(p pair, n int) {
		t.Helper()
		for l := range layers {
			k, v := vec(n*kvh*d), vec(n*kvh*d)
			both(func(sh *Shard, id pagestore.SeqID) error { return sh.Append(id, l, k, v) }, p)
		}
	}
	stepL := func(ps []pair, withToken bool, from, to int) {
		t.Helper()
		for l := from; l < to; l++ {
			var ra, rb []SeqStep
			for _, p := range ps {
				q := vec(qh * d)
				var k, v []float32
				if withToken {
					k, v = vec(kvh*d), vec(kvh*d)
				}
				ra = append(ra, SeqStep{Seq: p.a, Q: q, K: k, V: v})
				rb = append(rb, SeqStep{Seq: p.b, Q: q, K: k, V: v})
			}
			var oa, ob StepResult
			opt := StepOptions{Diagnostics: true}
			if err := plain.Step(context.Background(), l, ra, opt, &oa); err != nil {
				t.Fatal(err)
			}
			if err := dev.Step(context.Background(), l, rb, opt, &ob); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(oa.O, ob.O) || !slices.Equal(oa.LSE, ob.LSE) {
				t.Fatalf("layer %d: the device pages diverged from the host store", l)
			}
			for i := range oa.Diag {
				da, db := oa.Diag[i], ob.Diag[i]
				if da.Recall != db.Recall || da.MassRecall != db.MassRecall || da.RelL2 != db.RelL2 || da.PagesRead != db.PagesRead {
					t.Fatalf("layer %d sequence %d: diagnostics %+v vs %+v", l, i, da, db)
				}
				for h := range da.Scores {
					if !slices.Equal(da.Scores[h], db.Scores[h]) || !slices.Equal(da.Selected[h], db.Selected[h]) {
						t.Fatalf("layer %d sequence %d head %d: scores or pages differ", l, i, h)
					}
				}
			}
			// The same step again without a token or diagnostics: fused
			// into one backend call (device page tables for dev).
			for i := range ra {
				ra[i].K, ra[i].V, rb[i].K, rb[i].V = nil, nil, nil, nil
			}
			if err := plain.Step(context.Background(), l, ra, StepOptions{}, &oa); err != nil {
				t.Fatal(err)
			}
			if err := dev.Step(context.Background(), l, rb, StepOptions{}, &ob); err != nil {
				t.Fatal(err)
			}
			if (sel == plan.Quest) != (ob.Time.Fused != 0) || !slices.Equal(oa.O, ob.O) || !slices.Equal(oa.LSE, ob.LSE) {
				t.Fatalf("layer %d: steps without diagnostics differ (device fused: %v)", l, ob.Time.Fused != 0)
			}
		}
	}
	step := func(ps []pair, withToken bool) { stepL(ps, withToken, 0, layers) }
	root := pair{plain.Store().Create(), dev.Store().Create()}
	appendBoth(root, 23) // prefill, tail of 3
	step([]pair{root}, true)
	var child pair
	var err error
	if child.a, err = plain.Fork(root.a); err != nil {
		t.Fatal(err)
	}
	if child.b, err = dev.Fork(root.b); err != nil {
		t.Fatal(err)
	}
	step([]pair{root, child}, true) // both branches copy the shared tail
	appendBoth(child, 9)
	step([]pair{root, child}, false)
	for _, n := range []int{2, 5, 8} { // inside a page, across pages, to a boundary
		both(func(sh *Shard, id pagestore.SeqID) error { return sh.Rollback(id, n) }, child)
		step([]pair{root, child}, false)
	}
	other, err := dev.Fork(child.b) // share the child's tail, then roll back inside it
	if err != nil {
		t.Fatal(err)
	}
	otherPlain, _ := plain.Fork(child.a)
	both(func(sh *Shard, id pagestore.SeqID) error { return sh.Rollback(id, 1) }, pair{otherPlain, other})
	step([]pair{root, child, {otherPlain, other}}, true)
	// A copy-on-write by an append to layer 0 only: layer 1 of the new
	// page must follow on the device before layer 1 appends anything.
	appendBoth(child, 1) // a partial tail page to share
	var fork2 pair
	if fork2.a, err = plain.Fork(child.a); err != nil {
		t.Fatal(err)
	}
	if fork2.b, err = dev.Fork(child.b); err != nil {
		t.Fatal(err)
	}
	stepL([]pair{fork2}, true, 0, 1)
	stepL([]pair{fork2, child}, false, 1, 2)
	both(func(sh *Shard, id pagestore.SeqID) error { return sh.Release(id) }, root)
	appendBoth(child, 30) // recycles the released pages
	step([]pair{child}, true)
}
