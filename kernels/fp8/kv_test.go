package fp8

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refNearest is the brute-force nearest E4M3fn value of x over the
// finite values, ties to the value whose code has an even mantissa,
// saturating at +-448.
func refNearest(x float64) float64 {
	best, bestCode := math.NaN(), -1
	for c := range 256 {
		v := refValue(uint8(c))
		if math.IsNaN(v) || (v == 0 && c == 0x80) {
			continue
		}
		if bestCode < 0 || math.Abs(v-x) < math.Abs(best-x) ||
			math.Abs(v-x) == math.Abs(best-x) && c&1 == 0 && bestCode&1 == 1 {
			best, bestCode = v, c
		}
	}
	return best
}

func TestRoundNearest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var xs []float64
	vals := finite()
	for _, v := range vals {
		xs = append(xs, v, math.Nextafter(v, math.Inf(1)), math.Nextafter(v, math.Inf(-1)))
	}
	// Midpoints between neighbours: the ties.
	sorted := slices.Clone(vals)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		xs = append(xs, (sorted[i-1]+sorted[i])/2)
	}
	for range 20000 {
		xs = append(xs, (rng.Float64()*2-1)*500, (rng.Float64()*2-1)*math.Pow(2, -float64(rng.IntN(12))))
	}
	for _, x := range xs {
		want := refNearest(x)
		got := float64(Value(RoundNearest(x)))
		if got != want && !(got == 0 && want == 0) {
			t.Fatalf("RoundNearest(%v) = %v, want %v", x, got, want)
		}
	}
}

func TestEncodeKV(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		n := 1 + rng.IntN(64)
		x := make([]float32, n)
		mag := math.Pow(2, float64(rng.IntN(40)-20))
		for i := range x {
			x[i] = float32((rng.Float64()*2 - 1) * mag)
		}
		scale := KVScale(AbsMax(x))
		codes := make([]uint8, n)
		EncodeKV(codes, x, scale)
		for i, v := range x {
			got := float64(Value(codes[i]) * scale)
			// Nearest rounding: within half a code step of the
			// quotient, the steps of E4M3 being at most 1/16 of the
			// value's magnitude (2^-9 absolute for subnormal codes).
			q := float64(v / scale)
			step := max(math.Abs(q)/8, math.Pow(2, -9))
			if math.Abs(float64(Value(codes[i]))-q) > step/2*(1+1e-9) {
				t.Fatalf("x=%v scale=%v: code value %v, quotient %v", v, scale, Value(codes[i]), q)
			}
			if math.Abs(got-float64(v)) > float64(scale)*step/2*1.0001+1e-30 {
				t.Fatalf("x=%v decodes to %v (scale %v)", v, got, scale)
			}
		}
		// The largest magnitude maps to +-448 exactly.
		for i, v := range x {
			if float32(math.Abs(float64(v))) == AbsMax(x) && Value(codes[i]) != float32(math.Copysign(448, float64(v))) {
				t.Fatalf("amax %v coded %v, want +-448", v, Value(codes[i]))
			}
		}
	}
	codes := []uint8{9, 9}
	EncodeKV(codes, []float32{0, 0}, KVScale(0))
	if codes[0] != 0 || codes[1] != 0 || KVScale(0) != 0 {
		t.Fatalf("zero block: codes %v scale %v", codes, KVScale(0))
	}
}
