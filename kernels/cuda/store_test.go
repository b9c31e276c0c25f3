//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// TestDeviceStoreFollowsHost runs the same page operations on a shard with
// host pools and on a DeviceResident shard whose pages live only on the
// GPU (appends of tail lengths 1/15/16/17, a prefill across pages, fork
// with copy-on-write of shared tails, rollbacks inside a page, across
// pages and of a shared tail, release and recycling of the pages). After
// every operation each sequence's valid K/V and every summary read back
// from the device equal the host store's, rounded to the storage type.
func TestDeviceStoreFollowsHost(t *testing.T) {
	ctx := context.Background()
	const layers, qh, kvh, d, s = 2, 8, 2, 64, 16
	for _, c := range []struct {
		dt plan.DType
		q  func(float32) float32
	}{{plan.Float32, func(x float32) float32 { return x }}, {plan.BFloat16, backendtest.RoundBF16}, {plan.Float16, backendtest.RoundF16}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			b := newBackend(t, c.dt)
			defer b.Close()
			cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
			defer cpu.Close()
			cfg := shard.Config{Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 24}, Policy: plan.DefaultPolicy()}
			host, err := shard.New(cfg, cpu)
			if err != nil {
				t.Fatal(err)
			}
			cfg.DeviceResident = true
			dev, err := shard.New(cfg, b)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			if dev.Store().HostPages() {
				t.Fatal("the device-resident shard keeps host pages")
			}
			rng := rand.New(rand.NewPCG(5, uint64(c.dt)))
			type pair struct{ h, d pagestore.SeqID }
			var live []pair
			check := func(what string) {
				t.Helper()
				for _, p := range live {
					n, err := host.Store().Len(p.h)
					if err != nil {
						t.Fatal(err)
					}
					ht, _ := host.Store().AppendPageTable(nil, p.h)
					dt, _ := dev.Store().AppendPageTable(nil, p.d)
					for l := range layers {
						want, err := host.ReadPages(ctx, l, ht)
						if err != nil {
							t.Fatal(err)
						}
						got, err := dev.ReadPages(ctx, l, dt)
						if err != nil {
							t.Fatal(err)
						}
						for lp := range ht {
							valid := min(s, n-lp*s)
							for h := range kvh {
								blk := (lp*kvh + h) * s * d
								for i := range valid * d {
									if got.K[blk+i] != c.q(want.K[blk+i]) || got.V[blk+i] != c.q(want.V[blk+i]) {
										t.Fatalf("%s: seq %d layer %d page %d head %d elem %d: K/V %v/%v, host %v/%v", what, p.h, l, lp, h, i, got.K[blk+i], got.V[blk+i], want.K[blk+i], want.V[blk+i])
									}
								}
								rec := (lp*kvh + h) * 2 * d
								for j := range 2 * d {
									if got.Summary[rec+j] != c.q(want.Summary[rec+j]) {
										t.Fatalf("%s: seq %d layer %d page %d (%d valid) head %d summary %d: %v, host %v", what, p.h, l, lp, valid, h, j, got.Summary[rec+j], want.Summary[rec+j])
									}
								}
							}
						}
					}
				}
			}
			appendN := func(p pair, n int) {
				t.Helper()
				for l := range layers {
					k, v := make([]float32, n*kvh*d), make([]float32, n*kvh*d)
					for i := range k {
						k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
					}
					if err := host.Append(p.h, l, k, v); err != nil {
						t.Fatal(err)
					}
					if err := dev.Append(p.d, l, k, v); err != nil {
						t.Fatal(err)
					}
				}
			}
			both := func(f func(*shard.Shard, pagestore.SeqID) error, p pair) {
				t.Helper()
				if err := f(host, p.h); err != nil {
					t.Fatal(err)
				}
				if err := f(dev, p.d); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range []int{1, 15, 16, 17} {
				p := pair{host.Store().Create(), dev.Store().Create()}
				live = append(live, p)
				appendN(p, n)
			}
			check("tails 1/15/16/17")
			root := live[3]
			appendN(root, 40) // 57 tokens: a prefill across pages
			check("prefill")
			var child pair
			if child.h, err = host.Fork(root.h); err != nil {
				t.Fatal(err)
			}
			if child.d, err = dev.Fork(root.d); err != nil {
				t.Fatal(err)
			}
			live = append(live, child)
			appendN(child, 1) // copy-on-write of the shared tail
			appendN(root, 3)  // and in the other branch
			check("fork")
			both(func(sh *shard.Shard, id pagestore.SeqID) error { return sh.Rollback(id, 5) }, child) // across a page
			both(func(sh *shard.Shard, id pagestore.SeqID) error { return sh.Rollback(id, 2) }, root)  // inside a page
			check("rollback")
			var twin pair
			if twin.h, err = host.Fork(child.h); err != nil {
				t.Fatal(err)
			}
			if twin.d, err = dev.Fork(child.d); err != nil {
				t.Fatal(err)
			}
			live = append(live, twin)
			both(func(sh *shard.Shard, id pagestore.SeqID) error { return sh.Rollback(id, 3) }, twin) // shared tail
			check("rollback of a shared tail")
			for _, p := range live[:3] {
				both(func(sh *shard.Shard, id pagestore.SeqID) error { return sh.Release(id) }, p)
			}
			live = live[3:]
			appendN(twin, 30) // recycles the released pages
			check("recycle")
		})
	}
}

// TestFusedStepOnDevice: on a DeviceResident shard (pages and page tables
// on the GPU, bf16) a step fused into one call (score -> threshold top-K
// with tile maxima when the candidates start at page 0 -> attention, the
// page list gathered from the device tables) gives the outputs of the same
// step run as three calls, over a ragged batch with tail lengths 1/15/16/17
// and long rows, both GQA modes, with and without a sink page; and the
// engine's ranked candidates (kernels.Ranker) at CP 2 give the phased
// engine's outputs.
func TestFusedStepOnDevice(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	const qh, kvh, d, s = 32, 8, 128, 16
	rng := rand.New(rand.NewPCG(12, 13))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	closeTo := func(what string, a, b []float32) {
		t.Helper()
		for i := range a {
			if math.Abs(float64(a[i]-b[i])) > 1e-5*max(1, math.Abs(float64(a[i]))) {
				t.Fatalf("%s: element %d: fused %v, phased %v", what, i, a[i], b[i])
			}
		}
	}
	for _, gqa := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
		for _, sink := range []int{0, 1} {
			pol := plan.DefaultPolicy()
			pol.DenseLayers, pol.GQA, pol.SinkPages, pol.BudgetTokens = 0, gqa, sink, 512
			sh, err := shard.New(shard.Config{Store: pagestore.Config{Layers: 1, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 4000},
				Policy: pol, DeviceResident: true}, b)
			if err != nil {
				t.Fatal(err)
			}
			var reqs []shard.SeqStep
			for _, n := range []int{1, 15, 16, 17, 3000, 20000 + 5} {
				id := sh.Store().Create()
				if err := sh.Append(id, 0, vec(n*kvh*d), vec(n*kvh*d)); err != nil {
					t.Fatal(err)
				}
				reqs = append(reqs, shard.SeqStep{Seq: id, Q: vec(qh * d)})
			}
			var fused, phased shard.StepResult
			if err := sh.Step(ctx, 0, reqs, shard.StepOptions{Phased: true}, &phased); err != nil {
				t.Fatal(err)
			}
			if err := sh.Step(ctx, 0, reqs, shard.StepOptions{}, &fused); err != nil {
				t.Fatal(err)
			}
			if fused.Time.Fused == 0 {
				t.Fatal("the step did not fuse")
			}
			name := fmt.Sprintf("%v sink %d", gqa, sink)
			closeTo(name+" o", fused.O, phased.O)
			closeTo(name+" lse", fused.LSE, phased.LSE)
			sh.Close()
		}
	}
	// Two CP ranks: each ranks its candidates in one call.
	cfg := engine.DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 1, qh, kvh, d, s
	cfg.CP, cfg.TP, cfg.CapacityPages = 2, 1, 2000
	cfg.Policy.DenseLayers, cfg.Policy.BudgetTokens = 0, 512
	cfg.Backend, cfg.DeviceResident = b, true
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var reqs []engine.Request
	for _, n := range []int{17, 9000, 30001} {
		id, err := e.Create(plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Append(id, 0, vec(n*kvh*d), vec(n*kvh*d)); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, engine.Request{Seq: id, Q: vec(qh * d)})
	}
	var ranked, phased engine.Result
	if err := e.Step(ctx, 0, reqs, engine.StepOptions{Phased: true}, &phased); err != nil {
		t.Fatal(err)
	}
	if err := e.Step(ctx, 0, reqs, engine.StepOptions{}, &ranked); err != nil {
		t.Fatal(err)
	}
	if ranked.Time.TopK != 0 || phased.Time.TopK == 0 {
		t.Fatalf("top-K times %v (ranked) and %v (phased): the ranked step ran a separate top-K", ranked.Time.TopK, phased.Time.TopK)
	}
	closeTo("cp 2 o", ranked.O, phased.O)
	closeTo("cp 2 lse", ranked.LSE, phased.LSE)
}
