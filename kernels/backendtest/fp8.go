package backendtest

import (
	"math"
	"sort"
)

// e4m3 lists the finite E4M3fn values in ascending order, built from the
// OCP FP8 definition (sign, 4 exponent bits with bias 7, 3 mantissa bits,
// subnormals at exponent 0, S.1111.111 NaN), independently of package
// kernels/fp8.
var e4m3 = func() []float64 {
	seen := map[float64]bool{}
	var v []float64
	for c := range 256 {
		e, m := c>>3&0xf, float64(c&7)
		if e == 15 && m == 7 {
			continue
		}
		x := math.Pow(2, -6) * m / 8
		if e > 0 {
			x = math.Pow(2, float64(e-7)) * (1 + m/8)
		}
		if c&0x80 != 0 {
			x = -x
		}
		if !seen[x] {
			seen[x] = true
			v = append(v, x)
		}
	}
	sort.Float64s(v)
	return v
}()

// RefFP8Box returns the decoded fp8 record of the box [lo, hi] (one KV
// head's D minima and maxima, finite), as a store of fp8 summaries holds
// it: the smallest power-of-two scale (at least 2^-126) that puts every
// value within +-448, each minimum rounded down and each maximum rounded
// up to an E4M3 value, times the scale. Brute force over the value list.
func RefFP8Box(lo, hi []float64) (dlo, dhi []float64) {
	a := 0.0
	for j := range lo {
		a = max(a, math.Abs(lo[j]), math.Abs(hi[j]))
	}
	e := -126
	for a/math.Ldexp(1, e) > 448 {
		e++
	}
	if a == 0 {
		e = 0
	}
	sc := math.Ldexp(1, e)
	dlo, dhi = make([]float64, len(lo)), make([]float64, len(hi))
	for j := range lo {
		x := lo[j] / sc
		i := sort.SearchFloat64s(e4m3, x) // first value >= x
		if i == len(e4m3) || e4m3[i] > x {
			i--
		}
		dlo[j] = e4m3[i] * sc
		y := hi[j] / sc
		dhi[j] = e4m3[sort.SearchFloat64s(e4m3, y)] * sc
	}
	return dlo, dhi
}

// RefScoreFP8 is RefScore over the fp8 record of the page's box
// (RefFP8Box), in float64.
func (f *Fixture) RefScoreFP8(seq, p, h int) float64 {
	s := f.Shape
	kvh := h / s.Group()
	q := f.Query(seq, h)
	lo, hi := make([]float64, s.HeadDim), make([]float64, s.HeadDim)
	for j := range s.HeadDim {
		lo[j], hi[j] = math.Inf(1), math.Inf(-1)
		for t := range f.Valid(seq, p) {
			x := float64(f.Key(seq, p, kvh, t)[j])
			lo[j], hi[j] = min(lo[j], x), max(hi[j], x)
		}
	}
	dlo, dhi := RefFP8Box(lo, hi)
	var u float64
	for j := range s.HeadDim {
		u += max(float64(q[j])*dlo[j], float64(q[j])*dhi[j])
	}
	return u
}
