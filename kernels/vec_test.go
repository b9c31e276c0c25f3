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

// TestDot4AndGemvT checks the fused kernels against float64 for head sizes
// that take the assembly path (multiples of 8) and the fallback.
func TestDot4AndGemvT(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, d := range []int{1, 3, 8, 16, 24, 32, 40, 64, 72, 128, 256} {
		q := make([]float32, 4*d)
		k := make([]float32, d)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		for i := range k {
			k[i] = float32(rng.NormFloat64())
		}
		var out [4]float32
		dot4(q, k, &out)
		for i := range 4 {
			var want, mag float64
			for j := range d {
				x := float64(q[i*d+j]) * float64(k[j])
				want += x
				mag += math.Abs(x)
			}
			if math.Abs(float64(out[i])-want) > 1e-6*(mag+1) {
				t.Fatalf("dot4 d=%d row %d: %v, want %v", d, i, out[i], want)
			}
		}
		for _, n := range []int{0, 1, 5, 16, 17} {
			p := make([]float32, n)
			v := make([]float32, n*d)
			acc := make([]float32, d+2) // the extra slots must stay untouched
			for i := range p {
				p[i] = float32(rng.Float64())
			}
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			for i := range acc {
				acc[i] = float32(i)
			}
			gemvT(p, v, acc[:d])
			for j := range d + 2 {
				want := float64(j)
				if j < d {
					for tt := range n {
						want += float64(p[tt]) * float64(v[tt*d+j])
					}
				}
				if math.Abs(float64(acc[j])-want) > 1e-5*(math.Abs(want)+1) {
					t.Fatalf("gemvT d=%d n=%d j=%d: %v, want %v", d, n, j, acc[j], want)
				}
			}
		}
	}
}

// TestFinite: Finite agrees with testing each element, for NaN and
// infinities at every position of short slices and for the largest finite
// values (whose product with 0 is still 0).
func TestFinite(t *testing.T) {
	naive := func(xs []float32) bool {
		for _, x := range xs {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return false
			}
		}
		return true
	}
	for n := range 11 {
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = float32(i) - 3.5
		}
		if n > 0 {
			xs[n-1] = math.MaxFloat32
			xs[0] = -math.MaxFloat32
		}
		if !Finite(xs) || !naive(xs) {
			t.Fatalf("n=%d: finite values reported non-finite", n)
		}
		for i := range n {
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
				ys := append([]float32(nil), xs...)
				ys[i] = bad
				if Finite(ys) || naive(ys) {
					t.Fatalf("n=%d: %v at %d not caught", n, bad, i)
				}
			}
		}
	}
}
