package shard

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
)

// mirrorBackend is a CPU backend with a pretend device: its pools are
// separate host arrays, and kernels given a Layer.Device read only those.
// A page the shard forgets to write shows up as a wrong result.
type mirrorBackend struct {
	*kernels.CPU
}

func (m mirrorBackend) NewPool(_ context.Context, pages, kvh, d, s int) (any, error) {
	return &kernels.Layer{K: make([]float32, pages*kvh*s*d), V: make([]float32, pages*kvh*s*d), Summary: make([]float32, pages*kvh*2*d)}, nil
}

func (m mirrorBackend) WritePages(_ context.Context, pool any, h kernels.Layer, phys []int32) error {
	return copyPages(pool.(*kernels.Layer), h, phys)
}

func (m mirrorBackend) FreePool(context.Context, any) error { return nil }

// copyPages copies whole pages; the pools' page counts are equal.
func copyPages(dst *kernels.Layer, src kernels.Layer, phys []int32) error {
	n := pagesOf(src)
	kvPage, sumPage := len(src.K)/n, len(src.Summary)/n
	for _, p := range phys {
		if int(p) >= n {
			return errors.New("page out of range")
		}
		copy(dst.K[int(p)*kvPage:][:kvPage], src.K[int(p)*kvPage:])
		copy(dst.V[int(p)*kvPage:][:kvPage], src.V[int(p)*kvPage:])
		copy(dst.Summary[int(p)*sumPage:][:sumPage], src.Summary[int(p)*sumPage:])
	}
	return nil
}

// pagesOf is the number of pages of a pool of the test geometry (2 KV
// heads, D = 8: a page holds 2*2*8 summary floats).
func pagesOf(l kernels.Layer) int { return len(l.Summary) / (2 * 8 * 2) }

func (m mirrorBackend) dev(l kernels.Layer) kernels.Layer {
	if p, ok := l.Device.(*kernels.Layer); ok {
		return *p
	}
	return l
}

func (m mirrorBackend) Score(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, mode kernels.GQAMode, out []float32) error {
	return m.CPU.Score(ctx, s, m.dev(l), b, q, mode, out)
}

func (m mirrorBackend) Attend(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, lists *kernels.Lists, o, lse []float32) error {
	return m.CPU.Attend(ctx, s, m.dev(l), b, q, lists, o, lse)
}

// TestDeviceResidentFollowsStore runs the same operations (prefill, decode
// steps, fork with copy-on-write tails, rollbacks inside and across pages)
// on a plain shard and on one that keeps a device copy read by the
// kernels: every step's output must be identical.
func TestDeviceResidentFollowsStore(t *testing.T) {
	const layers, qh, kvh, d, s = 2, 4, 2, 8, 4
	pol := DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = s, 3*s, 1
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	mk := func(dev bool) *Shard {
		var be kernels.Backend = cpu
		if dev {
			be = mirrorBackend{cpu}
		}
		sh, err := New(Config{Store: pagestore.Config{Layers: layers, KVHeads: kvh, HeadDim: d, PageSize: s, Capacity: 64},
			QHeads: qh, Policy: pol, DeviceResident: dev}, be)
		if err != nil {
			t.Fatal(err)
		}
		return sh
	}
	plain, dev := mk(false), mk(true)
	defer dev.Close()
	if _, err := New(Config{Store: pagestore.Config{Layers: 1, KVHeads: kvh, HeadDim: d, PageSize: s, Capacity: 4}, QHeads: qh, Policy: pol, DeviceResident: true}, cpu); err == nil {
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
			if err := plain.Step(context.Background(), l, ra, StepOptions{}, &oa); err != nil {
				t.Fatal(err)
			}
			if err := dev.Step(context.Background(), l, rb, StepOptions{}, &ob); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(oa.O, ob.O) || !slices.Equal(oa.LSE, ob.LSE) {
				t.Fatalf("layer %d: the device copy diverged from the store", l)
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
