package fp8

import "math"

// MaxFinite is the largest finite E4M3fn magnitude.
const MaxFinite = 448

// Codes of the special records and of the extreme finite values.
const (
	CodeMaxPos uint8 = 0x7e // +448
	CodeMaxNeg uint8 = 0xfe // -448
)

// Scale exponents: a record's scale is 2^e with MinExp <= e <= MaxExp.
const (
	MinExp = -126
	MaxExp = 120
)

// values is Value for every code (NaN for 0x7f and 0xff).
var values = func() (t [256]float32) {
	for c := range 256 {
		m := c & 0x7f
		e, man := m>>3, m&7
		var v float64
		switch {
		case m == 0x7f:
			v = math.NaN()
		case e == 0:
			v = math.Ldexp(float64(man), -9)
		default:
			v = math.Ldexp(float64(8+man), e-7-3)
		}
		if c&0x80 != 0 {
			v = -v
		}
		t[c] = float32(v)
	}
	return t
}()

// Value returns the value of an E4M3fn code (NaN for the NaN codes 0x7f
// and 0xff).
func Value(c uint8) float32 { return values[c] }

// Table returns the values of all 256 codes, indexed by code (for
// kernels that decode through a table).
func Table() *[256]float32 { return &values }

// roundMag returns the code of the representable magnitude next to
// a (0 <= a <= 448): the largest <= a, or with up the smallest >= a.
// It reads a's float64 bits: at and above 2^-6 a code keeps the top 3
// mantissa bits (and rounding up past the dropped ones carries into the
// exponent, as codes are ordered like magnitudes); below, the subnormal
// codes count multiples of 2^-9.
func roundMag(a float64, up bool) uint8 {
	if a == 0 { // -0 too
		return 0
	}
	b := math.Float64bits(a)
	exp := int(b>>52) - 1023
	if exp < -6 {
		n := a * 512 // exact: a power of two
		c := uint8(n)
		if up && float64(c) != n {
			c++
		}
		return c
	}
	const drop = 52 - 3
	c := uint8((exp+7)<<3) | uint8(b>>drop&7)
	if up && b&(1<<drop-1) != 0 {
		c++
	}
	return c
}

// RoundDown returns the code of the largest E4M3fn value <= x, and
// RoundUp that of the smallest >= x, for |x| <= 448 (x exact in float64;
// a float32 times a power of two is).
func RoundDown(x float64) uint8 {
	if x < 0 {
		return 0x80 | roundMag(-x, true)
	}
	return roundMag(x, false)
}

// RoundUp: see RoundDown.
func RoundUp(x float64) uint8 {
	if x < 0 {
		return 0x80 | roundMag(-x, false)
	}
	return roundMag(x, true)
}

// ScaleExp returns the exponent e of the scale of a finite record whose
// largest magnitude is a: the smallest e >= MinExp with a/2^e <= 448 (0
// for a = 0).
func ScaleExp(a float64) int {
	if a == 0 {
		return 0
	}
	f, ex := math.Frexp(a)
	e := ex - 9 // a/2^e = f*512, in [256, 512)
	if f*512 > MaxFinite {
		e++
	}
	return max(e, MinExp)
}

// Encode writes the codes of the record rec (D minima then D maxima,
// len(codes) == len(rec), even) and returns its scale (see the package
// doc).
func Encode(codes []uint8, rec []float32) float32 {
	d := len(rec) / 2
	codes = codes[:len(rec)]
	finite, empty := true, d > 0
	var a float64
	for i, x := range rec {
		if i < d {
			empty = empty && math.IsInf(float64(x), 1)
		} else {
			empty = empty && math.IsInf(float64(x), -1)
		}
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			finite = false
			continue
		}
		a = max(a, math.Abs(float64(x)))
	}
	if !finite {
		lo, hi := CodeMaxNeg, CodeMaxPos // all space
		if empty {
			lo, hi = CodeMaxPos, CodeMaxNeg
		}
		for i := range codes {
			if i < d {
				codes[i] = lo
			} else {
				codes[i] = hi
			}
		}
		return float32(math.Inf(1))
	}
	e := ScaleExp(a)
	inv := math.Ldexp(1, -e) // x * inv is exact in float64
	for i, x := range rec {
		v := float64(x) * inv
		if i < d {
			codes[i] = RoundDown(v)
		} else {
			codes[i] = RoundUp(v)
		}
	}
	return float32(math.Ldexp(1, e))
}

// Decode writes the values of a record's codes: dst[i] =
// Value(codes[i]) * scale.
func Decode(dst []float32, codes []uint8, scale float32) {
	for i, c := range codes {
		dst[i] = values[c] * scale
	}
}

// Unscaled writes the code values of a record without its scale:
// dst[i] = Value(codes[i]) (what a backend's dot product reads).
func Unscaled(dst []float32, codes []uint8) {
	for i, c := range codes {
		dst[i] = values[c]
	}
}
