//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// useAVX2 is fixed at package initialization from CPUID and never changes.
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func dotAVX2(a, b *float32, n int) float32

//go:noescape
func axpyAVX2(alpha float32, x, y *float32, n int)

func dot(a, b []float32) float32 {
	if !useAVX2 || len(a) == 0 {
		return dotGeneric(a, b)
	}
	_ = b[len(a)-1]
	return dotAVX2(&a[0], &b[0], len(a))
}

func axpy(alpha float32, x, y []float32) {
	if !useAVX2 || len(x) == 0 {
		axpyGeneric(alpha, x, y)
		return
	}
	_ = y[len(x)-1]
	axpyAVX2(alpha, &x[0], &y[0], len(x))
}

//go:noescape
func dot4AVX2(q, k *float32, d int, out *float32)

//go:noescape
func gemvTAVX2(p *float32, n int, v *float32, d int, acc *float32)

func scaleVec(alpha float32, y []float32) { scaleGeneric(alpha, y) }

// dot4 sets out[i] = q[i*d:(i+1)*d] . k for i < 4, d = len(k).
func dot4(q, k []float32, out *[4]float32) {
	d := len(k)
	if !useAVX2 || d%8 != 0 || d == 0 {
		dot4Generic(q, k, out)
		return
	}
	_ = q[4*d-1]
	dot4AVX2(&q[0], &k[0], d, &out[0])
}

// gemvT does acc[j] += sum_t p[t]*v[t*d+j], d = len(acc), t < len(p).
func gemvT(p, v, acc []float32) {
	d := len(acc)
	if !useAVX2 || d%8 != 0 || d == 0 || len(p) == 0 {
		gemvTGeneric(p, v, acc)
		return
	}
	_ = v[len(p)*d-1]
	gemvTAVX2(&p[0], len(p), &v[0], d, &acc[0])
}

//go:noescape
func scoresAVX2(q, k *float32, d, n, stride int, scale float32, out *float32) float32

//go:noescape
func expSumAVX2(s *float32, n int, m float32) float32

//go:noescape
func accumAVX2(p *float32, n int, v *float32, stride, d int, acc *float32)

// ScoreRows sets out[t] = scale * q . k[t*stride:][:len(q)] for t < len(out)
// and returns their maximum (-inf when out is empty).
func ScoreRows(q, k []float32, stride int, scale float32, out []float32) float32 {
	d, n := len(q), len(out)
	if !useAVX2 || d%8 != 0 || n == 0 || d == 0 {
		return scoreRowsGeneric(q, k, stride, scale, out)
	}
	_ = k[(n-1)*stride+d-1]
	return scoresAVX2(&q[0], &k[0], d, n, stride, scale, &out[0])
}

// ExpSum sets s[i] = e^(s[i]-m) (s[i] <= m) and returns their sum.
func ExpSum(s []float32, m float32) float32 {
	n := len(s) &^ 7
	var sum float32
	if useAVX2 && n > 0 {
		sum = expSumAVX2(&s[0], n, m)
	} else {
		n = 0
	}
	return sum + expSumGeneric(s[n:], m)
}

// AccumRows does acc[j] += sum_t p[t] * v[t*stride+j] for j < len(acc).
func AccumRows(p, v []float32, stride int, acc []float32) {
	d, n := len(acc), len(p)
	if !useAVX2 || d%8 != 0 || n == 0 || d == 0 {
		accumRowsGeneric(p, v, stride, acc)
		return
	}
	_ = v[(n-1)*stride+d-1]
	accumAVX2(&p[0], n, &v[0], stride, d, &acc[0])
}
