package kernels

import "math"

// HalfToFloat32 converts IEEE binary16 bits to float32, exactly (every
// half, subnormals, infinities and NaN payloads included): the decoding
// of the 16-bit float storage type wherever pages are read back.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := int(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: man x 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | uint32(exp-15+127)<<23 | man<<13)
}
