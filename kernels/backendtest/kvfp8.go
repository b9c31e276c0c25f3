package backendtest

import (
	"math"
	"math/rand/v2"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/fp8"
)

// nanCode is an E4M3fn NaN code: the fp8 fixture puts it in padding
// slots and unowned pages, so a kernel that reads them produces NaN.
const nanCode = 0x7f

// refE4M3 decodes an E4M3fn code from the OCP FP8 definition (sign, 4
// exponent bits with bias 7, 3 mantissa bits, subnormals at exponent 0,
// S.1111.111 NaN), independently of package fp8's table.
func refE4M3(c uint8) float64 {
	s := 1.0
	if c&0x80 != 0 {
		s = -1
	}
	e, m := int(c>>3&0xf), float64(c&7)
	switch {
	case e == 15 && m == 7:
		return math.NaN()
	case e == 0:
		return s * math.Ldexp(m/8, -6)
	}
	return s * math.Ldexp(1+m/8, e-7)
}

// NewFixtureFP8 is NewFixture with K and V stored as fp8 records
// (plan.FP8): every (page, KV head) block of K and of V is encoded with
// the scale amax/448 over the page's valid tokens (fp8.EncodeKV, whose
// rounding package fp8 checks against a brute-force reference), and
// Layer carries only the codes and scales (K8, V8, KScale, VScale).
// Key, Value and every reference read the dequantized elements,
// decoded here from the format's definition, and the summaries are
// taken over them: what a backend reading the records must match.
// Padding slots and unowned pages hold NaN codes.
func NewFixtureFP8(rng *rand.Rand, s kernels.Shape, lens []int) *Fixture {
	f := NewFixtureQ(rng, s, lens, nil)
	pool := len(f.Layer.Summary) / (s.KVHeads * 2 * s.HeadDim)
	blk := s.PageSize * s.HeadDim
	valid := make([]int, pool) // valid tokens per physical page; 0: unowned
	for seq := range f.Batch.Len() {
		for p := range f.Batch.NumPages(seq) {
			valid[f.Batch.Pages[int(f.Batch.Indptr[seq])+p]] = f.Valid(seq, p)
		}
	}
	l := kernels.Layer{
		Summary: f.Layer.Summary,
		K8:      make([]uint8, len(f.Layer.K)), V8: make([]uint8, len(f.Layer.V)),
		KScale: make([]float32, pool*s.KVHeads), VScale: make([]float32, pool*s.KVHeads),
	}
	for phys, n := range valid {
		for h := range s.KVHeads {
			rec := phys*s.KVHeads + h
			for _, a := range []struct {
				x     []float32
				codes []uint8
				scale []float32
			}{{f.Layer.K, l.K8, l.KScale}, {f.Layer.V, l.V8, l.VScale}} {
				x, codes := a.x[rec*blk:][:blk], a.codes[rec*blk:][:blk]
				sc := fp8.KVScale(fp8.AbsMax(x[:n*s.HeadDim]))
				fp8.EncodeKV(codes[:n*s.HeadDim], x[:n*s.HeadDim], sc)
				a.scale[rec] = sc
				for i := range codes {
					if i >= n*s.HeadDim {
						codes[i] = nanCode
						x[i] = float32(math.NaN())
						continue
					}
					x[i] = float32(refE4M3(codes[i]) * float64(sc))
				}
			}
			if n > 0 {
				f.fillSummary(phys, h, n)
			}
		}
	}
	f.ref = f.Layer
	f.Layer = l
	return f
}
