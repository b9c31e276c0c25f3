package backendtest

import (
	"math"
	"testing"
)

func TestRounding(t *testing.T) {
	cases := []struct {
		name     string
		f        func(float32) float32
		in, want float64
	}{
		{"bf16 exact", RoundBF16, 1.5, 1.5},
		{"bf16 tie to even down", RoundBF16, 1 + 1.0/256, 1},
		{"bf16 tie to even up", RoundBF16, 1 + 3.0/256, 1 + 4.0/256},
		{"bf16 above tie", RoundBF16, 1 + 1.0/256 + 1.0/4096, 1 + 1.0/128},
		{"bf16 negative", RoundBF16, -(1 + 3.0/256), -(1 + 4.0/256)},
		{"f16 tie to even down", RoundF16, 1 + 1.0/2048, 1},
		{"f16 tie to even up", RoundF16, 1 + 3.0/2048, 1 + 4.0/2048},
		{"f16 power of two", RoundF16, 0.25, 0.25},
		{"f16 just below 2", RoundF16, 2 - 1.0/4096, 2},
		{"f16 subnormal tie to zero", RoundF16, math.Ldexp(1, -25), 0},
		{"f16 subnormal tie up", RoundF16, 3 * math.Ldexp(1, -25), math.Ldexp(1, -23)},
		{"f16 subnormal", RoundF16, 5 * math.Ldexp(1, -24), 5 * math.Ldexp(1, -24)},
	}
	for _, c := range cases {
		if got := c.f(float32(c.in)); float64(got) != c.want {
			t.Errorf("%s: %v -> %v, want %v", c.name, c.in, got, c.want)
		}
	}
}
