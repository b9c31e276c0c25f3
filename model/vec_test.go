package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestVecKernels: the vector loops of the attention kernel agree with
// float64 sums for lengths and strides around their blocking.
func TestVecKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, d := range []int{8, 16, 32, 40, 64, 72, 128} {
		for _, n := range []int{1, 3, 4, 5, 8, 17, 64} {
			stride := d * (1 + rng.IntN(3))
			q := randVecs(rng, d, 1)
			k := randVecs(rng, n*stride, 1)
			out := make([]float32, n)
			mx := scores(q, k, stride, 0.125, out)
			want := math.Inf(-1)
			for i := range n {
				var s float64
				for j := range d {
					s += float64(q[j]) * float64(k[i*stride+j])
				}
				s *= 0.125
				want = max(want, s)
				if math.Abs(float64(out[i])-s) > 1e-5*math.Sqrt(float64(d)) {
					t.Fatalf("scores d %d n %d: out[%d] = %v, want %v", d, n, i, out[i], s)
				}
			}
			if math.Abs(float64(mx)-want) > 1e-5*math.Sqrt(float64(d)) {
				t.Fatalf("scores d %d n %d: max %v, want %v", d, n, mx, want)
			}
			p := randVecs(rng, n, 1)
			acc := randVecs(rng, d, 1)
			wantAcc := make([]float64, d)
			for j := range d {
				wantAcc[j] = float64(acc[j])
				for i := range n {
					wantAcc[j] += float64(p[i]) * float64(k[i*stride+j])
				}
			}
			accum(p, k, stride, acc)
			for j := range d {
				if math.Abs(float64(acc[j])-wantAcc[j]) > 1e-5*math.Sqrt(float64(n)) {
					t.Fatalf("accum d %d n %d: acc[%d] = %v, want %v", d, n, j, acc[j], wantAcc[j])
				}
			}
		}
	}
	for _, n := range []int{1, 7, 8, 9, 64, 67} {
		s := make([]float32, n)
		m := float32(3)
		for i := range s {
			s[i] = m - float32(rng.Float64()*80)
		}
		s[0] = m
		want := make([]float64, n)
		var sum float64
		for i, x := range s {
			want[i] = math.Exp(float64(x - m))
			sum += want[i]
		}
		got := expSum(s, m)
		for i := range s {
			if math.Abs(float64(s[i])-want[i]) > 3e-7*want[i]+1e-37 {
				t.Fatalf("expSum n %d: e[%d] = %v, want %v", n, i, s[i], want[i])
			}
		}
		if math.Abs(float64(got)-sum) > 1e-6*sum {
			t.Fatalf("expSum n %d: sum %v, want %v", n, got, sum)
		}
	}
}
