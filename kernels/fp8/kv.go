package fp8

import "math"

// KV records (the fp8 KV cache, plan.FP8).
//
// A K/V record is one (physical page, KV head) block of K, or of V:
// PageSize x HeadDim E4M3fn codes with one float32 scale. The element
// it stores is Value(code) * scale (rounded to float32, as a kernel
// computes it). Unlike a summary record, whose scale is a power of two
// and whose codes round outward, a K/V record takes the scale
// amax/448 (KVScale: amax the largest magnitude over the page's valid
// tokens of that head, the division rounded to float32) and rounds to
// the nearest code (RoundNearest, ties to the even code), saturating at
// +-448. The all-zero block has scale 0 (every element decodes to 0).
//
// Slots past a page's valid tokens are unspecified: readers never
// decode them.

// KVScale returns the scale of a K/V record whose largest magnitude is
// amax (finite, >= 0): amax/448 in float32.
func KVScale(amax float32) float32 { return amax / MaxFinite }

// RoundNearest returns the code of the E4M3fn value nearest to x, ties
// to the code with an even mantissa, saturating to +-448 outside
// [-448, 448] (x finite).
func RoundNearest(x float64) uint8 {
	if x >= MaxFinite {
		return CodeMaxPos
	}
	if x <= -MaxFinite {
		return CodeMaxNeg
	}
	lo, hi := RoundDown(x), RoundUp(x)
	if lo == hi {
		return lo
	}
	dl, dh := x-float64(values[lo]), float64(values[hi])-x
	switch {
	case dl < dh:
		return lo
	case dh < dl:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

// EncodeKV writes the codes of the values x under scale (len(codes) ==
// len(x)): codes[i] = RoundNearest(x[i]/scale), the quotient rounded to
// float32; every code is 0 when scale is 0. The values must be finite.
func EncodeKV(codes []uint8, x []float32, scale float32) {
	codes = codes[:len(x)]
	if scale == 0 {
		clear(codes)
		return
	}
	for i, v := range x {
		codes[i] = RoundNearest(float64(v / scale))
	}
}

// AbsMax returns the largest magnitude of x (0 for an empty x).
func AbsMax(x []float32) float32 {
	var a float32
	for _, v := range x {
		a = max(a, float32(math.Abs(float64(v))))
	}
	return a
}
