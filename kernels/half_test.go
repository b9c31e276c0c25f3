package kernels

import (
	"math"
	"testing"
)

// TestHalfToFloat32 checks every one of the 65,536 halves against the
// definition of binary16, computed in float64: (-1)^s x 2^(e-15) x
// (1 + m/1024) for normal numbers, 2^-14 x m/1024 for subnormals, and
// infinities and NaNs (with their payload) for e = 31.
func TestHalfToFloat32(t *testing.T) {
	for h := range 1 << 16 {
		s, e, m := h>>15, (h>>10)&31, h&1023
		got := HalfToFloat32(uint16(h))
		var want float64
		switch {
		case e == 31 && m == 0:
			want = math.Inf(1)
		case e == 31:
			if !math.IsNaN(float64(got)) || math.Float32bits(got)&0x7fffff != uint32(m)<<13 {
				t.Fatalf("half %#04x: %v (bits %#08x), want a NaN with payload %#x", h, got, math.Float32bits(got), m)
			}
			continue
		case e == 0:
			want = math.Ldexp(float64(m)/1024, -14)
		default:
			want = math.Ldexp(1+float64(m)/1024, e-15)
		}
		if s == 1 {
			want = -want
		}
		if float64(got) != want || math.Signbit(float64(got)) != (s == 1) {
			t.Fatalf("half %#04x: %v, want %v", h, got, want)
		}
	}
}
