// Package fp8 encodes Quest page summaries in 8-bit floats (OCP FP8 E4M3,
// the "fn" variant: no infinities, one NaN code per sign, largest finite
// magnitude 448) with outward rounding, so that the score computed from
// the stored records is still an upper bound of q.k over the page's keys
// (notes, section 3: the minimum rounded toward -Inf, the maximum toward
// +Inf).
//
// # Record
//
// One record is one (physical page, KV head) summary: D minima then D
// maxima, the same order as the 16-bit and 32-bit records. Its encoded
// form is
//
//   - codes: 2*D bytes, one E4M3 code per value, in the record's order;
//   - scale: one float32, a power of two 2^e, e in [-126, 120].
//
// The value of code c is Value(c) * scale, exact in float32 (a code is a
// multiple of 2^-9 below 448, the scale a power of two of a normal
// float32). In the device pools of the CUDA backend the codes of a layer
// are one array [pages][KVHeads][2][D] of bytes and the scales a second
// array [pages][KVHeads] of float32, next to the 16-bit records they are
// encoded from (which stay the exact master copy that appends, rescans
// and copies update); the score kernel reads only the codes and the
// scales: 2*D+4 bytes per record instead of 4*D.
//
// # Scale
//
// The scale of a record of finite values is the smallest power of two
// 2^e with max|x|/2^e <= 448 (so no code overflows; at least 2^-126), or
// 1 for the all-zero record (every code 0). Scaling by a power of two
// is exact; the only rounding is the choice of code: the minima take
// the largest code value <= x/2^e, the maxima the smallest >= x/2^e,
// subnormal codes included.
//
// # Special records
//
// E4M3fn has no infinity, so records with non-finite values are encoded
// whole, with scale +Inf:
//
//   - the empty box (every minimum +Inf and every maximum -Inf: a fresh
//     page's summary): minima code +448, maxima code -448, decoding to
//     exactly +Inf and -Inf;
//   - any other record with an infinite or NaN value (an infinite or NaN
//     key): minima -448 and maxima +448, decoding to -Inf and +Inf, the
//     box of all space, so the page's score is +Inf (the page is always
//     a candidate) instead of NaN.
//
// # Score
//
// Backends compute the score of a record as
// scale * sum_j (min(q_j,0)*Value(min code_j) + max(q_j,0)*Value(max code_j))
// in float32: the dot product of the split query with the record's code
// values, times the scale. With a finite power-of-two scale that equals
// the score of the decoded values; for the special records it gives -Inf
// (empty box) or +Inf (all space) for every query with a nonzero entry.
package fp8
