//go:build cuda

package cuda

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

func randF32(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = 2*rng.Float32() - 1
	}
	return x
}

// TestSlotStoreMatchesFake runs the same random slot-pool operations
// (token writes across pages, of varying magnitude, rescans, slot copies,
// saves to and loads from the host tier) on the GPU and on
// backendtest.FakeDevice, whose slot operations are written independently
// on the CPU, for float32 pools and fp8 records (quantized on append,
// codes and scales moved as the tier's payload): every slot's K/V (fp8:
// decoded), every page's summaries and every tier payload must be
// bit-identical after each round.
func TestSlotStoreMatchesFake(t *testing.T) {
	for _, dt := range []plan.DType{plan.Float32, plan.FP8} {
		t.Run(dt.String(), func(t *testing.T) { testSlotStoreMatchesFake(t, dt) })
	}
}

func testSlotStoreMatchesFake(t *testing.T, dt plan.DType) {
	ctx := context.Background()
	const layers, kvh, d, s, pages, slots = 2, 2, 64, 16, 40, 12
	b := newBackend(t, dt)
	defer b.Close()
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	f := backendtest.FakeDevice{CPU: cpu, DType: dt}
	// fp8: 4112 bytes a layer, whose V codes start at 2056 (the move
	// kernel's 4-byte path) and K codes at 0 (its 16-byte path).
	payload := tier.PagePayloadBytes(layers, plan.Geometry{KVHeads: kvh, HeadDim: d, PageSize: s, DType: dt})
	var gp, fp []any
	for range layers {
		g, err := b.NewSlotPool(ctx, pages, slots, kvh, d, s)
		if err != nil {
			t.Fatal(err)
		}
		defer b.FreePool(ctx, g)
		x, err := f.NewSlotPool(ctx, pages, slots, kvh, d, s)
		if err != nil {
			t.Fatal(err)
		}
		gp, fp = append(gp, g), append(fp, x)
	}
	gt, err := b.NewHostTier(ctx, pages, payload)
	if err != nil {
		t.Fatal(err)
	}
	defer gt.Close()
	ft, _ := f.NewHostTier(ctx, pages, payload)
	all := make([]int32, pages)
	for i := range all {
		all[i] = int32(i)
	}
	for l := range layers {
		if err := b.Rescan(ctx, gp[l], all, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Rescan(ctx, fp[l], all, 0); err != nil {
			t.Fatal(err)
		}
	}
	written := make([]bool, pages)
	rng := rand.New(rand.NewPCG(9, 9))
	for round := range 60 {
		switch op := rng.IntN(5); op {
		case 0, 1: // write tokens across 1-3 pages
			slot := rng.IntN(s)
			n := 1 + rng.IntN(2*s)
			np := (slot + n + s - 1) / s
			// Distinct pages in distinct slots, as the store hands out.
			pg, sl := make([]int32, np), make([]int32, np)
			pp, sp := rng.Perm(pages), rng.Perm(slots)
			for i := range pg {
				pg[i], sl[i] = int32(pp[i]), int32(sp[i])
			}
			l := rng.IntN(layers)
			k, v := randF32(rng, n*kvh*d), randF32(rng, n*kvh*d)
			mag := []float32{0.25, 1, 4}[rng.IntN(3)] // fp8: scales grow (re-encoding) or not
			for i := range k {
				k[i], v[i] = k[i]*mag, v[i]*mag
			}
			if err := b.WriteSlotTokens(ctx, gp[l], pg, sl, slot, k, v); err != nil {
				t.Fatal(err)
			}
			if err := f.WriteSlotTokens(ctx, fp[l], pg, sl, slot, k, v); err != nil {
				t.Fatal(err)
			}
		case 2: // rescan or copy
			p, q := int32(rng.IntN(pages)), int32(rng.IntN(pages))
			a, c := int32(rng.IntN(slots)), int32(rng.IntN(slots))
			l := rng.IntN(layers)
			if rng.IntN(2) == 0 {
				valid := rng.IntN(s + 1)
				if err := b.RescanSlot(ctx, gp[l], p, a, valid); err != nil {
					t.Fatal(err)
				}
				if err := f.RescanSlot(ctx, fp[l], p, a, valid); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := b.CopySlot(ctx, gp[l], p, q, a, c); err != nil {
					t.Fatal(err)
				}
				if err := f.CopySlot(ctx, fp[l], p, q, a, c); err != nil {
					t.Fatal(err)
				}
			}
		default: // saves then loads, a few of each
			var saves, loads []kernels.SlotMove
			for range rng.IntN(4) {
				m := kernels.SlotMove{Page: int32(rng.IntN(pages)), Slot: int32(rng.IntN(slots))}
				saves = append(saves, m)
				written[m.Page] = true
			}
			for range rng.IntN(4) {
				if p := int32(rng.IntN(pages)); written[p] {
					loads = append(loads, kernels.SlotMove{Page: p, Slot: int32(rng.IntN(slots))})
				}
			}
			if err := b.MoveSlots(ctx, gp, gt, saves, loads); err != nil {
				t.Fatal(err)
			}
			if err := f.MoveSlots(ctx, fp, ft, saves, loads); err != nil {
				t.Fatal(err)
			}
		}
		for l := range layers {
			for sl := range int32(slots) {
				gk, gv, err := b.ReadSlotKV(ctx, gp[l], sl)
				if err != nil {
					t.Fatal(err)
				}
				fk, fv, _ := f.ReadSlotKV(ctx, fp[l], sl)
				if !slices.Equal(gk, fk) || !slices.Equal(gv, fv) {
					t.Fatalf("round %d: layer %d slot %d K/V differ", round, l, sl)
				}
			}
			gs, err := b.ReadPages(ctx, gp[l], all)
			if err != nil {
				t.Fatal(err)
			}
			fs, _ := f.ReadPages(ctx, fp[l], all)
			if !slices.Equal(gs.Summary, fs.Summary) || len(gs.K) != 0 {
				t.Fatalf("round %d: layer %d summaries differ (or K read from a slot pool)", round, l)
			}
		}
		gb, fb := make([]byte, payload), make([]byte, payload)
		for p := range pages {
			gerr, ferr := gt.Read(ctx, p, gb), ft.Read(ctx, p, fb)
			if (gerr == nil) != (ferr == nil) || (gerr == nil && !bytes.Equal(gb, fb)) {
				t.Fatalf("round %d: tier page %d differs (errors %v, %v)", round, p, gerr, ferr)
			}
		}
	}
}

// TestDeviceOffloadBitIdentical runs random appends, decode steps over
// every layer (ragged batches, per-sequence budgets, new tokens), forks,
// rollbacks and releases on two DeviceResident shards sharing one GPU:
// one holding every page on the device, one keeping the K/V of 70 pages
// (of up to about 400) on the device, enough for every step to
// attend in one pass, and the others in the mapped host tier. Every
// step's o and lse must be bit-identical, for bf16, f32 and fp8 pools
// (fp8 records: quantized on the device by both, moved to the tier and
// back as stored), with fp8 summaries too, with and without prefetch.
func TestDeviceOffloadBitIdentical(t *testing.T) {
	const layers, qh, kvh, d, s = 2, 8, 2, 64, 16
	for _, c := range []struct {
		dt       plan.DType
		budget   int
		prefetch int
		ev       pagestore.Eviction
		sum      plan.SummaryDType
	}{{plan.BFloat16, 70, 0, pagestore.EvictLRU, plan.SummaryKV}, {plan.BFloat16, 70, 6, pagestore.EvictScore, plan.SummaryKV},
		{plan.Float32, 70, 4, pagestore.EvictLRU, plan.SummaryKV}, {plan.FP8, 70, 0, pagestore.EvictLRU, plan.SummaryKV},
		{plan.FP8, 70, 5, pagestore.EvictScore, plan.SummaryFP8}, {plan.BFloat16, 70, 0, pagestore.EvictLRU, plan.SummaryFP8}} {
		t.Run(fmt.Sprintf("%v_sum%v_budget%d_prefetch%d_%v", c.dt, c.sum, c.budget, c.prefetch, c.ev), func(t *testing.T) {
			ctx := context.Background()
			b, err := New(Config{DType: c.dt, SummaryDType: c.sum})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			pol := plan.DefaultPolicy()
			pol.PageSize, pol.BudgetTokens, pol.DenseLayers, pol.SinkPages, pol.LocalPages = s, 4*s, 0, 1, 1
			st := pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 500}
			ref, err := shard.New(shard.Config{Store: st, Policy: pol, DeviceResident: true}, b)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			st.DeviceBudget, st.Eviction = c.budget, c.ev
			off, err := shard.New(shard.Config{Store: st, Policy: pol, DeviceResident: true, PrefetchPages: c.prefetch}, b)
			if err != nil {
				t.Fatal(err)
			}
			defer off.Close()
			rng := rand.New(rand.NewPCG(70, 1)) // the same operations for every configuration
			ids := map[pagestore.SeqID]pagestore.SeqID{}
			var live []pagestore.SeqID
			appendBoth := func(id pagestore.SeqID, n int) {
				for l := range layers {
					k, v := randF32(rng, n*kvh*d), randF32(rng, n*kvh*d)
					if err := ref.Append(id, l, k, v); err != nil {
						t.Fatal(err)
					}
					if err := off.Append(ids[id], l, k, v); err != nil {
						t.Fatal(err)
					}
				}
			}
			steps := 0
			for op := range 120 {
				switch r := rng.IntN(10); {
				case len(live) == 0 || (r == 0 && len(live) < 4):
					id := ref.Store().Create()
					ids[id] = off.Store().Create()
					appendBoth(id, []int{1, 15, 16, 17, 700, 1500}[rng.IntN(6)])
					live = append(live, id)
				case r == 1:
					appendBoth(live[rng.IntN(len(live))], 1+rng.IntN(40))
				case r == 2 && len(live) < 4:
					par := live[rng.IntN(len(live))]
					a, err := ref.Fork(par)
					if err != nil {
						t.Fatal(err)
					}
					bb, err := off.Fork(ids[par])
					if err != nil {
						t.Fatal(err)
					}
					ids[a] = bb
					live = append(live, a)
				case r == 3:
					id := live[rng.IntN(len(live))]
					if n, _ := ref.Store().Len(id); n > 1 {
						cut := 1 + rng.IntN(n-1)
						if err := ref.Rollback(id, cut); err != nil {
							t.Fatal(err)
						}
						if err := off.Rollback(ids[id], cut); err != nil {
							t.Fatal(err)
						}
					}
				case r == 4 && len(live) > 1:
					i := rng.IntN(len(live))
					if err := ref.Release(live[i]); err != nil {
						t.Fatal(err)
					}
					if err := off.Release(ids[live[i]]); err != nil {
						t.Fatal(err)
					}
					live = slices.Delete(live, i, i+1)
				default: // one decode step, every layer
					steps++
					var ra, rb []shard.SeqStep
					for _, id := range live {
						q := randF32(rng, qh*d)
						k, v := randF32(rng, kvh*d), randF32(rng, kvh*d)
						bud := []int{0, 2 * s, 6 * s}[rng.IntN(3)]
						ra = append(ra, shard.SeqStep{Seq: id, Q: q, K: k, V: v, BudgetTokens: bud})
						rb = append(rb, shard.SeqStep{Seq: ids[id], Q: q, K: k, V: v, BudgetTokens: bud})
					}
					for l := range layers {
						var want, got shard.StepResult
						if err := ref.Step(ctx, l, ra, shard.StepOptions{}, &want); err != nil {
							t.Fatal(err)
						}
						if err := off.Step(ctx, l, rb, shard.StepOptions{}, &got); err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
							t.Fatalf("op %d layer %d: outputs differ with offload (%+v)", op, l, off.OffloadStats())
						}
					}
				}
				if err := off.Store().CheckResidency(); err != nil {
					t.Fatalf("op %d: %v", op, err)
				}
			}
			stats := off.OffloadStats()
			t.Logf("%d steps: %+v hit rate %.3f", steps, stats, stats.HitRate())
			if stats.Misses == 0 || stats.Evictions == 0 || stats.WriteBacks == 0 {
				t.Fatalf("offload not exercised: %+v", stats)
			}
			if c.prefetch > 0 && stats.PrefetchIssued == 0 {
				t.Fatalf("prefetch not exercised: %+v", stats)
			}
		})
	}
}

// BenchmarkDeviceOffloadStep times one served decode layer-step (batch 1,
// Llama-3.1-8B layer shape, bf16, S 16, budget 4096 tokens) at 1M tokens
// on a DeviceResident shard holding every page, on one keeping 100% of the
// pages' K/V in its slot pool (every page resident: the fused step through
// the device's page -> slot table; fused_steps reports it) and on one
// keeping 10%, with the same query every step (after the first, every
// selected page is resident: the offload path's own cost).
func BenchmarkDeviceOffloadStep(b *testing.B) {
	const n, qh, kvh, d, s = 1 << 20, 32, 8, 128, 16
	be := newBackend(&testing.T{}, plan.BFloat16)
	defer be.Close()
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = s, 4096, 0
	pages := n / s
	for _, c := range []struct {
		pct    int
		phased bool
	}{{0, false}, {0, true}, {100, false}, {10, false}} {
		pct := c.pct
		b.Run(fmt.Sprintf("device%d%%_phased%v", pct, c.phased), func(b *testing.B) {
			st := pagestore.Config{Layers: 1, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: pages}
			if pct > 0 {
				st.DeviceBudget = pages * pct / 100
			}
			sh, err := shard.New(shard.Config{Store: st, Policy: pol, DeviceResident: true}, be)
			if err != nil {
				b.Fatal(err)
			}
			defer sh.Close()
			id := sh.Store().Create()
			rng := rand.New(rand.NewPCG(1, 1))
			k, v := make([]float32, 4096*kvh*d), make([]float32, 4096*kvh*d)
			x := uint32(12345)
			for at := 0; at < n; at += 4096 {
				for i := range k { // xorshift: the fill is not what is timed
					x ^= x << 13
					x ^= x >> 17
					x ^= x << 5
					k[i] = float32(x>>8)/(1<<23) - 1
					v[i] = float32(x&0xffff)/(1<<15) - 1
				}
				if err := sh.Append(id, 0, k, v); err != nil {
					b.Fatal(err)
				}
			}
			reqs := []shard.SeqStep{{Seq: id, Q: randF32(rng, qh*d)}}
			var res shard.StepResult
			ctx := context.Background()
			opt := shard.StepOptions{Phased: c.phased}
			if err := sh.Step(ctx, 0, reqs, opt, &res); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if err := sh.Step(ctx, 0, reqs, opt, &res); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			t := res.Time
			b.ReportMetric(float64(t.Score.Microseconds()), "score_us")
			b.ReportMetric(float64(t.Recall.Microseconds()), "recall_us")
			b.ReportMetric(float64(t.Attend.Microseconds()), "attend_us")
			b.ReportMetric(float64(t.TopK.Microseconds()), "topk_us")
			b.ReportMetric(float64(sh.OffloadStats().Fused), "fused_steps")
		})
	}
}

// TestDeviceOffloadFusedResident: an offloading DeviceResident shard whose
// slot pools hold every page runs every step fused on the GPU (score by
// page, K/V by slot through the device page -> slot table, the selected
// pages' use stamps written on the device) through random appends, forks,
// rollbacks, releases and recycled pages: every o and lse bit-identical
// to the shard holding every page, the device slot table equal to the
// store's map after every operation (CheckResidency reads it back), and
// no recall. Then a small sequence stepped fused keeps its pages resident
// while a big one spills (the device's use stamps reach the evictor
// first), and after the big one's release the steps are fused again.
func TestDeviceOffloadFusedResident(t *testing.T) {
	const layers, qh, kvh, d, s, capacity = 2, 8, 2, 64, 16, 300
	for _, dt := range []plan.DType{plan.BFloat16, plan.FP8} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx := context.Background()
			b, err := New(Config{DType: dt})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			pol := plan.DefaultPolicy()
			pol.PageSize, pol.BudgetTokens, pol.DenseLayers, pol.SinkPages, pol.LocalPages = s, 4*s, 1, 1, 1
			st := pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: capacity}
			ref, err := shard.New(shard.Config{Store: st, Policy: pol, DeviceResident: true}, b)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			st.DeviceBudget = capacity
			off, err := shard.New(shard.Config{Store: st, Policy: pol, DeviceResident: true}, b)
			if err != nil {
				t.Fatal(err)
			}
			defer off.Close()
			rng := rand.New(rand.NewPCG(71, 2))
			ids := map[pagestore.SeqID]pagestore.SeqID{}
			var live []pagestore.SeqID
			appendBoth := func(id pagestore.SeqID, n int) {
				for l := range layers {
					k, v := randF32(rng, n*kvh*d), randF32(rng, n*kvh*d)
					if err := ref.Append(id, l, k, v); err != nil {
						t.Fatal(err)
					}
					if err := off.Append(ids[id], l, k, v); err != nil {
						t.Fatal(err)
					}
				}
			}
			create := func(n int) pagestore.SeqID {
				id := ref.Store().Create()
				ids[id] = off.Store().Create()
				appendBoth(id, n)
				return id
			}
			release := func(id pagestore.SeqID) {
				if err := ref.Release(id); err != nil {
					t.Fatal(err)
				}
				if err := off.Release(ids[id]); err != nil {
					t.Fatal(err)
				}
			}
			steps := 0
			allPages := false // steps read every page of their sequences
			step := func(what string, fused bool, seqs ...pagestore.SeqID) {
				t.Helper()
				var ra, rb []shard.SeqStep
				for _, id := range seqs {
					q := randF32(rng, qh*d)
					bud := []int{0, 2 * s, 6 * s}[rng.IntN(3)]
					if allPages {
						bud = capacity * s
					}
					ra = append(ra, shard.SeqStep{Seq: id, Q: q, BudgetTokens: bud})
					rb = append(rb, shard.SeqStep{Seq: ids[id], Q: q, BudgetTokens: bud})
				}
				for l := range layers {
					var want, got shard.StepResult
					if err := ref.Step(ctx, l, ra, shard.StepOptions{}, &want); err != nil {
						t.Fatal(err)
					}
					if err := off.Step(ctx, l, rb, shard.StepOptions{}, &got); err != nil {
						t.Fatal(err)
					}
					if (got.Time.Fused != 0) != fused {
						t.Fatalf("%s layer %d: fused %v, want %v (%+v)", what, l, got.Time.Fused != 0, fused, off.OffloadStats())
					}
					if fused {
						steps++
					}
					if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
						t.Fatalf("%s layer %d: outputs differ", what, l)
					}
				}
			}
			for op := range 80 {
				switch r := rng.IntN(8); {
				case len(live) == 0:
					live = append(live, create([]int{1, 15, 16, 17, 300, 900}[rng.IntN(6)]))
				case r == 0 && len(live) < 3:
					a, err := ref.Fork(live[0])
					if err != nil {
						t.Fatal(err)
					}
					if ids[a], err = off.Fork(ids[live[0]]); err != nil {
						t.Fatal(err)
					}
					live = append(live, a)
				case r == 1:
					id := live[rng.IntN(len(live))]
					if n, _ := ref.Store().Len(id); n > 1 {
						cut := 1 + rng.IntN(n-1)
						if err := ref.Rollback(id, cut); err != nil {
							t.Fatal(err)
						}
						if err := off.Rollback(ids[id], cut); err != nil {
							t.Fatal(err)
						}
					}
				case r == 2:
					i := rng.IntN(len(live))
					release(live[i])
					live = slices.Delete(live, i, i+1)
				case r == 3:
					appendBoth(live[rng.IntN(len(live))], 1+rng.IntN(40))
				default:
					step(fmt.Sprintf("op %d", op), true, live...)
				}
				if err := off.Store().CheckResidency(); err != nil {
					t.Fatalf("op %d: %v", op, err)
				}
			}
			if st := off.OffloadStats(); steps == 0 || st.Fused != int64(steps) || st.Recalls != 0 {
				t.Fatalf("%d fused steps, stats %+v", steps, st)
			}
			for _, id := range live {
				release(id)
			}
			// The spill: capacity 300 pages, the device holds them all,
			// so the small and the big sequence are made to exceed it
			// through a second shard with a budget of 60.
			st.DeviceBudget = 60
			off2, err := shard.New(shard.Config{Store: st, Policy: pol, DeviceResident: true}, b)
			if err != nil {
				t.Fatal(err)
			}
			defer off2.Close()
			off = off2
			// As TestOffloadFusedRecency (the CPU twin): the small
			// sequence's fused steps read every one of its pages (only the
			// pages a step attends are stamped), the last of them after
			// the big sequence's first pages were admitted, so that LRU
			// must evict those before the small sequence's.
			allPages = true
			small := create(10 * s)
			step("small", true, small)
			step("small again", true, small)
			big := create(30 * s) // 40 pages for 60 slots: all resident
			step("both resident", true, small)
			appendBoth(big, 40*s) // 80 pages for 60 slots
			table, err := off.Store().AppendPageTable(nil, ids[small])
			if err != nil {
				t.Fatal(err)
			}
			for i, pg := range table {
				if off.Store().DeviceSlot(pg) < 0 {
					t.Fatalf("page %d of the small sequence (stepped fused) was evicted before the big one's", i)
				}
			}
			step("small after the spill", false, small)
			release(big)
			step("small, the big one released", true, small)
			if err := off.Store().CheckResidency(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
