//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/fp8"
	"github.com/questrt/questrt/plan"
)

// fp8 K/V records (plan.FP8, kvfp8.cuh): a DeviceLayer of DType plan.FP8
// holds K and V as E4M3fn codes in the layout of the other types
// ([pages][KVHeads][S][D], one byte each), the float32 scale of every
// (page, KV head) record in KScale and VScale ([pages][KVHeads]), and
// float32 summaries taken over the dequantized keys: the records of the
// CPU page store (pagestore/fp8.go, kernels.Layer K8/V8/KScale/VScale),
// byte for byte, so that a host copy of a page is the CPU's record. The
// append quantizes on the device with the CPU's arithmetic (the scale
// grows to amax/448 and re-encodes the page's earlier slots when it
// does), rescans and copies keep the scales, and attention dequantizes
// in the kernel (quest_attend_fp8, CUDA cores). Scoring reads the
// float32 summaries (or their fp8 copy, Config.SummaryDType) as for any
// other type. Slot pools (offload, slots.go) hold fp8 records too: codes
// and scales indexed by slot, summaries by physical page; a page's tier
// payload is its records as stored (codes and scales, packFP8's layout).
// The GPU prefill reads fp8 pages too (prefill_attend_fp8_*, prefill.go).

// kv8 reports whether l holds fp8 K/V records.
func (l *DeviceLayer) kv8() bool { return l.DType == plan.FP8 }

// sumType is the storage type of l's summaries: float32 for fp8 K/V,
// else l.DType.
func (l *DeviceLayer) sumType() plan.DType {
	if l.kv8() {
		return plan.Float32
	}
	return l.DType
}

// allocScales gives an fp8 layer its K and V scales (zero: every record
// decodes to 0 until written). On failure it frees l's K, V and
// summaries too, as allocFP8 does.
func (b *Backend) allocScales(l *DeviceLayer) error {
	if !l.kv8() {
		return nil
	}
	n := int64(l.kvPages()) * int64(l.KVHeads) * 4
	var err error
	if l.KScale, err = cu.MemAlloc(n); err == nil {
		if l.VScale, err = cu.MemAlloc(n); err != nil {
			cu.MemFree(l.KScale)
			l.KScale = 0
		}
	}
	if err == nil {
		err = cu.MemsetD32(l.KScale, 0, n/4)
		if err == nil {
			err = cu.MemsetD32(l.VScale, 0, n/4)
		}
		if err != nil {
			cu.MemFree(l.KScale)
			cu.MemFree(l.VScale)
			l.KScale, l.VScale = 0, 0
		}
	}
	if err != nil {
		for _, p := range []cu.DevicePtr{l.K, l.V, l.Summary} {
			if p != 0 {
				cu.MemFree(p)
			}
		}
		l.K, l.V, l.Summary = 0, 0, 0
		return fmt.Errorf("cuda: alloc fp8 K/V scales (%d bytes each): %w", n, err)
	}
	return nil
}

// freeScales releases an fp8 layer's scales, if any.
func freeScales(l *DeviceLayer) {
	for _, p := range []cu.DevicePtr{l.KScale, l.VScale} {
		if p != 0 {
			cu.MemFree(p)
		}
	}
	l.KScale, l.VScale = 0, 0
}

// append8 queues quest_append_fp8 for n tokens (float32 in device memory
// at kp and vp) at positions pos0.. of the device page table pt (touched
// pages from pos0/S on); st, when not 0, holds the pages' slots in a slot
// pool (device goroutine only).
func (b *Backend) append8(l *DeviceLayer, pt, st, kp, vp cu.DevicePtr, pos0, n, touched int) error {
	return b.launch("quest_append_fp8", [3]int{touched, l.KVHeads, 2}, 128, 0,
		u(l.K), u(l.V), u(l.KScale), u(l.VScale), u(l.Summary), u(pt), u(st), u(kp), u(vp), uint64(pos0), uint64(n), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize))
}

// copyScales queues the copy of page src's K and V scales to page dst.
func (b *Backend) copyScales(l *DeviceLayer, dst, src int32) error {
	if !l.kv8() {
		return nil
	}
	size := int64(l.KVHeads) * 4
	for _, base := range []cu.DevicePtr{l.KScale, l.VScale} {
		d, s := base+cu.DevicePtr(int64(dst)*size), base+cu.DevicePtr(int64(src)*size)
		if err := cu.MemcpyDtoDAsync(d, s, size, cu.Stream{}); err != nil {
			return fmt.Errorf("cuda: copy fp8 scales of page %d to %d: %w", src, dst, err)
		}
	}
	return nil
}

// uploadRecords copies a host pool's fp8 records (h.K8, h.V8, h.KScale,
// h.VScale, the CPU layout) into l as they are; nil arrays are skipped.
func (b *Backend) uploadRecords(l *DeviceLayer, h kernels.Layer) error {
	for _, x := range []struct {
		dst cu.DevicePtr
		src unsafe.Pointer
		n   int64
	}{{l.K, ptrOf(h.K8), int64(len(h.K8))}, {l.V, ptrOf(h.V8), int64(len(h.V8))},
		{l.KScale, ptrOf(h.KScale), int64(len(h.KScale)) * 4}, {l.VScale, ptrOf(h.VScale), int64(len(h.VScale)) * 4}} {
		if x.n == 0 {
			continue
		}
		if err := cu.MemcpyHtoD(x.dst, x.src, x.n); err != nil {
			return fmt.Errorf("cuda: upload fp8 records: %w", err)
		}
	}
	return nil
}

// ptrOf is the address of x's first element (nil for an empty x).
func ptrOf[T any](x []T) unsafe.Pointer {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Pointer(&x[0])
}

// Records8 are copies of fp8 K/V records: K and V codes [pages][KVHeads]
// [PageSize][HeadDim] and the scales [pages][KVHeads], the CPU page
// store's layout (kernels.Layer's K8, V8, KScale, VScale).
type Records8 struct {
	K, V           []uint8
	KScale, VScale []float32
}

// ReadRecords waits for the queued work and returns copies of the fp8
// records of pages of pool (a DeviceLayer of DType plan.FP8), page i of
// the result being pages[i]. For tests and diagnostics.
func (b *Backend) ReadRecords(ctx context.Context, pool any, pages []int32) (Records8, error) {
	l, err := devicePool(pool)
	if err != nil {
		return Records8{}, err
	}
	if !l.kv8() || l.Slots > 0 {
		return Records8{}, fmt.Errorf("cuda: read fp8 records of a %v pool (slots %d): want an fp8 page pool", l.DType, l.Slots)
	}
	if err := l.checkPages(pages...); err != nil {
		return Records8{}, err
	}
	blk, H := int64(l.KVHeads*l.PageSize*l.HeadDim), int64(l.KVHeads)
	r := Records8{K: make([]uint8, int64(len(pages))*blk), V: make([]uint8, int64(len(pages))*blk),
		KScale: make([]float32, int64(len(pages))*H), VScale: make([]float32, int64(len(pages))*H)}
	err = b.do(ctx, func() error {
		if err := cu.Synchronize(); err != nil {
			return fmt.Errorf("cuda: read fp8 records: %w", err)
		}
		for i, p := range pages {
			for _, c := range []struct {
				dst  unsafe.Pointer
				base cu.DevicePtr
				size int64
			}{{unsafe.Pointer(&r.K[int64(i)*blk]), l.K, blk}, {unsafe.Pointer(&r.V[int64(i)*blk]), l.V, blk},
				{unsafe.Pointer(&r.KScale[int64(i)*H]), l.KScale, H * 4}, {unsafe.Pointer(&r.VScale[int64(i)*H]), l.VScale, H * 4}} {
				if err := cu.MemcpyDtoH(c.dst, c.base+cu.DevicePtr(int64(p)*c.size), c.size); err != nil {
					return fmt.Errorf("cuda: read fp8 records of page %d: %w", p, err)
				}
			}
		}
		return nil
	})
	return r, err
}

// readDecoded reads n pages of fp8 records from page first on and
// returns their float32 elements (fp8.Decode: code value times scale),
// K and V (device goroutine only).
func (b *Backend) readDecoded(l *DeviceLayer, first int64, n int) (k, v []float32, err error) {
	blk := l.PageSize * l.HeadDim
	recs := n * l.KVHeads
	codes := make([]uint8, recs*blk)
	scales := make([]float32, recs)
	out := [2][]float32{}
	for i, base := range [2][2]cu.DevicePtr{{l.K, l.KScale}, {l.V, l.VScale}} {
		if len(codes) > 0 {
			if err := cu.MemcpyDtoH(unsafe.Pointer(&codes[0]), base[0]+cu.DevicePtr(first*int64(l.KVHeads*blk)), int64(len(codes))); err != nil {
				return nil, nil, fmt.Errorf("cuda: read fp8 codes: %w", err)
			}
			if err := cu.MemcpyDtoH(unsafe.Pointer(&scales[0]), base[1]+cu.DevicePtr(first*int64(l.KVHeads)*4), int64(recs)*4); err != nil {
				return nil, nil, fmt.Errorf("cuda: read fp8 scales: %w", err)
			}
		}
		x := make([]float32, len(codes))
		for r := range recs {
			fp8.Decode(x[r*blk:(r+1)*blk], codes[r*blk:(r+1)*blk], scales[r])
		}
		out[i] = x
	}
	return out[0], out[1], nil
}
