package pagestore

import (
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

// fp8Scratch holds the float32 elements of one record while it is
// re-encoded (a sync.Pool: appends of different sequences run
// concurrently).
var fp8Scratch = sync.Pool{New: func() any { return new([]float32) }}

// writeFP8 is Write for fp8 records.
func (h *hostData) writeFP8(layer int, pages []int32, slot int, k, v []float32) {
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
		for hd := 0; hd < H; hd++ {
			rec := phys*H + hd
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
			h.summarizeFP8(ld, phys, hd, slot+cnt, x)
		}
		t += cnt
		slot = 0
	}
}

// summarizeFP8 recomputes the summary of (phys, hd) in ld over the first
// valid dequantized keys (x is scratch of at least valid*D floats).
func (h *hostData) summarizeFP8(ld LayerData, phys, hd, valid int, x []float32) {
	D := h.cfg.HeadDim
	rec := phys*h.cfg.KVHeads + hd
	base := rec * h.headBlk
	keys := x[:valid*D]
	fp8.Decode(keys, ld.K8[base:base+valid*D], ld.KScale[rec])
	so := phys*h.sumPage + hd*h.sumRec
	mn := ld.Summary[so : so+D : so+D]
	mx := ld.Summary[so+D : so+2*D : so+2*D]
	empty(mn, mx)
	for r := 0; r < valid; r++ {
		widen(mn, mx, keys[r*D:(r+1)*D])
	}
}

// copyFP8 is Copy for fp8 records: codes of the valid slots, scales and
// summaries.
func (h *hostData) copyFP8(dst, src int32, valid []int) {
	D, H := h.cfg.HeadDim, h.cfg.KVHeads
	ss, ds := int(src)*h.sumPage, int(dst)*h.sumPage
	for l, ld := range h.layers {
		n := valid[l] * D
		for hd := 0; hd < H; hd++ {
			rs, rd := int(src)*H+hd, int(dst)*H+hd
			a, b := rs*h.headBlk, rd*h.headBlk
			copy(ld.K8[b:b+n], ld.K8[a:a+n])
			copy(ld.V8[b:b+n], ld.V8[a:a+n])
			ld.KScale[rd], ld.VScale[rd] = ld.KScale[rs], ld.VScale[rs]
		}
		copy(ld.Summary[ds:ds+h.sumPage], ld.Summary[ss:ss+h.sumPage])
	}
}

// rescanFP8 is Rescan for fp8 records: the summaries of page p over its
// first valid dequantized keys in every layer.
func (h *hostData) rescanFP8(p int32, valid int) {
	bp := fp8Scratch.Get().(*[]float32)
	defer fp8Scratch.Put(bp)
	if n := h.cfg.PageSize * h.cfg.HeadDim; cap(*bp) < n {
		*bp = make([]float32, n)
	}
	for _, ld := range h.layers {
		for hd := 0; hd < h.cfg.KVHeads; hd++ {
			h.summarizeFP8(ld, int(p), hd, valid, *bp)
		}
	}
}
