package pagestore

import (
	"context"
	"encoding/binary"
	"math"
	"sync"

	"github.com/questrt/questrt/kernels/fp8"
)

// FP8 pages (Config.DType == plan.FP8): the K and V of one (page, layer,
// KV head) are a record of PageSize x HeadDim E4M3 codes with one
// float32 scale (kernels/fp8, "KV records"), the element being
// fp8.Value(code) * scale. The summaries stay float32 and are taken over
// the dequantized stored keys, so the Quest bound holds for the keys
// attention reads (notes, section 3; invariant 1).
//
// Scale: amax/448, amax the largest magnitude over the tokens written to
// the record since its page was handed out (slot 0 starts afresh). An
// append whose tokens raise amax re-quantizes the record's earlier
// tokens from their dequantized values under the new scale (a second
// rounding: an earlier element's error is then at most half a code step
// at the old scale plus half a step at the new one, instead of half a
// step); an append that does not raise it encodes only its own tokens.
// A rollback inside the page keeps the scale (it may then exceed the
// remaining tokens' amax/448: a coarser grid, never a saturation).
// Copy-on-write copies codes and scales, so a fork reads the same
// elements. The GPU should do the same on append: the record is one
// S x D block (2 KiB at S = 16, D = 128), which a warp can reread and
// rewrite when the scale grows.
//
// Offload (Config.DeviceBudget > 0): the pool arrays hold the records of
// DeviceBudget device slots (codes and scales indexed by slot, summaries
// by physical page, as for float32). An offloaded page's tier payload is
// its records as stored, in persistence's slab layout (packFP8: per
// layer the K codes, the K scales, the V codes, the V scales;
// tier.PagePayloadBytes): eviction and recall copy them byte for byte,
// never dequantizing or re-encoding, and the summaries stay in the pool,
// unchanged.

// fp8Scratch holds the float32 elements of one record while it is
// re-encoded (a sync.Pool: appends of different sequences run
// concurrently).
var fp8Scratch = sync.Pool{New: func() any { return new([]float32) }}

// writeFP8 is Write for fp8 records. With offload the records live in
// the page's device slot, which it brings in first (one page at a time,
// as Write does), and the summaries by physical page.
func (h *hostData) writeFP8(layer int, pages []int32, slot int, k, v []float32) error {
	if h.res != nil {
		h.res.mu.Lock()
		defer h.res.mu.Unlock()
	}
	ld := h.layers[layer]
	S, H, D := h.cfg.PageSize, h.cfg.KVHeads, h.cfg.HeadDim
	bp := fp8Scratch.Get().(*[]float32)
	defer fp8Scratch.Put(bp)
	if cap(*bp) < S*D {
		*bp = make([]float32, S*D)
	}
	x := (*bp)[:S*D]
	n := len(k) / h.tok
	for t, i := 0, 0; t < n; i++ {
		cnt := min(S-slot, n-t)
		phys := int(pages[i])
		kvp, err := h.kvSlot(pages[i:i+1], true)
		if err != nil {
			return err
		}
		for hd := 0; hd < H; hd++ {
			rec := kvp*H + hd
			base := rec * h.headBlk
			for _, a := range [2]struct {
				src   []float32
				codes []uint8
				scale []float32
			}{{k, ld.K8, ld.KScale}, {v, ld.V8, ld.VScale}} {
				codes := a.codes[base : base+S*D]
				old := a.scale[rec]
				if slot == 0 {
					old = 0
				}
				var amax float32
				for r := 0; r < cnt; r++ {
					src := (t+r)*h.tok + hd*D
					row := a.src[src : src+D]
					copy(x[(slot+r)*D:], row)
					amax = max(amax, fp8.AbsMax(row))
				}
				sc := max(old, fp8.KVScale(amax))
				if sc != old && slot > 0 {
					// The scale grows: re-quantize the earlier tokens.
					fp8.Decode(x[:slot*D], codes[:slot*D], old)
					fp8.EncodeKV(codes[:slot*D], x[:slot*D], sc)
				}
				fp8.EncodeKV(codes[slot*D:(slot+cnt)*D], x[slot*D:(slot+cnt)*D], sc)
				a.scale[rec] = sc
			}
			h.summarizeFP8(ld, phys, kvp, hd, slot+cnt, x)
		}
		t += cnt
		slot = 0
	}
	return nil
}

// copySlots makes pages dst and src resident when the store offloads
// (h.res.mu held), marks dst's tier copy stale and returns the K/V
// indices of both in the pool arrays (their ids without offload).
func (h *hostData) copySlots(dst, src int32) (kvd, kvs int, err error) {
	r := h.res
	if r == nil {
		return int(dst), int(src), nil
	}
	two := [2]int32{dst, src}
	if _, err := r.ensure(context.Background(), two[:], false); err != nil {
		return 0, 0, err
	}
	r.clean[dst] = false
	return int(r.slot[dst]), int(r.slot[src]), nil
}

// kvSlot makes pages resident when the store offloads (h.res.mu held)
// and returns the index of pages[0]'s K/V in the pool arrays: its
// device slot, or its id without offload. dirty marks pages[0]'s tier
// copy stale (its K/V are about to change).
func (h *hostData) kvSlot(pages []int32, dirty bool) (int, error) {
	if h.res == nil {
		return int(pages[0]), nil
	}
	if _, err := h.res.ensure(context.Background(), pages, false); err != nil {
		return 0, err
	}
	if dirty {
		h.res.clean[pages[0]] = false
	}
	return int(h.res.slot[pages[0]]), nil
}

// summarizeFP8 recomputes the summary of (phys, hd) in ld over the first
// valid dequantized keys of the record at K/V index kvp (phys, or its
// device slot with offload; x is scratch of at least valid*D floats).
func (h *hostData) summarizeFP8(ld LayerData, phys, kvp, hd, valid int, x []float32) {
	rec := kvp*h.cfg.KVHeads + hd
	base := rec * h.headBlk
	h.summarizeCodes(ld, phys, hd, ld.K8[base:base+h.headBlk], ld.KScale[rec], valid, x)
}

// summarizeCodes sets the summary of (phys, hd) in ld to the box of the
// first valid keys of one K record given by its codes and scale.
func (h *hostData) summarizeCodes(ld LayerData, phys, hd int, codes []uint8, scale float32, valid int, x []float32) {
	D := h.cfg.HeadDim
	keys := x[:valid*D]
	fp8.Decode(keys, codes[:valid*D], scale)
	so := phys*h.sumPage + hd*h.sumRec
	mn := ld.Summary[so : so+D : so+D]
	mx := ld.Summary[so+D : so+2*D : so+2*D]
	empty(mn, mx)
	for r := 0; r < valid; r++ {
		widen(mn, mx, keys[r*D:(r+1)*D])
	}
}

// copyFP8 is Copy for fp8 records: codes of the valid slots, scales and
// summaries (with offload, between the device slots of both pages).
func (h *hostData) copyFP8(dst, src int32, valid []int) error {
	D, H := h.cfg.HeadDim, h.cfg.KVHeads
	if h.res != nil {
		h.res.mu.Lock()
		defer h.res.mu.Unlock()
	}
	kvd, kvs, err := h.copySlots(dst, src)
	if err != nil {
		return err
	}
	ss, ds := int(src)*h.sumPage, int(dst)*h.sumPage
	for l, ld := range h.layers {
		n := valid[l] * D
		for hd := 0; hd < H; hd++ {
			rs, rd := kvs*H+hd, kvd*H+hd
			a, b := rs*h.headBlk, rd*h.headBlk
			copy(ld.K8[b:b+n], ld.K8[a:a+n])
			copy(ld.V8[b:b+n], ld.V8[a:a+n])
			ld.KScale[rd], ld.VScale[rd] = ld.KScale[rs], ld.VScale[rs]
		}
		copy(ld.Summary[ds:ds+h.sumPage], ld.Summary[ss:ss+h.sumPage])
	}
	return nil
}

// rescanFP8 is Rescan for fp8 records: the summaries of page p over its
// first valid dequantized keys in every layer.
func (h *hostData) rescanFP8(p int32, valid int) error {
	if h.res != nil {
		h.res.mu.Lock()
		defer h.res.mu.Unlock()
	}
	one := [1]int32{p}
	kvp, err := h.kvSlot(one[:], false)
	if err != nil {
		return err
	}
	bp := fp8Scratch.Get().(*[]float32)
	defer fp8Scratch.Put(bp)
	if n := h.cfg.PageSize * h.cfg.HeadDim; cap(*bp) < n {
		*bp = make([]float32, n)
	}
	for _, ld := range h.layers {
		for hd := 0; hd < h.cfg.KVHeads; hd++ {
			h.summarizeFP8(ld, int(p), kvp, hd, valid, *bp)
		}
	}
	return nil
}

// fp8LayerBytes is the bytes of one layer of an fp8 payload: K codes,
// K scales, V codes, V scales (packFP8's layout).
func fp8LayerBytes(blk, heads int) int { return 2 * (blk + 4*heads) }

// unpackFP8 copies payload b (packFP8's layout) into the records at K/V
// index p of every layer (a physical page, or a device slot with
// offload): the inverse of packFP8, byte for byte.
func unpackFP8(layers []LayerData, blk, heads int, p int32, b []byte) {
	o, r := int(p)*blk, int(p)*heads
	for _, ld := range layers {
		for _, a := range [2]struct {
			codes  []uint8
			scales []float32
		}{{ld.K8, ld.KScale}, {ld.V8, ld.VScale}} {
			b = b[copy(a.codes[o:o+blk], b):]
			for i := range heads {
				a.scales[r+i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
				b = b[4:]
			}
		}
	}
}

// decodeFP8Payload dequantizes one layer's K and V of payload b
// (packFP8's layout; blk codes per K or V, heads records) into k and v.
func decodeFP8Payload(layer, blk, heads int, b []byte, k, v []float32) {
	b = b[layer*fp8LayerBytes(blk, heads):]
	hb := blk / heads
	for _, a := range [2][]float32{k, v} {
		codes, scales := b[:blk], b[blk:blk+4*heads]
		for hd := range heads {
			sc := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*hd:]))
			fp8.Decode(a[hd*hb:(hd+1)*hb], codes[hd*hb:(hd+1)*hb], sc)
		}
		b = b[blk+4*heads:]
	}
}

// decodeFP8Records dequantizes the K and V records at K/V index p of ld
// (a physical page, or a device slot with offload) into k and v.
func decodeFP8Records(ld LayerData, blk, heads int, p int32, k, v []float32) {
	o, hb := int(p)*blk, blk/heads
	for hd := range heads {
		rec, b := int(p)*heads+hd, hd*hb
		fp8.Decode(k[b:b+hb], ld.K8[o+b:o+b+hb], ld.KScale[rec])
		fp8.Decode(v[b:b+hb], ld.V8[o+b:o+b+hb], ld.VScale[rec])
	}
}
