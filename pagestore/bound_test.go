package pagestore

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

// dot32 is q.k in float32 with every product rounded (no FMA) and summed in
// order, as a float32 kernel computes it.
func dot32(q, k []float32) float32 {
	var s float32
	for j := range q {
		s += float32(q[j] * k[j])
	}
	return s
}

// upper32 is U_p(q) (eq. 3) in float32, same rounding and order as dot32.
func upper32(q, mn, mx []float32) float32 {
	var s float32
	for j := range q {
		s += max(float32(q[j]*mn[j]), float32(q[j]*mx[j]))
	}
	return s
}

// checkBound appends keys (n tokens, one layer, one head) to a fresh store
// with page size S and checks invariant 1 on every page: max_r q.k_r <= U_p(q)
// in float32 (same summation order) and in float64.
func checkBound(t *testing.T, S, D int, keys []float32, queries [][]float32) {
	t.Helper()
	n := len(keys) / D
	s := mustStore(t, Config{Layers: 1, Geometry: plan.Geometry{KVHeads: 1, HeadDim: D, PageSize: S}, Capacity: (n+S-1)/S + 1})
	id := s.Create()
	if err := s.Append(id, 0, keys, make([]float32, len(keys))); err != nil {
		t.Fatal(err)
	}
	pt := pageTable(t, s, id)
	for p, phys := range pt {
		mn, mx := s.PageSummary(0, int(phys), 0)
		for _, q := range queries {
			q64 := make([]float64, D)
			for j := range q {
				q64[j] = float64(q[j])
			}
			u32 := upper32(q, mn, mx)
			u64 := scoreU(q64, mn, mx)
			for r := p * S; r < min(n, (p+1)*S); r++ {
				k := keys[r*D : (r+1)*D]
				if d := dot32(q, k); d > u32 {
					t.Fatalf("page %d key %d: fp32 q.k = %v > U = %v (q=%v k=%v min=%v max=%v)", p, r, d, u32, q, k, mn, mx)
				}
				d64 := 0.0
				for j := range k {
					d64 += float64(q[j]) * float64(k[j])
				}
				if d64 > u64 {
					t.Fatalf("page %d key %d: fp64 q.k = %v > U = %v", p, r, d64, u64)
				}
			}
		}
	}
}

func TestUpperBoundProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 42))
	for trial := range 200 {
		S := 1 + rng.IntN(20)
		D := 1 + rng.IntN(40)
		n := 1 + rng.IntN(5*S)
		scale := math.Pow(10, float64(rng.IntN(7)-3))
		keys := make([]float32, n*D)
		for i := range keys {
			keys[i] = float32(rng.NormFloat64() * scale)
			if rng.IntN(10) == 0 {
				keys[i] = 0
			}
		}
		var queries [][]float32
		for range 8 {
			q := make([]float32, D)
			for j := range q {
				q[j] = float32(rng.NormFloat64() * scale * 3)
				if rng.IntN(8) == 0 {
					q[j] = 0
				}
			}
			queries = append(queries, q)
		}
		_ = trial
		checkBound(t, S, D, keys, queries)
	}
}

// fuzzFloats decodes b as little-endian float32 values, replacing
// non-finite ones and clamping magnitudes to 1e18 so that no score
// overflows float32.
func fuzzFloats(b []byte, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		if len(b) < 4 {
			break
		}
		f := math.Float32frombits(binary.LittleEndian.Uint32(b))
		b = b[4:]
		switch {
		case f != f:
			f = 0
		case f > 1e18:
			f = 1e18
		case f < -1e18:
			f = -1e18
		}
		out[i] = f
	}
	return out
}

// FuzzUpperBound: for any page contents and query, no key in a page scores
// above the page's upper bound U_p(q) computed from the stored summary.
func FuzzUpperBound(f *testing.F) {
	le := func(xs ...float32) []byte {
		b := make([]byte, 0, 4*len(xs))
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		return b
	}
	// The notes' 1.1 example: keys (1,4),(3,-2),(-1,1), q = (2,-1).
	f.Add(uint8(3), uint8(2), uint8(3), le(2, -1, 1, 4, 3, -2, -1, 1))
	f.Add(uint8(16), uint8(4), uint8(17), le(1, -1, 0.5, -0.25, 3, 1e-30, -7, 2, 1e18, -1e18))
	f.Add(uint8(1), uint8(1), uint8(2), le(-0.0, 0, 1e-45, -1e-45))
	f.Add(uint8(4), uint8(8), uint8(9), le(1e18, 1e18, -1e18, 3.5, -2.25, 1, 1, 1, 1, 7, 7, 7))
	f.Fuzz(func(t *testing.T, s, d, n uint8, data []byte) {
		S := 1 + int(s%32)
		D := 1 + int(d%64)
		N := 1 + int(n)%(3*S)
		vals := fuzzFloats(data, D+N*D)
		checkBound(t, S, D, vals[D:], [][]float32{vals[:D]})
	})
}
