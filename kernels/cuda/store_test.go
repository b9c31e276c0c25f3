//go:build cuda

package cuda

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
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
		dt DType
		q  func(float32) float32
	}{{F32, func(x float32) float32 { return x }}, {BF16, backendtest.RoundBF16}, {F16, backendtest.RoundF16}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			b := newBackend(t, c.dt)
			defer b.Close()
			cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
			defer cpu.Close()
			cfg := shard.Config{Store: pagestore.Config{Layers: layers, KVHeads: kvh, HeadDim: d, PageSize: s, Capacity: 24}, QHeads: qh, Policy: shard.DefaultPolicy()}
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
