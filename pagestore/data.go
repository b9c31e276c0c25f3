package pagestore

import (
	"context"
	"math"

	"github.com/questrt/questrt/plan"
)

// PageData holds the contents of a store's pages: K, V and summaries of
// every layer, indexed by physical page id. The [Store] owns everything
// else (page tables, lengths, refcounts, the free list) and calls PageData
// for every change of contents, so the contents can live where the kernels
// read them: in host arrays ([New]) or in a device's memory ([NewWithData];
// the shard package wires a CUDA backend's pools in).
//
// The store calls the methods with the sequence's lock held; calls for
// different sequences may run concurrently but never touch the same
// physical page. Inputs are already checked (finite values, whole tokens,
// page ids inside the pool), so an error means the storage failed (a
// device fault); the store returns it wrapped in [ErrData].
type PageData interface {
	// Write stores the tokens k, v ([n][KVHeads][HeadDim]) of one layer
	// into slots slot, slot+1, ... of pages[0], continuing in pages[1],
	// ... (slot < PageSize; pages holds exactly the pages the tokens
	// reach), and widens those pages' summaries of that layer with the
	// keys (eq. 8). The token written to slot 0 of a page starts that
	// page's summary afresh.
	Write(layer int, pages []int32, slot int, k, v []float32) error
	// Reset sets the summaries of pages to the empty box (+Inf minima,
	// -Inf maxima) in every layer and KV head.
	Reset(pages []int32) error
	// Copy copies page src to page dst: in every layer l the first
	// valid[l] slots of K and V (the rest of dst's slots become
	// unspecified) and the summaries.
	Copy(dst, src int32, valid []int) error
	// Rescan recomputes the summaries of page p in every layer and KV head
	// from its first valid keys (eq. 14; 1 <= valid <= PageSize).
	Rescan(p int32, valid int) error
	// Table follows the page tables (for data that keeps a copy next to
	// the pages, as a device does): sequence id's table now holds pages
	// at entries [at, at+len(pages)) and has n entries; the other entries
	// below n are unchanged. A sequence starts with an empty table.
	Table(id SeqID, at int, pages []int32, n int) error
	// Drop forgets the page table of a released sequence.
	Drop(id SeqID) error
}

// hostData is the PageData of [New]: float32 arrays in host memory, laid
// out as the package doc describes. With offload on (res set) the K/V
// arrays have DeviceBudget slots: Write, Copy and Rescan bring the pages
// they touch into the device pool first (res.ensure) and address K/V by
// device slot, summaries by physical page.
type hostData struct {
	cfg    Config
	layers []LayerData
	res    *residency // nil: offload off, K/V indexed by physical page
	fp8    bool       // K/V are fp8 records (plan.FP8; see fp8.go)

	// strides, in floats
	tok     int // KVHeads*HeadDim: one token of k or v
	headBlk int // PageSize*HeadDim: one (page, head) K/V block
	pageBlk int // KVHeads*PageSize*HeadDim: one page of K or V
	sumRec  int // 2*HeadDim: one (page, head) summary record
	sumPage int // KVHeads*2*HeadDim: one page of summaries
	sub     int // Config.SubBoxes when > 1, else 0 (no sub-boxes kept)
	subW    int // PageSize/sub: token slots per sub-box
}

func newHostData(cfg Config, sz sizes) *hostData {
	h := &hostData{
		cfg:     cfg,
		layers:  make([]LayerData, cfg.Layers),
		tok:     cfg.KVHeads * cfg.HeadDim,
		headBlk: cfg.PageSize * cfg.HeadDim,
		pageBlk: cfg.KVHeads * cfg.PageSize * cfg.HeadDim,
		sumRec:  2 * cfg.HeadDim,
		sumPage: cfg.KVHeads * 2 * cfg.HeadDim,
		fp8:     cfg.DType == plan.FP8,
	}
	if cfg.SubBoxes > 1 {
		h.sub, h.subW = cfg.SubBoxes, cfg.PageSize/cfg.SubBoxes
	}
	if h.fp8 {
		for l := range h.layers {
			h.layers[l] = LayerData{
				K8: make([]uint8, sz.layerKV), V8: make([]uint8, sz.layerKV),
				KScale: make([]float32, sz.layerRec), VScale: make([]float32, sz.layerRec),
				Summary: make([]float32, sz.layerSum),
			}
		}
		return h
	}
	for l := range h.layers {
		h.layers[l] = LayerData{
			K:       make([]float32, sz.layerKV),
			V:       make([]float32, sz.layerKV),
			Summary: make([]float32, sz.layerSum),
		}
		if sz.layerSub > 0 {
			h.layers[l].Sub = make([]float32, sz.layerSub)
		}
	}
	return h
}

// subRec returns the sub-box summary records of one (page, KV head) of a
// layer: c records of 2*HeadDim floats (mins then maxes), or nil when no
// sub-boxes are kept.
func (h *hostData) subRec(ld LayerData, phys, hd int) []float32 {
	if h.sub == 0 {
		return nil
	}
	n := h.sub * h.sumRec
	o := (phys*h.cfg.KVHeads + hd) * n
	return ld.Sub[o : o+n : o+n]
}

// widenSub widens the sub-box of token slot slot in the records subs of
// one (page, KV head) with key k.
func (h *hostData) widenSub(subs []float32, slot int, k []float32) {
	D := h.cfg.HeadDim
	o := slot / h.subW * h.sumRec
	widen(subs[o:o+D], subs[o+D:o+2*D], k)
}

// emptySubs sets every sub-box record of subs to the empty box.
func (h *hostData) emptySubs(subs []float32) {
	D := h.cfg.HeadDim
	for o := 0; o < len(subs); o += h.sumRec {
		empty(subs[o:o+D], subs[o+D:o+2*D])
	}
}

func (h *hostData) Write(layer int, pages []int32, slot int, k, v []float32) error {
	if h.fp8 {
		return h.writeFP8(layer, pages, slot, k, v)
	}
	if h.res != nil {
		h.res.mu.Lock()
		defer h.res.mu.Unlock()
	}
	ld := h.layers[layer]
	S, H, D := h.cfg.PageSize, h.cfg.KVHeads, h.cfg.HeadDim
	n := len(k) / h.tok
	for t, i := 0, 0; t < n; i++ {
		cnt := min(S-slot, n-t)
		phys := int(pages[i])
		kvp := phys // where the page's K/V are
		if h.res != nil {
			// One page at a time: a write may span more pages than
			// the device holds; the pages written before this one may
			// be evicted for it.
			if _, err := h.res.ensure(context.Background(), pages[i:i+1], false); err != nil {
				return err
			}
			kvp = int(h.res.slot[phys])
			h.res.clean[phys] = false
		}
		for hd := 0; hd < H; hd++ {
			base := kvp*h.pageBlk + hd*h.headBlk + slot*D
			so := phys*h.sumPage + hd*h.sumRec
			mn := ld.Summary[so : so+D : so+D]
			mx := ld.Summary[so+D : so+2*D : so+2*D]
			subs := h.subRec(ld, phys, hd)
			if slot == 0 {
				empty(mn, mx)
				h.emptySubs(subs)
			}
			for r := 0; r < cnt; r++ {
				src := (t+r)*h.tok + hd*D
				kr := k[src : src+D : src+D]
				dst := base + r*D
				copy(ld.K[dst:dst+D], kr)
				copy(ld.V[dst:dst+D], v[src:src+D])
				widen(mn, mx, kr)
				if subs != nil {
					h.widenSub(subs, slot+r, kr)
				}
			}
		}
		t += cnt
		slot = 0
	}
	return nil
}

// widen applies eq. 8: mn = min(mn, k), mx = max(mx, k) element-wise.
func widen(mn, mx, k []float32) {
	mn = mn[:len(k)]
	mx = mx[:len(k)]
	// The builtins compile to branch-free MINSS/MAXSS sequences: about twice
	// as fast as compare-and-branch on fresh pages, where which key wins is
	// unpredictable. Keys are finite (checked by Append).
	for j, x := range k {
		mn[j] = min(mn[j], x)
		mx[j] = max(mx[j], x)
	}
}

// empty sets a record to the empty box.
func empty(mn, mx []float32) {
	inf := float32(math.Inf(1))
	for j := range mn {
		mn[j], mx[j] = inf, -inf
	}
}

func (h *hostData) Reset(pages []int32) error {
	D := h.cfg.HeadDim
	for _, p := range pages {
		o := int(p) * h.sumPage
		for _, ld := range h.layers {
			rec := ld.Summary[o : o+h.sumPage]
			for hd := 0; hd < h.cfg.KVHeads; hd++ {
				r := rec[hd*h.sumRec : (hd+1)*h.sumRec]
				empty(r[:D], r[D:])
				h.emptySubs(h.subRec(ld, int(p), hd))
			}
		}
	}
	return nil
}

func (h *hostData) Copy(dst, src int32, valid []int) error {
	if h.fp8 {
		return h.copyFP8(dst, src, valid)
	}
	D := h.cfg.HeadDim
	if h.res != nil {
		h.res.mu.Lock()
		defer h.res.mu.Unlock()
	}
	kvd, kvs, err := h.copySlots(dst, src)
	if err != nil {
		return err
	}
	so, do := kvs*h.pageBlk, kvd*h.pageBlk
	ss, ds := int(src)*h.sumPage, int(dst)*h.sumPage
	for l, ld := range h.layers {
		n := valid[l] * D
		for hd := 0; hd < h.cfg.KVHeads; hd++ {
			a, b := so+hd*h.headBlk, do+hd*h.headBlk
			copy(ld.K[b:b+n], ld.K[a:a+n])
			copy(ld.V[b:b+n], ld.V[a:a+n])
		}
		copy(ld.Summary[ds:ds+h.sumPage], ld.Summary[ss:ss+h.sumPage])
		if h.sub > 0 {
			n := h.sub * h.sumPage
			copy(ld.Sub[int(dst)*n:][:n], ld.Sub[int(src)*n:][:n])
		}
	}
	return nil
}

// Table is a no-op: the store's own page tables are the host's.
func (h *hostData) Table(SeqID, int, []int32, int) error { return nil }

// Drop is a no-op (see Table).
func (h *hostData) Drop(SeqID) error { return nil }

func (h *hostData) Rescan(p int32, valid int) error {
	if h.fp8 {
		return h.rescanFP8(p, valid)
	}
	D := h.cfg.HeadDim
	kvp := p
	if h.res != nil {
		r := h.res
		r.mu.Lock()
		defer r.mu.Unlock()
		one := [1]int32{p}
		if _, err := r.ensure(context.Background(), one[:], false); err != nil {
			return err
		}
		kvp = r.slot[p]
	}
	for _, ld := range h.layers {
		for hd := 0; hd < h.cfg.KVHeads; hd++ {
			so := int(p)*h.sumPage + hd*h.sumRec
			mn := ld.Summary[so : so+D : so+D]
			mx := ld.Summary[so+D : so+2*D : so+2*D]
			empty(mn, mx)
			subs := h.subRec(ld, int(p), hd)
			h.emptySubs(subs)
			ko := int(kvp)*h.pageBlk + hd*h.headBlk
			for r := 0; r < valid; r++ {
				kr := ld.K[ko+r*D : ko+(r+1)*D]
				widen(mn, mx, kr)
				if subs != nil {
					h.widenSub(subs, r, kr)
				}
			}
		}
	}
	return nil
}
