package kernels_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// benchLayer builds one layer holding a single sequence of ctxLen tokens in
// pages laid out in order, with cheap pseudo-random contents.
func benchLayer(s kernels.Shape, ctxLen int) (kernels.Layer, kernels.Batch, []float32) {
	np := (ctxLen + s.PageSize - 1) / s.PageSize
	per := s.KVHeads * s.PageSize * s.HeadDim
	l := kernels.Layer{K: make([]float32, np*per), V: make([]float32, np*per), Summary: make([]float32, np*s.KVHeads*2*s.HeadDim)}
	x := uint32(12345)
	for i := range l.K {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		l.K[i] = float32(int32(x)) / (1 << 31)
		l.V[i] = float32(int32(x*2654435761)) / (1 << 31)
	}
	d := s.HeadDim
	for p := range np {
		for h := range s.KVHeads {
			rec := l.Summary[(p*s.KVHeads+h)*2*d:][:2*d]
			for j := range d {
				rec[j], rec[d+j] = 1, -1
				for t := range s.PageSize {
					k := l.K[((p*s.KVHeads+h)*s.PageSize+t)*d+j]
					rec[j], rec[d+j] = min(rec[j], k), max(rec[d+j], k)
				}
			}
		}
	}
	b := kernels.Batch{Indptr: []int32{0, int32(np)}, LastLen: []int32{int32(ctxLen - (np-1)*s.PageSize)}}
	for p := range np {
		b.Pages = append(b.Pages, int32(p))
	}
	q := make([]float32, s.QHeads*d)
	for i := range q {
		q[i] = float32(i%7) - 3
	}
	return l, b, q
}

func BenchmarkAttention(b *testing.B) {
	s := kernels.Shape{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}
	for _, ctxLen := range []int{32768, 131072} {
		l, batch, q := benchLayer(s, ctxLen)
		np := batch.NumPages(0)
		be := kernels.NewCPU(kernels.CPUConfig{})
		ctx := context.Background()
		o := make([]float32, len(q))
		lse := make([]float32, s.QHeads)
		dense := &kernels.Lists{Mode: kernels.GroupMax, Indptr: []int32{0}}
		for range s.KVHeads {
			for p := range np {
				dense.Pages = append(dense.Pages, int32(p))
			}
			dense.Indptr = append(dense.Indptr, int32(len(dense.Pages)))
		}
		kvBytes := float64(np * s.KVHeads * s.PageSize * s.HeadDim * 4 * 2)
		b.Run(fmt.Sprintf("dense/ctx=%d", ctxLen), func(b *testing.B) {
			b.SetBytes(int64(kvBytes))
			for b.Loop() {
				if err := be.Attend(ctx, s, l, &batch, q, dense, o, lse); err != nil {
					b.Fatal(err)
				}
			}
		})
		scores := make([]float32, np*s.KVHeads)
		b.Run(fmt.Sprintf("score/ctx=%d", ctxLen), func(b *testing.B) {
			b.SetBytes(int64(len(l.Summary) * 4))
			for b.Loop() {
				if err := be.Score(ctx, s, l, &batch, q, kernels.GroupMax, scores); err != nil {
					b.Fatal(err)
				}
			}
		})
		k := 2048 / s.PageSize
		var plan kernels.TopKPlan
		for h := range s.KVHeads {
			plan.Add(h*np, np-1, 0, k-1, h*k)
		}
		sel := make([]int32, s.KVHeads*k)
		b.Run(fmt.Sprintf("topk/ctx=%d", ctxLen), func(b *testing.B) {
			for b.Loop() {
				if err := be.TopK(ctx, scores, &plan, sel); err != nil {
					b.Fatal(err)
				}
			}
		})
		plan.BestFirst = true
		b.Run(fmt.Sprintf("topk-bestfirst/ctx=%d", ctxLen), func(b *testing.B) {
			for b.Loop() {
				if err := be.TopK(ctx, scores, &plan, sel); err != nil {
					b.Fatal(err)
				}
			}
		})
		plan.BestFirst = false
		sparse := &kernels.Lists{Mode: kernels.GroupMax, Indptr: []int32{0}}
		for h := range s.KVHeads {
			sparse.Pages = append(sparse.Pages, sel[h*k:h*k+k-1]...)
			sparse.Pages = append(sparse.Pages, int32(np-1))
			sparse.Indptr = append(sparse.Indptr, int32(len(sparse.Pages)))
		}
		b.Run(fmt.Sprintf("sparse/ctx=%d", ctxLen), func(b *testing.B) {
			for b.Loop() {
				if err := be.Attend(ctx, s, l, &batch, q, sparse, o, lse); err != nil {
					b.Fatal(err)
				}
			}
		})
		be.Close()
	}
}

// BenchmarkCopy measures the machine's memory bandwidth with a large copy
// (bytes read + written count as 2x SetBytes).
func BenchmarkCopy(b *testing.B) {
	src := make([]float32, 1<<27)
	dst := make([]float32, 1<<27)
	b.SetBytes(int64(len(src) * 4))
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkScore times Score over one sequence's summaries with float32
// records and with emulated fp8 records (each record encoded per call:
// the emulation's cost, not an fp8 store's). Bytes are the float32
// records read.
func BenchmarkScore(b *testing.B) {
	s := kernels.Shape{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}
	l, batch, q := benchLayer(s, 131072)
	out := make([]float32, len(batch.Pages)*s.KVHeads)
	for _, sd := range []plan.SummaryDType{plan.SummaryKV, plan.SummaryFP8} {
		be := kernels.NewCPU(kernels.CPUConfig{SummaryDType: sd})
		b.Run(fmt.Sprintf("summary=%v/ctx=131072", sd), func(b *testing.B) {
			b.SetBytes(int64(len(l.Summary) * 4))
			for b.Loop() {
				if err := be.Score(context.Background(), s, l, &batch, q, kernels.GroupMax, out); err != nil {
					b.Fatal(err)
				}
			}
		})
		be.Close()
	}
}

// BenchmarkTopKOrder times the CPU top-K of the selection exchange's
// shape at 2 CP ranks, batch 16: 128 rows (16 sequences x 8 KV heads),
// each the best 128 of a rank's 4096 pages (normal scores), written
// ascending or best first (TopKPlan.BestFirst).
func BenchmarkTopKOrder(b *testing.B) {
	const rows, n, k = 128, 4096, 128
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1}) // one core: less of the host's noise
	defer be.Close()
	rng := rand.New(rand.NewPCG(30, 4))
	scores := make([]float32, rows*n)
	for i := range scores {
		scores[i] = float32(rng.NormFloat64())
	}
	var plan kernels.TopKPlan
	for r := range rows {
		plan.Add(r*n, n, 0, k, r*k)
	}
	out := make([]int32, rows*k)
	for _, best := range []bool{false, true} {
		plan.BestFirst = best
		b.Run(fmt.Sprintf("bestfirst=%v", best), func(b *testing.B) {
			for b.Loop() {
				if err := be.TopK(context.Background(), scores, &plan, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
