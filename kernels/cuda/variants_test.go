//go:build cuda

package cuda

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
)

// TestKernelVariants reaches the kernel variants the conformance shapes miss:
// score128 g1/g2/g8, attendp for 16-bit storage (S in 17..32), attendp f32 at
// S*D = 3072..4096, attends16 d64 with S > 1, generic attend with G = 32
// (1024-thread blocks) and D = 256, and the reduce's REDUCE_CAP loop.
func TestKernelVariants(t *testing.T) {
	ctx := context.Background()
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
		dt DType
		q  func(float32) float32
	}{{F32, nil}, {BF16, backendtest.RoundBF16}, {F16, backendtest.RoundF16}} {
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
			for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
				rows := s.Rows(mode)
				sc := make([]float32, len(f.Batch.Pages)*rows)
				if err := b.Score(ctx, s, f.Layer, &f.Batch, f.Q, mode, sc); err != nil {
					t.Fatalf("%v %+v %v score: %v", c.dt, s, mode, err)
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
								t.Fatalf("%v %+v %v seq %d row %d page %d: score %v want %v", c.dt, s, mode, seq, r, p, got, want)
							}
						}
					}
				}
				l := backendtest.DenseLists(f, mode)
				o := make([]float32, len(f.Q))
				lse := make([]float32, len(f.Lens)*s.QHeads)
				if err := b.Attend(ctx, s, f.Layer, &f.Batch, f.Q, l, o, lse); err != nil {
					t.Fatalf("%v %+v %v attend: %v", c.dt, s, mode, err)
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
							t.Fatalf("%v %+v %v seq %d head %d: lse %v want %v", c.dt, s, mode, seq, h, gl, wl)
						}
						for j := range s.HeadDim {
							got := float64(o[(seq*s.QHeads+h)*s.HeadDim+j])
							if math.IsNaN(got) || math.Abs(got-wo[j]) > 2e-4*max(1, math.Abs(wo[j])) {
								t.Fatalf("%v %+v %v seq %d head %d dim %d: o %v want %v", c.dt, s, mode, seq, h, j, got, wo[j])
							}
						}
					}
				}
			}
		}
		b.Close()
	}
}
