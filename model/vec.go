package model

import "math"

// The portable versions of the attention kernel's vector loops (the
// amd64 build uses AVX2+FMA versions of the same; see vec_amd64.s).

func scoresGeneric(q, k []float32, stride int, scale float32, out []float32) float32 {
	mx := float32(math.Inf(-1))
	d := len(q)
	for t := range out {
		out[t] = dot(q, k[t*stride:t*stride+d]) * scale
		mx = max(mx, out[t])
	}
	return mx
}

func expSumGeneric(s []float32, m float32) float32 {
	var sum float32
	for i, x := range s {
		e := expNeg(x - m)
		s[i] = e
		sum += e
	}
	return sum
}

func accumGeneric(p, v []float32, stride int, acc []float32) {
	d := len(acc)
	for t, w := range p {
		row := v[t*stride : t*stride+d]
		for j := range acc {
			acc[j] += w * row[j]
		}
	}
}
