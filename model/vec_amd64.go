//go:build amd64 && !purego

package model

import "golang.org/x/sys/cpu"

// useAVX2 is fixed at package initialization from CPUID.
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func scoresAVX2(q, k *float32, d, n, stride int, scale float32, out *float32) float32

//go:noescape
func expSumAVX2(s *float32, n int, m float32) float32

//go:noescape
func accumAVX2(p *float32, n int, v *float32, stride, d int, acc *float32)

// scores sets out[t] = scale * q . k[t*stride:][:len(q)] for t < len(out)
// and returns their maximum (-inf when out is empty).
func scores(q, k []float32, stride int, scale float32, out []float32) float32 {
	d, n := len(q), len(out)
	if !useAVX2 || d%8 != 0 || n == 0 || d == 0 {
		return scoresGeneric(q, k, stride, scale, out)
	}
	_ = k[(n-1)*stride+d-1]
	return scoresAVX2(&q[0], &k[0], d, n, stride, scale, &out[0])
}

// expSum sets s[i] = e^(s[i]-m) (s[i] <= m) and returns their sum.
func expSum(s []float32, m float32) float32 {
	n := len(s) &^ 7
	var sum float32
	if useAVX2 && n > 0 {
		sum = expSumAVX2(&s[0], n, m)
	} else {
		n = 0
	}
	return sum + expSumGeneric(s[n:], m)
}

// accum does acc[j] += sum_t p[t] * v[t*stride+j] for j < len(acc).
func accum(p, v []float32, stride int, acc []float32) {
	d, n := len(acc), len(p)
	if !useAVX2 || d%8 != 0 || n == 0 || d == 0 {
		accumGeneric(p, v, stride, acc)
		return
	}
	_ = v[(n-1)*stride+d-1]
	accumAVX2(&p[0], n, &v[0], stride, d, &acc[0])
}
