package kernels

import "math"

// dotGeneric returns sum a[i]*b[i] over len(a) (b must be at least as long).
// Four independent accumulators let the CPU overlap the multiply-adds.
func dotGeneric(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpyGeneric does y += alpha*x over len(x) (y must be at least as long).
func axpyGeneric(alpha float32, x, y []float32) {
	y = y[:len(x)]
	i := 0
	for ; i+4 <= len(x); i += 4 {
		y[i] += alpha * x[i]
		y[i+1] += alpha * x[i+1]
		y[i+2] += alpha * x[i+2]
		y[i+3] += alpha * x[i+3]
	}
	for ; i < len(x); i++ {
		y[i] += alpha * x[i]
	}
}

// scaleGeneric does y *= alpha.
func scaleGeneric(alpha float32, y []float32) {
	for i := range y {
		y[i] *= alpha
	}
}

// dot4Generic sets out[i] = q[i*d:(i+1)*d] . k for i < 4, d = len(k).
func dot4Generic(q, k []float32, out *[4]float32) {
	d := len(k)
	for i := range 4 {
		out[i] = dotGeneric(q[i*d:(i+1)*d], k)
	}
}

// gemvTGeneric does acc[j] += sum_t p[t]*v[t*d+j], d = len(acc).
func gemvTGeneric(p, v, acc []float32) {
	d := len(acc)
	for t, w := range p {
		axpyGeneric(w, v[t*d:(t+1)*d], acc)
	}
}

// Finite reports whether xs holds no NaN and no infinity. x*0 is ±0 for a
// finite x and NaN otherwise, so the sums stay 0 exactly when all are
// finite: four accumulators, no data-dependent branch (about 8x faster
// than testing each element with math.IsNaN and math.IsInf).
func Finite(xs []float32) bool {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(xs); i += 4 {
		s0 += xs[i] * 0
		s1 += xs[i+1] * 0
		s2 += xs[i+2] * 0
		s3 += xs[i+3] * 0
	}
	for ; i < len(xs); i++ {
		s0 += xs[i] * 0
	}
	return s0+s1+s2+s3 == 0
}

// scoreRowsGeneric is ScoreRows in portable Go.
func scoreRowsGeneric(q, k []float32, stride int, scale float32, out []float32) float32 {
	mx := float32(math.Inf(-1))
	d := len(q)
	for t := range out {
		out[t] = dot(q, k[t*stride:t*stride+d]) * scale
		mx = max(mx, out[t])
	}
	return mx
}

// expSumGeneric is ExpSum in portable Go.
func expSumGeneric(s []float32, m float32) float32 {
	var sum float32
	for i, x := range s {
		e := ExpNeg(x - m)
		s[i] = e
		sum += e
	}
	return sum
}

// accumRowsGeneric is AccumRows in portable Go.
func accumRowsGeneric(p, v []float32, stride int, acc []float32) {
	d := len(acc)
	for t, w := range p {
		row := v[t*stride : t*stride+d]
		for j := range acc {
			acc[j] += w * row[j]
		}
	}
}
