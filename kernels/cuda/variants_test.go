//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/plan"
)

// TestKernelVariants reaches the kernel variants the conformance shapes miss:
// score128 g1/g2/g8, attendp for 16-bit storage (S in 17..32), attendp f32 at
// S*D = 3072..4096, attends16 d64 with S > 1, generic attend with G = 32
// (1024-thread blocks) and D = 256, and the reduce's REDUCE_CAP loop.
func TestKernelVariants(t *testing.T) {
	shapes := []kernels.Shape{
		{QHeads: 8, KVHeads: 8, HeadDim: 128, PageSize: 16},  // score128 g1
		{QHeads: 16, KVHeads: 8, HeadDim: 128, PageSize: 16}, // score128 g2
		{QHeads: 32, KVHeads: 4, HeadDim: 128, PageSize: 16}, // score128 g8
		{QHeads: 8, KVHeads: 2, HeadDim: 128, PageSize: 32},  // attendp d128 S=32: 48 KiB+ dynamic smem
		{QHeads: 8, KVHeads: 2, HeadDim: 128, PageSize: 24},  // attendp f32 d128 S=24: 48 KiB + 768 static
		{QHeads: 8, KVHeads: 2, HeadDim: 64, PageSize: 32},   // attendp d64 S=32
		{QHeads: 8, KVHeads: 2, HeadDim: 64, PageSize: 7},    // attends16 d64, odd S
		{QHeads: 32, KVHeads: 1, HeadDim: 32, PageSize: 16},  // G = 32: 1024-thread attend blocks
		{QHeads: 4, KVHeads: 2, HeadDim: 256, PageSize: 16},  // D = 256
	}
	for _, c := range []struct {
		dt plan.DType
		q  func(float32) float32
	}{{plan.Float32, nil}, {plan.BFloat16, backendtest.RoundBF16}, {plan.Float16, backendtest.RoundF16}} {
		b, err := New(Config{DType: c.dt, AttendChunk: 1})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(21, uint64(c.dt)))
		for _, s := range shapes {
			lens := []int{1, s.PageSize + 1, 5*s.PageSize - 1, 0}
			if s.HeadDim == 32 {
				lens = append(lens, 2100*s.PageSize+3) // > REDUCE_CAP items in one row
			}
			f := backendtest.NewFixtureQ(rng, s, lens, c.q)
			checkAgainstRef(t, b, fmt.Sprint(c.dt), s, f)
		}
		b.Close()
	}
}

// checkAgainstRef checks Score (both GQA modes) and dense Attend of b on f
// against the float64 references of the fixture's stored data: scores to
// 1e-4, outputs and lse to 2e-4 relative.
func checkAgainstRef(t *testing.T, b *Backend, name string, s kernels.Shape, f *backendtest.Fixture) {
	t.Helper()
	ctx := context.Background()
	for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
		rows := s.Rows(mode)
		sc := make([]float32, len(f.Batch.Pages)*rows)
		if err := b.Score(ctx, s, f.Layer, &f.Batch, f.Q, mode, sc); err != nil {
			t.Fatalf("%s %+v %v score: %v", name, s, mode, err)
		}
		for seq := range f.Lens {
			np := f.Batch.NumPages(seq)
			for r := range rows {
				for p := range np {
					want := math.Inf(-1)
					if mode == kernels.PerHead {
						want = f.RefScore(seq, p, r)
					} else {
						for h := r * s.Group(); h < (r+1)*s.Group(); h++ {
							want = max(want, f.RefScore(seq, p, h))
						}
					}
					got := sc[f.Batch.ScoreOffset(seq, rows)+r*np+p]
					if math.Abs(float64(got)-want) > 1e-4*max(1, math.Abs(want)) {
						t.Fatalf("%s %+v %v seq %d row %d page %d: score %v want %v", name, s, mode, seq, r, p, got, want)
					}
				}
			}
		}
		l := backendtest.DenseLists(f, mode)
		o := make([]float32, len(f.Q))
		lse := make([]float32, len(f.Lens)*s.QHeads)
		if err := b.Attend(ctx, s, f.Layer, &f.Batch, f.Q, l, o, lse); err != nil {
			t.Fatalf("%s %+v %v attend: %v", name, s, mode, err)
		}
		for seq := range f.Lens {
			for h := range s.QHeads {
				r := h / s.Group()
				if mode == kernels.PerHead {
					r = h
				}
				i := seq*rows + r
				wo, wl := f.RefAttend(seq, h, l.Pages[l.Indptr[i]:l.Indptr[i+1]])
				gl := float64(lse[seq*s.QHeads+h])
				if math.IsInf(wl, -1) != math.IsInf(gl, -1) || (!math.IsInf(wl, -1) && math.Abs(gl-wl) > 2e-4*max(1, math.Abs(wl))) {
					t.Fatalf("%s %+v %v seq %d head %d: lse %v want %v", name, s, mode, seq, h, gl, wl)
				}
				for j := range s.HeadDim {
					got := float64(o[(seq*s.QHeads+h)*s.HeadDim+j])
					if math.IsNaN(got) || math.Abs(got-wo[j]) > 2e-4*max(1, math.Abs(wo[j])) {
						t.Fatalf("%s %+v %v seq %d head %d dim %d: o %v want %v", name, s, mode, seq, h, j, got, wo[j])
					}
				}
			}
		}
	}
}

// TestMMAKernels checks the tensor-core kernels of mma.cu (16-bit storage,
// S = 16) against the float64 references at the strict tolerances of
// checkAgainstRef: the hi + lo split of the query-side operands and of the
// probabilities must keep them at fp32 accuracy. Shapes cover G = 1, 4, 8
// (rows g only) and 16 (rows g and g + 8), D = 64 and 128; lengths cover
// the tail lengths 1, 15, 16, 17 and a long row; AttendChunk 1 leaves three
// of four warps without a page, 64 gives each warp a 16-page pipeline; and
// every tuning variant runs once.
func TestMMAKernels(t *testing.T) {
	shapes := []kernels.Shape{
		{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16},
		{QHeads: 32, KVHeads: 4, HeadDim: 128, PageSize: 16},
		{QHeads: 32, KVHeads: 2, HeadDim: 128, PageSize: 16},
		{QHeads: 8, KVHeads: 8, HeadDim: 128, PageSize: 16},
		{QHeads: 32, KVHeads: 8, HeadDim: 64, PageSize: 16},
		{QHeads: 16, KVHeads: 1, HeadDim: 64, PageSize: 16},
	}
	lens := []int{1, 15, 16, 17, 70*16 + 5, 0, 33}
	type run struct {
		dt            plan.DType
		q             func(float32) float32
		chunk         int
		attend, score string
	}
	runs := []run{
		{plan.BFloat16, backendtest.RoundBF16, 1, "", ""}, {plan.BFloat16, backendtest.RoundBF16, 64, "", ""}, {plan.BFloat16, backendtest.RoundBF16, 0, "", ""},
		{plan.Float16, backendtest.RoundF16, 1, "", ""}, {plan.Float16, backendtest.RoundF16, 64, "", ""},
		{plan.BFloat16, backendtest.RoundBF16, 0, "", "quest_scoremma_bf16_d128_u4"},
	}
	for _, v := range []string{"w4s2", "w8s2", "w2s3", "w4s4"} {
		runs = append(runs, run{plan.BFloat16, backendtest.RoundBF16, 64, "quest_attendmma_bf16_d128_" + v, ""}, run{plan.BFloat16, backendtest.RoundBF16, 3, "quest_attendmma_bf16_d128_" + v, ""})
	}
	for i, r := range runs {
		b, err := New(Config{DType: r.dt, AttendChunk: r.chunk, AttendKernel: r.attend, ScoreKernel: r.score})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(99, uint64(i)))
		for _, s := range shapes {
			if (r.attend != "" || r.score != "") && (s.HeadDim != 128 || s.Group() > 8) {
				continue
			}
			if !useMMA(s, r.dt) {
				t.Fatalf("%+v %v does not take the tensor-core path", s, r.dt)
			}
			f := backendtest.NewFixtureQ(rng, s, lens, r.q)
			checkAgainstRef(t, b, fmt.Sprintf("%v chunk %d %s %s", r.dt, r.chunk, r.attend, r.score), s, f)
		}
		b.Close()
	}
}

// TestScoreTileMaxima runs a Quest step on the device as the benchmark
// does: the tensor-core score kernel with tile maxima, the threshold top-K
// that reads them and the attention over its lists, both launched as
// programmatic dependents: every tile maximum equals the max of its (up
// to) 8 scores, the top-K rows (each the whole row or the row without its
// tail page, so the last tile is partial or covers an excluded score)
// equal a full sort of the scores, and the attention over each list equals
// the float64 reference, in both GQA modes and on a ragged batch.
func TestScoreTileMaxima(t *testing.T) {
	for _, fp8 := range []bool{false, true} {
		t.Run(fmt.Sprintf("fp8=%v", fp8), func(t *testing.T) {
			b := newBackend(t, plan.BFloat16)
			if fp8 { // the tensor-core fp8 score kernel (quest_score8mma_*)
				b.Close()
				b = newFP8Backend(t, plan.BFloat16, 0)
			}
			defer b.Close()
			testScoreTileMaxima(t, b)
		})
	}
}

func testScoreTileMaxima(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, s := range []kernels.Shape{{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}, {QHeads: 32, KVHeads: 2, HeadDim: 64, PageSize: 16}} {
		f := backendtest.NewFixtureQ(rng, s, []int{16*3000 + 5, 16 * 64, 17, 16*1001 + 16, 1}, backendtest.RoundBF16)
		for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			rows := s.Rows(mode)
			nsc := len(f.Batch.Pages) * rows
			scores := make([]float32, nsc)
			tmax := make([]float32, nsc)
			var plan kernels.TopKPlan
			off := 0
			for seq := range f.Lens {
				np := f.Batch.NumPages(seq)
				for r := range rows {
					n := np // odd rows leave the tail page out (of rows that have another)
					if np > 1 {
						n -= r % 2
					}
					k := []int{1, 7, 64, 255, 512}[(seq+r)%5]
					plan.Add(f.Batch.ScoreOffset(seq, rows)+r*np, n, 0, k, off)
					off += min(k, n)
				}
			}
			if !topkThr(&plan) {
				t.Fatal("plan does not take the threshold top-K")
			}
			out := make([]int32, off)
			perHead, heads := uint64(0), s.Group()
			if mode == kernels.PerHead {
				perHead, heads = 1, 1
			}
			// Attention work items over the top-K lists (16 pages each,
			// so that rows have at most 32 items and the merge is
			// fused), built before the pipeline runs.
			var items [5][]int32
			minItems, maxItems := math.MaxInt, 0
			for i := range plan.Rows() {
				ni := (min(int(plan.K[i]), int(plan.N[i])) + 15) / 16
				minItems, maxItems = min(minItems, ni), max(maxItems, ni)
				items[4] = append(items[4], int32(len(items[0])))
				m := min(int(plan.K[i]), int(plan.N[i]))
				for p := 0; p < m; p += 16 {
					items[0] = append(items[0], int32(i/rows))
					items[1] = append(items[1], int32(i%rows))
					items[2] = append(items[2], plan.OutOff[i]+int32(p))
					items[3] = append(items[3], plan.OutOff[i]+int32(min(p+16, m)))
				}
			}
			items[4] = append(items[4], int32(len(items[0])))
			o := make([]float32, len(f.Q))
			lse := make([]float32, len(f.Lens)*s.QHeads)
			err := b.do(context.Background(), func() error {
				dl, err := b.layer(s, f.Layer, true)
				if err != nil {
					return err
				}
				ind, err := upload(b, "t.ind", f.Batch.Indptr)
				if err != nil {
					return err
				}
				pg, err := upload(b, "t.pages", f.Batch.Pages)
				if err != nil {
					return err
				}
				qp, err := upload(b, "t.q", f.Q)
				if err != nil {
					return err
				}
				sp, err := b.buf("t.scores", int64(nsc)*4)
				if err != nil {
					return err
				}
				tp, err := b.buf("t.tmax", int64(nsc)*4)
				if err != nil {
					return err
				}
				maxPages := 0
				for i := range f.Lens {
					maxPages = max(maxPages, f.Batch.NumPages(i))
				}
				var ptrs [5]cu.DevicePtr
				for i, a := range [][]int32{plan.ScoreOff, plan.N, plan.Base, plan.K, plan.OutOff} {
					if ptrs[i], err = upload(b, fmt.Sprintf("t.plan%d", i), a); err != nil {
						return err
					}
				}
				var ip [5]cu.DevicePtr
				for i, a := range items {
					if ip[i], err = upload(b, fmt.Sprintf("t.items%d", i), a); err != nil {
						return err
					}
				}
				last, err := upload(b, "t.last", f.Batch.LastLen)
				if err != nil {
					return err
				}
				oo, err := b.buf("t.o", int64(len(o))*4)
				if err != nil {
					return err
				}
				ol, err := b.buf("t.lse", int64(len(lse))*4)
				if err != nil {
					return err
				}
				op, err := b.buf("t.out", int64(off)*4)
				if err != nil {
					return err
				}
				if err := cu.Synchronize(); err != nil { // the uploads are done before the pipeline
					return err
				}
				wrote, err := b.launchScore(dl, s, len(f.Lens), maxPages, ind, pg, qp, sp, tp, perHead)
				if err != nil {
					return err
				}
				if !wrote {
					return fmt.Errorf("score kernel did not write tile maxima")
				}
				// As in the Quest step: top-K as a programmatic
				// dependent of the score kernel.
				if err := b.launchTopK(&plan, sp, tp, ptrs, op, true); err != nil {
					return err
				}
				if err := b.launchAttendReduce(dl, s, heads, perHead, attendArgs{
					ind: ind, pg: pg, last: last, q: qp, iSeq: ip[0], iRow: ip[1], iLo: ip[2], iHi: ip[3], lists: op,
					rowItem: ip[4], o: oo, lse: ol, items: len(items[0]), nrows: plan.Rows(), minItemsPerRow: minItems, maxItemsPerRow: maxItems,
				}, true); err != nil {
					return err
				}
				if err := download(b, o, oo); err != nil {
					return err
				}
				if err := download(b, lse, ol); err != nil {
					return err
				}
				if err := download(b, scores, sp); err != nil {
					return err
				}
				if err := download(b, tmax, tp); err != nil {
					return err
				}
				return download(b, out, op)
			})
			if err != nil {
				t.Fatal(err)
			}
			for seq := range f.Lens {
				np := f.Batch.NumPages(seq)
				for r := range rows {
					row := f.Batch.ScoreOffset(seq, rows) + r*np
					for tl := 0; tl*8 < np; tl++ {
						want := float32(math.Inf(-1))
						for p := tl * 8; p < min(np, tl*8+8); p++ {
							want = max(want, scores[row+p])
						}
						if got := tmax[row+tl]; got != want {
							t.Fatalf("%+v %v seq %d row %d tile %d: max %v, want %v", s, mode, seq, r, tl, got, want)
						}
					}
				}
			}
			for i := range plan.Rows() {
				n, k := int(plan.N[i]), int(plan.K[i])
				want := backendtest.RefTopK(scores[plan.ScoreOff[i]:][:n], k)
				got := out[plan.OutOff[i]:][:min(k, n)]
				for j := range want {
					if got[j] != want[j] {
						t.Fatalf("%+v %v top-K row %d (n=%d k=%d): entry %d is %d, want %d", s, mode, i, n, k, j, got[j], want[j])
					}
				}
				// Attention over the row's list, launched after the
				// top-K as a programmatic dependent.
				seq, r := i/rows, i%rows
				h0, h1 := r*s.Group(), (r+1)*s.Group()
				if mode == kernels.PerHead {
					h0, h1 = r, r+1
				}
				for h := h0; h < h1; h++ {
					wo, wl := f.RefAttend(seq, h, got)
					gl := float64(lse[seq*s.QHeads+h])
					if math.Abs(gl-wl) > 2e-4*max(1, math.Abs(wl)) {
						t.Fatalf("%+v %v seq %d head %d: lse %v, want %v", s, mode, seq, h, gl, wl)
					}
					for j := range s.HeadDim {
						g := float64(o[(seq*s.QHeads+h)*s.HeadDim+j])
						if math.IsNaN(g) || math.Abs(g-wo[j]) > 2e-4*max(1, math.Abs(wo[j])) {
							t.Fatalf("%+v %v seq %d head %d dim %d: o %v, want %v", s, mode, seq, h, j, g, wo[j])
						}
					}
				}
			}
		}
	}
}

// TestAllocsPerCall checks that the Go allocations of a Score, TopK,
// Attend or fused Step call do not grow with the batch (work items, launches and uploads
// reuse the device goroutine's buffers; kernel parameters and uploads go
// through C and pinned memory) and logs them.
func TestAllocsPerCall(t *testing.T) {
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	ctx := context.Background()
	s := kernels.Shape{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}
	rng := rand.New(rand.NewPCG(8, 8))
	count := func(lens []int) (score, topk, attend, step float64) {
		f := backendtest.NewFixtureQ(rng, s, lens, backendtest.RoundBF16)
		rows := s.Rows(kernels.GroupMax)
		sc := make([]float32, len(f.Batch.Pages)*rows)
		l := backendtest.DenseLists(f, kernels.GroupMax)
		o := make([]float32, len(f.Q))
		lse := make([]float32, len(f.Lens)*s.QHeads)
		var plan kernels.TopKPlan
		off := 0
		for seq := range f.Lens {
			np := f.Batch.NumPages(seq)
			for r := range rows {
				plan.Add(f.Batch.ScoreOffset(seq, rows)+r*np, np, 0, 4, off)
				off += min(4, np)
			}
		}
		out := make([]int32, off)
		run := func(fn func() error) float64 {
			return testing.AllocsPerRun(10, func() {
				if err := fn(); err != nil {
					t.Fatal(err)
				}
			})
		}
		score = run(func() error { return b.Score(ctx, s, f.Layer, &f.Batch, f.Q, kernels.GroupMax, sc) })
		topk = run(func() error { return b.TopK(ctx, sc, &plan, out) })
		attend = run(func() error { return b.Attend(ctx, s, f.Layer, &f.Batch, f.Q, l, o, lse) })
		ks := make([]int, len(lens))
		for i := range ks {
			ks[i] = 8
		}
		splan, sl := backendtest.StepLists(f, kernels.GroupMax, 0, ks)
		step = run(func() error { return b.Step(ctx, s, f.Layer, &f.Batch, f.Q, splan, sl, o, lse) })
		return
	}
	s1, k1, a1, st1 := count([]int{100, 2000})
	// (Host-array pools go up in 2^24-float chunks, one launch each; both
	// batches fit one chunk.)
	s2, k2, a2, st2 := count([]int{100, 2000, 17, 400, 1, 300, 500, 16, 900, 300, 64, 250})
	t.Logf("allocations per call, 2 / 12 sequences: score %v / %v, top-K %v / %v, attend %v / %v, step %v / %v", s1, s2, k1, k2, a1, a2, st1, st2)
	if s2 > s1 || k2 > k1 || a2 > a1 || st2 > st1 {
		t.Errorf("allocations grow with the batch: score %v -> %v, top-K %v -> %v, attend %v -> %v, step %v -> %v", s1, s2, k1, k2, a1, a2, st1, st2)
	}
}
