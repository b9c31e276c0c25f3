package kernels

import "github.com/questrt/questrt/kernels/fp8"

// fp8Scratch is one worker's scratch for scoring emulated fp8 records:
// the codes of one record and their unscaled values.
type fp8Scratch struct {
	codes []uint8
	vals  []float32
}

// record encodes the float32 record r as an fp8 store would hold it and
// returns its code values (unscaled, valid until the next call) and its
// scale: the score of the stored record is scale times the dot product
// of the split query with the values (package fp8, "Score").
func (s *fp8Scratch) record(r []float32) ([]float32, float32) {
	if cap(s.codes) < len(r) {
		s.codes = make([]uint8, len(r))
		s.vals = make([]float32, len(r))
	}
	codes, vals := s.codes[:len(r)], s.vals[:len(r)]
	scale := fp8.Encode(codes, r)
	fp8.Unscaled(vals, codes)
	return vals, scale
}

// decodeKV writes the elements of fp8 K/V codes under their record's
// scale (plan.FP8; kernels/fp8, "KV records"): dst[i] =
// fp8.Value(codes[i]) * scale.
func decodeKV(dst []float32, codes []uint8, scale float32) {
	tab := fp8.Table()
	dst = dst[:len(codes)]
	for i, c := range codes {
		dst[i] = tab[c] * scale
	}
}
