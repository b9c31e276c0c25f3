package kernels

import (
	"fmt"
	"math"
)

// Dot returns the float32 dot product of a and b[:len(a)], vectorized where
// the CPU allows. It is exported for diagnostics that run beside the kernels.
func Dot(a, b []float32) float32 { return dot(a, b) }

// PageMax writes, in Score's output layout, the true maximum of q.k over
// each page's valid keys (unscaled): the oracle score of the ablations in
// the notes (2.2). It reads every key, so it costs as much as dense QK; it
// is a diagnostic that runs on CPU memory, not part of Backend.
func PageMax(s Shape, l Layer, b *Batch, q []float32, mode GQAMode, out []float32) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("page max: %w", err)
	}
	if err := b.Validate(s, l); err != nil {
		return fmt.Errorf("page max: %w", err)
	}
	rows := s.Rows(mode)
	d, g := s.HeadDim, s.Group()
	if len(q) != b.Len()*s.QHeads*d || len(out) < len(b.Pages)*rows {
		return fmt.Errorf("page max: query %d or output %d floats do not fit the batch", len(q), len(out))
	}
	var krec []float32 // an fp8 layer's record, dequantized
	if l.FP8() {
		krec = make([]float32, s.PageSize*d)
	}
	for seq := range b.Len() {
		np := b.NumPages(seq)
		o := out[b.ScoreOffset(seq, rows):]
		for p := range np {
			phys := int(b.Pages[int(b.Indptr[seq])+p])
			n := s.PageSize
			if p == np-1 {
				n = int(b.LastLen[seq])
			}
			for h := range s.QHeads {
				kvh := h / g
				qh := q[(seq*s.QHeads+h)*d:][:d]
				best := float32(math.Inf(-1))
				base := (phys*s.KVHeads + kvh) * s.PageSize * d
				keys := l.K
				if l.FP8() {
					decodeKV(krec[:n*d], l.K8[base:][:n*d], l.KScale[phys*s.KVHeads+kvh])
					keys, base = krec, 0
				}
				for t := range n {
					best = max(best, dot(qh, keys[base+t*d:][:d]))
				}
				if mode == PerHead {
					o[h*np+p] = best
				} else if h%g == 0 || best > o[kvh*np+p] {
					o[kvh*np+p] = best
				}
			}
		}
	}
	return nil
}
