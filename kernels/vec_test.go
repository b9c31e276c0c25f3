package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestVecMatchesFloat64 checks the dispatched dot/axpy (assembly where the
// CPU has AVX2+FMA) against float64 arithmetic for every length up to 300.
func TestVecMatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 300; n++ {
		a := make([]float32, n)
		b := make([]float32, n+3)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		for i := range b {
			b[i] = float32(rng.NormFloat64())
		}
		var want, mag float64
		for i := range a {
			want += float64(a[i]) * float64(b[i])
			mag += math.Abs(float64(a[i]) * float64(b[i]))
		}
		if got := dot(a, b); math.Abs(float64(got)-want) > 1e-6*(mag+1) {
			t.Fatalf("dot n=%d: %v, want %v", n, got, want)
		}
		y := make([]float32, n+3)
		copy(y, b)
		alpha := float32(rng.NormFloat64())
		axpy(alpha, a, y)
		for i := range y {
			w := float64(b[i])
			if i < n {
				w += float64(alpha) * float64(a[i])
			}
			if math.Abs(float64(y[i])-w) > 1e-6*(math.Abs(w)+1) {
				t.Fatalf("axpy n=%d i=%d: %v, want %v", n, i, y[i], w)
			}
		}
	}
}
