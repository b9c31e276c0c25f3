package backendtest

import (
	"context"
	"fmt"
	"math"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
)

var _ kernels.PrefillAttender = (*QueuedDevice)(nil)

// PrefillTensor implements kernels.PrefillAttender on the pretend device:
// query i of the chunk attends to positions 0 .. start+i of the
// sequence's pages read through its table, with scores, softmax and
// weighted sums in float64 (rounded once into o). It lands the queued
// steps first, as the device's stream would.
func (d *QueuedDevice) PrefillTensor(ctx context.Context, s kernels.Shape, pool, set any, seq uint64, start, n int, q, o decode.Tensor) error {
	p, err := fakePool(pool)
	if err != nil {
		return err
	}
	ts, ok := set.(*fakeTables)
	switch {
	case !ok:
		return fmt.Errorf("fake device: table set %T", set)
	case p.slots > 0:
		return errSlotPool
	case s.Validate() != nil:
		return fmt.Errorf("fake device: prefill: %w", s.Validate())
	case s.KVHeads != p.kvh || s.HeadDim != p.d || s.PageSize != p.s:
		return fmt.Errorf("fake device: prefill: shape %+v for a pool of %d KV heads x %d, pages of %d", s, p.kvh, p.d, p.s)
	case start < 0 || n <= 0:
		return fmt.Errorf("fake device: prefill: %d tokens at position %d", n, start)
	}
	ts.mu.Lock()
	table := append([]int32(nil), ts.m[seq]...)
	ts.mu.Unlock()
	if need := (start + n + s.PageSize - 1) / s.PageSize; len(table) < need {
		return fmt.Errorf("fake device: prefill: sequence %d's table holds %d pages, %d tokens at position %d need %d", seq, len(table), n, start, need)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.landLocked()
	width := s.QHeads * s.HeadDim
	qm, err := d.rows("prefill q", q, n, width)
	if err != nil {
		return err
	}
	om, err := d.rows("prefill o", o, n, width)
	if err != nil {
		return err
	}
	D, g, S := s.HeadDim, s.Group(), s.PageSize
	at := func(pos, h int) int { return ((int(table[pos/S])*p.kvh+h)*S + pos%S) * D }
	scale := 1 / math.Sqrt(float64(D))
	out := make([]float32, len(om)) // q and o may not alias, but write o only once every row is done
	sc := make([]float64, start+n)
	acc := make([]float64, D)
	for i := range n {
		end := start + i + 1
		for hq := range s.QHeads {
			h := hq / g
			qr := qm[(i*s.QHeads+hq)*D:][:D]
			mx := math.Inf(-1)
			for pos := range end {
				kr := p.K[at(pos, h):][:D]
				dot := 0.0
				for j, x := range qr {
					dot += float64(x) * float64(kr[j])
				}
				sc[pos] = dot * scale
				mx = max(mx, sc[pos])
			}
			clear(acc)
			sum := 0.0
			for pos := range end {
				e := math.Exp(sc[pos] - mx)
				sum += e
				vr := p.V[at(pos, h):][:D]
				for j, x := range vr {
					acc[j] += e * float64(x)
				}
			}
			dst := out[(i*s.QHeads+hq)*D:][:D]
			for j := range dst {
				dst[j] = float32(acc[j] / sum)
			}
		}
	}
	copy(om, out)
	return nil
}
