package fp8

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// refValue decodes an E4M3fn code from the OCP FP8 definition: sign, 4
// exponent bits with bias 7, 3 mantissa bits, subnormals at exponent 0,
// S.1111.111 NaN.
func refValue(c uint8) float64 {
	s := 1.0
	if c&0x80 != 0 {
		s = -1
	}
	e, m := int(c>>3&0xf), float64(c&7)
	switch {
	case e == 15 && m == 7:
		return math.NaN()
	case e == 0:
		return s * math.Pow(2, -6) * (m / 8)
	}
	return s * math.Pow(2, float64(e-7)) * (1 + m/8)
}

// finite lists the finite E4M3fn values (both zeros).
func finite() []float64 {
	var v []float64
	for c := range 256 {
		if x := refValue(uint8(c)); !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	return v
}

func TestValue(t *testing.T) {
	for c := range 256 {
		want, got := refValue(uint8(c)), float64(Value(uint8(c)))
		if !(got == want || math.IsNaN(got) && math.IsNaN(want)) {
			t.Errorf("Value(%#02x) = %v, want %v", c, got, want)
		}
	}
	for c, want := range map[uint8]float64{0x7e: 448, 0xfe: -448, 0x38: 1, 0x08: 1.0 / 64, 0x01: 1.0 / 512, 0x00: 0} {
		if Value(c) != float32(want) {
			t.Errorf("Value(%#02x) = %v, want %v", c, Value(c), want)
		}
	}
}

// refRound is the brute-force directed rounding of x over the finite
// values.
func refRound(x float64, up bool) float64 {
	best := math.Inf(1)
	if !up {
		best = math.Inf(-1)
	}
	for _, v := range finite() {
		if up && v >= x && v < best || !up && v <= x && v > best {
			best = v
		}
	}
	return best
}

func TestRound(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	xs := []float64{0, 448, -448, 1.0 / 512, -1.0 / 512, 1.0 / 1024, 1.0 / 64, 240, 241, 447.9, -447.9, 0.3, -0.3}
	xs = append(xs, finite()...)
	for range 20000 {
		x := float64(float32((rng.Float64()*2 - 1) * math.Pow(2, float64(rng.IntN(20)-11))))
		if math.Abs(x) <= 448 {
			xs = append(xs, x)
		}
	}
	for _, x := range xs {
		for _, up := range []bool{false, true} {
			c := RoundDown(x)
			if up {
				c = RoundUp(x)
			}
			if got, want := refValue(c), refRound(x, up); got != want || c&0x7f == 0x7f {
				t.Fatalf("round(%v, up=%v) = code %#02x = %v, want %v", x, up, c, got, want)
			}
		}
	}
}

// checkRecord checks Encode's contract on rec against a float64 reading
// of the codes.
func checkRecord(t *testing.T, rec []float32) {
	t.Helper()
	d := len(rec) / 2
	codes := make([]uint8, len(rec))
	scale := Encode(codes, rec)
	dec := make([]float32, len(rec))
	Decode(dec, codes, scale)
	hasNaN, allEmpty, finiteRec := false, d > 0, true
	amax := 0.0
	for i, x := range rec {
		f := float64(x)
		hasNaN = hasNaN || math.IsNaN(f)
		finiteRec = finiteRec && !math.IsNaN(f) && !math.IsInf(f, 0)
		allEmpty = allEmpty && (i < d && math.IsInf(f, 1) || i >= d && math.IsInf(f, -1))
		if !math.IsInf(f, 0) && !math.IsNaN(f) {
			amax = max(amax, math.Abs(f))
		}
	}
	for i, c := range codes {
		if c&0x7f == 0x7f {
			t.Fatalf("record %v: NaN code at %d", rec, i)
		}
		f, g := float64(rec[i]), float64(dec[i])
		if math.IsNaN(g) {
			t.Fatalf("record %v: decoded NaN at %d (codes %x, scale %v)", rec, i, codes, scale)
		}
		// Outward: decoded minima below, maxima above (NaN values:
		// the decoded side is unbounded).
		if i < d && !(g <= f) && !(hasNaN && math.IsInf(g, -1)) || i >= d && !(g >= f) && !(hasNaN && math.IsInf(g, 1)) {
			t.Fatalf("record %v: value %d = %v decodes to %v (codes %x, scale %v)", rec, i, f, g, codes, scale)
		}
	}
	switch {
	case allEmpty:
		for i, g := range dec {
			if i < d && !math.IsInf(float64(g), 1) || i >= d && !math.IsInf(float64(g), -1) {
				t.Fatalf("empty record decodes to %v", dec)
			}
		}
	case !finiteRec:
		for i, g := range dec {
			if i < d && !math.IsInf(float64(g), -1) || i >= d && !math.IsInf(float64(g), 1) {
				t.Fatalf("record %v with a non-finite value decodes to %v, want all space", rec, dec)
			}
		}
	default:
		// A power of two, large enough for every value, and no larger
		// than needed.
		fr, _ := math.Frexp(float64(scale))
		if fr != 0.5 || amax/float64(scale) > 448 {
			t.Fatalf("record %v: scale %v", rec, scale)
		}
		if amax > 0 && float64(scale) > math.Ldexp(1, MinExp) && amax/(float64(scale)/2) <= 448 {
			t.Fatalf("record %v: scale %v is not the smallest (max |x| %v)", rec, scale, amax)
		}
		if amax == 0 && scale != 1 {
			t.Fatalf("all-zero record: scale %v", scale)
		}
	}
}

func randomRecord(rng *rand.Rand, d int) []float32 {
	rec := make([]float32, 2*d)
	mag := math.Pow(2, float64(rng.IntN(80)-40))
	for j := range d {
		a, b := float32(rng.NormFloat64()*mag), float32(rng.NormFloat64()*mag)
		if rng.IntN(8) == 0 {
			a = float32(rng.NormFloat64() * mag * 1e-6)
		}
		rec[j], rec[d+j] = min(a, b), max(a, b)
	}
	return rec
}

func TestEncodeRecords(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	const d = 8
	special := [][]float32{
		make([]float32, 2*d), // all zero
		{inf, inf, inf, inf, inf, inf, inf, inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf}, // empty
		{1, 2, 3, 4, 5, 6, 7, -inf, 2, 3, 4, 5, 6, 7, 8, 9},
		{1, 2, 3, 4, 5, 6, 7, 8, 2, 3, 4, 5, 6, 7, 8, inf},
		{1, 2, 3, nan, 5, 6, 7, 8, 2, 3, 4, 5, 6, 7, 8, 9},
		{math.MaxFloat32, -math.MaxFloat32, 0, 0, 0, 0, 0, 0, math.MaxFloat32, 0, 0, 0, 0, 0, 0, 0},
		{1e-45, -1e-45, 0, 0, 0, 0, 0, 0, 1e-45, 0, 0, 0, 0, 0, 0, 1e-40},
		{-448, 0, 0, 0, 0, 0, 0, 0, 448, 0, 0, 0, 0, 0, 0, 0},
		{-449, 0, 0, 0, 0, 0, 0, 0, 449, 0, 0, 0, 0, 0, 0, 0},
	}
	for _, rec := range special {
		checkRecord(t, rec)
	}
	for range 5000 {
		checkRecord(t, randomRecord(rng, 1+rng.IntN(64)))
	}
}

// bound64 is U_p(q) of decoded values in float64.
func bound64(q []float32, dec []float32) float64 {
	d := len(q)
	var u float64
	for j, x := range q {
		u += max(float64(x)*float64(dec[j]), float64(x)*float64(dec[d+j]))
	}
	return u
}

// TestUpperBound is invariant 1 on fp8 records: for random pages of keys,
// the bound of the encoded summary covers q.k of every key (float64).
func TestUpperBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for it := range 3000 {
		d, n := 1+rng.IntN(128), 1+rng.IntN(16)
		mag := math.Pow(2, float64(rng.IntN(40)-20))
		keys := make([][]float32, n)
		rec := make([]float32, 2*d)
		for j := range d {
			rec[j], rec[d+j] = float32(math.Inf(1)), float32(math.Inf(-1))
		}
		for r := range keys {
			keys[r] = make([]float32, d)
			for j := range keys[r] {
				keys[r][j] = float32(rng.NormFloat64() * mag)
				rec[j], rec[d+j] = min(rec[j], keys[r][j]), max(rec[d+j], keys[r][j])
			}
		}
		codes := make([]uint8, 2*d)
		scale := Encode(codes, rec)
		dec := make([]float32, 2*d)
		Decode(dec, codes, scale)
		q := make([]float32, d)
		for j := range q {
			q[j] = float32(rng.NormFloat64())
		}
		u := bound64(q, dec)
		for r, k := range keys {
			var dot float64
			for j := range k {
				dot += float64(q[j]) * float64(k[j])
			}
			if dot > u {
				t.Fatalf("case %d: key %d: q.k = %v above the fp8 bound %v", it, r, dot, u)
			}
		}
	}
}

// FuzzEncode checks Encode's contract on records of arbitrary float32
// bits (NaN, infinities, subnormals, negative zero included).
func FuzzEncode(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0x7f, 0, 0, 0x80, 0xff})
	f.Add([]byte{0, 0, 0xc0, 0x7f, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0x80, 0xff, 0xff, 0x7f, 0x7f, 1, 2, 3, 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		n := len(b) / 8 * 2
		if n == 0 || n > 512 {
			return
		}
		rec := make([]float32, n)
		for i := range rec {
			rec[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		checkRecord(t, rec)
	})
}

// FuzzUpperBound builds a page of keys and a query from the input and
// checks the fp8 bound against q.k of every key (float64).
func FuzzUpperBound(f *testing.F) {
	f.Add(uint8(4), []byte("some keys and a query for the bound, any bytes at all"))
	f.Add(uint8(1), []byte{0x80, 0x3f, 0, 0, 0xc0, 0x43, 0, 0, 0x80, 0xbf, 1, 2})
	f.Fuzz(func(t *testing.T, dim uint8, b []byte) {
		d := int(dim%32) + 1
		vals := len(b) / 4
		n := vals/d - 1 // the first d values are the query
		if n < 1 {
			return
		}
		n = min(n, 16)
		at := func(i int) float32 {
			x := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) || math.Abs(float64(x)) > 1e18 {
				return float32(i%7) - 3 // finite keys and queries: no Inf-Inf
			}
			return x
		}
		q := make([]float32, d)
		for j := range q {
			q[j] = at(j)
		}
		rec := make([]float32, 2*d)
		for j := range d {
			rec[j], rec[d+j] = float32(math.Inf(1)), float32(math.Inf(-1))
		}
		keys := make([][]float32, n)
		for r := range keys {
			keys[r] = make([]float32, d)
			for j := range keys[r] {
				keys[r][j] = at((r+1)*d + j)
				rec[j], rec[d+j] = min(rec[j], keys[r][j]), max(rec[d+j], keys[r][j])
			}
		}
		codes := make([]uint8, 2*d)
		dec := make([]float32, 2*d)
		Decode(dec, codes, Encode(codes, rec))
		u := bound64(q, dec)
		for _, k := range keys {
			var dot float64
			for j := range k {
				dot += float64(q[j]) * float64(k[j])
			}
			if dot > u {
				t.Fatalf("q %v keys %v: q.k = %v above the fp8 bound %v (decoded %v)", q, keys, dot, u, dec)
			}
		}
	})
}
