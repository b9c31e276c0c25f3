package backendtest

import (
	"encoding/binary"
	"errors"
	"math"

	"github.com/questrt/questrt/kernels/fp8"
)

// The K/V of a FakePool in either of its types, float32 or fp8 records
// (kernels/fp8 "KV records": a record is the PageSize x HeadDim codes of
// one (page or slot, KV head) with one float32 scale, the element being
// fp8.Value(code) * scale). The device they pretend to be quantizes on
// append: a record's scale is amax/448 over the tokens written to it
// since its slot 0 was, and grows (re-encoding the record's earlier
// tokens from their elements) when an append raises amax.

// key is element j of the key of token r of KV head h at K/V index kv.
func (p *FakePool) key(kv int32, h, r, j int) float32 {
	i := ((int(kv)*p.kvh+h)*p.s+r)*p.d + j
	if !p.FP8() {
		return p.K[i]
	}
	x := [1]float32{}
	fp8.Decode(x[:], p.K8[i:i+1], p.KScale[int(kv)*p.kvh+h])
	return x[0]
}

// readKV returns float32 copies of the K and V at K/V index kv (fp8
// records decoded).
func (p *FakePool) readKV(kv int32) (k, v []float32) {
	n := p.kvh * p.s * p.d
	if !p.FP8() {
		return append([]float32(nil), p.K[int(kv)*n:][:n]...), append([]float32(nil), p.V[int(kv)*n:][:n]...)
	}
	k, v = make([]float32, n), make([]float32, n)
	rec := p.s * p.d
	for h := range p.kvh {
		i := int(kv)*p.kvh + h
		fp8.Decode(k[h*rec:][:rec], p.K8[i*rec:][:rec], p.KScale[i])
		fp8.Decode(v[h*rec:][:rec], p.V8[i*rec:][:rec], p.VScale[i])
	}
	return k, v
}

// copyKV copies the K/V at index src to dst (codes and scales for fp8).
func (p *FakePool) copyKV(dst, src int32) {
	n := p.kvh * p.s * p.d
	if !p.FP8() {
		copy(p.K[int(dst)*n:][:n], p.K[int(src)*n:])
		copy(p.V[int(dst)*n:][:n], p.V[int(src)*n:])
		return
	}
	copy(p.K8[int(dst)*n:][:n], p.K8[int(src)*n:])
	copy(p.V8[int(dst)*n:][:n], p.V8[int(src)*n:])
	copy(p.KScale[int(dst)*p.kvh:][:p.kvh], p.KScale[int(src)*p.kvh:])
	copy(p.VScale[int(dst)*p.kvh:][:p.kvh], p.VScale[int(src)*p.kvh:])
}

// payloadBytes is the bytes of one slot in the tier (move's layout).
func (p *FakePool) payloadBytes() int {
	n := p.kvh * p.s * p.d
	if p.FP8() {
		return 2 * (n + 4*p.kvh)
	}
	return 2 * 4 * n
}

// move copies the K/V at index kv to the front of b (save) or from it,
// and returns the rest of b. The layout is pagestore's tier payload of
// one layer: float32 K then V, little-endian; for fp8 records the K
// codes, the K scales, the V codes, the V scales (pagestore's packFP8).
func (p *FakePool) move(kv int32, b []byte, save bool) []byte {
	n := p.kvh * p.s * p.d
	words := func(a []float32) {
		for i := range a {
			if save {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(a[i]))
			} else {
				a[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
		}
		b = b[4*len(a):]
	}
	if !p.FP8() {
		words(p.K[int(kv)*n:][:n])
		words(p.V[int(kv)*n:][:n])
		return b
	}
	for _, r := range [2]struct {
		codes  []uint8
		scales []float32
	}{{p.K8, p.KScale}, {p.V8, p.VScale}} {
		c := r.codes[int(kv)*n:][:n]
		if save {
			copy(b, c)
		} else {
			copy(c, b)
		}
		b = b[n:]
		words(r.scales[int(kv)*p.kvh:][:p.kvh])
	}
	return b
}

// write8 is write for fp8 records: token by token into each (page, head)
// record of K and V, then the touched pages' summaries over their valid
// dequantized keys.
func (p *FakePool) write8(pages, kv []int32, kvOK func(int32) error, slot int, k, v []float32) error {
	tok, rec := p.kvh*p.d, p.s*p.d
	n := len(k) / tok
	elems := make([]float32, rec)
	for i := range pages {
		if err := errors.Join(p.page(pages[i]), kvOK(kv[i])); err != nil {
			return err
		}
	}
	for i := range pages {
		// Tokens [lo, hi) of the call land in slots [first, first+hi-lo).
		first := 0
		lo := i*p.s - slot
		if i == 0 {
			first, lo = slot, 0
		}
		hi := min(n, lo+p.s-first)
		for h := range p.kvh {
			r := int(kv[i])*p.kvh + h
			for _, x := range [2]struct {
				src   []float32
				codes []uint8
				scale *float32
			}{{k, p.K8[r*rec:][:rec], &p.KScale[r]}, {v, p.V8[r*rec:][:rec], &p.VScale[r]}} {
				prev := float32(0)
				if first > 0 {
					prev = *x.scale
				}
				var amax float32
				for t := lo; t < hi; t++ {
					row := x.src[t*tok+h*p.d:][:p.d]
					amax = max(amax, fp8.AbsMax(row))
					copy(elems[(first+t-lo)*p.d:], row)
				}
				scale := max(prev, fp8.KVScale(amax))
				if first > 0 && scale != prev {
					fp8.Decode(elems[:first*p.d], x.codes[:first*p.d], prev)
					fp8.EncodeKV(x.codes[:first*p.d], elems[:first*p.d], scale)
				}
				end := (first + hi - lo) * p.d
				fp8.EncodeKV(x.codes[first*p.d:end], elems[first*p.d:end], scale)
				*x.scale = scale
			}
		}
		p.rescan(pages[i], kv[i], first+hi-lo)
	}
	return nil
}
