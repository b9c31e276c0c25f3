//go:build cuda

package cuda

import (
	"context"
	"errors"
	"fmt"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Device layers: a layer's page pool in device memory (DeviceLayer), its
// allocation, upload and read-back, and the scratch layer that host-array
// inputs go through.

// DeviceLayer is one layer's page pool in device memory, laid out like the
// CPU pool ([pages][KVHeads][S][D] for K and V, [pages][KVHeads][2][D] for
// summaries) in DType (plan.FP8: K and V as E4M3fn codes with a scale
// per record, summaries float32; see kvfp8.go). Pass it as
// kernels.Layer.Device.
//
// Slots > 0 makes it a slot pool (kernels.SlotStore, slots.go): K and V
// then hold Slots pages, indexed by device slot, and Summary holds Pages
// pages, indexed by physical page.
type DeviceLayer struct {
	K, V, Summary                     cu.DevicePtr
	Pages, KVHeads, HeadDim, PageSize int
	DType                             plan.DType
	Slots                             int
	FP8                               *FP8Summaries // fp8 copy of the summaries (fp8.go), or nil
	// KScale and VScale are, for DType plan.FP8, the float32 scales of
	// the K and V records ([pages][KVHeads]; kvfp8.go); K and V then
	// hold E4M3fn codes and Summary float32.
	KScale, VScale cu.DevicePtr
}

// kvPages is the number of pages K and V hold: Slots for a slot pool,
// else Pages.
func (l *DeviceLayer) kvPages() int {
	if l.Slots > 0 {
		return l.Slots
	}
	return l.Pages
}

// Byte sizes of one page of K (or V) and of summaries.
func (l *DeviceLayer) kvPageBytes() int64 {
	return int64(l.KVHeads*l.PageSize*l.HeadDim) * int64(l.DType.Bytes())
}

func (l *DeviceLayer) sumPageBytes() int64 {
	return int64(l.KVHeads*2*l.HeadDim) * int64(l.sumType().Bytes())
}

func (l *DeviceLayer) checkPages(pages ...int32) error {
	for _, p := range pages {
		if p < 0 || int(p) >= l.Pages {
			return fmt.Errorf("cuda: physical page %d outside pool of %d", p, l.Pages)
		}
	}
	return nil
}

// checkTokens checks a write of the tokens k, v ([n][KVHeads][HeadDim])
// from slot slot of pages pages on: whole tokens that fill exactly those
// pages. what names the call in the error.
func (l *DeviceLayer) checkTokens(what string, pages, slot int, k, v []float32) error {
	return l.checkTokenLens(what, pages, slot, len(k), len(v))
}

// checkTokenLens is checkTokens for k and v of nk and nv floats.
func (l *DeviceLayer) checkTokenLens(what string, pages, slot, nk, nv int) error {
	tok := l.KVHeads * l.HeadDim
	if nk == 0 || nk%tok != 0 || nv != nk {
		return fmt.Errorf("%s: k %d and v %d floats are not whole tokens of %d", what, nk, nv, tok)
	}
	n := nk / tok
	if slot < 0 || slot >= l.PageSize || (slot+n+l.PageSize-1)/l.PageSize != pages {
		return fmt.Errorf("%s: %d tokens from slot %d do not fill exactly %d pages of %d slots", what, n, slot, pages, l.PageSize)
	}
	return nil
}

// NewLayer allocates a device pool of pages pages.
func (b *Backend) NewLayer(ctx context.Context, pages, kvHeads, headDim, pageSize int, dt plan.DType) (*DeviceLayer, error) {
	l := &DeviceLayer{Pages: pages, KVHeads: kvHeads, HeadDim: headDim, PageSize: pageSize, DType: dt}
	if err := b.do(ctx, func() error { return b.allocPool(l) }); err != nil {
		return nil, err
	}
	return l, nil
}

// allocPool allocates l's arrays: K, V and summaries, and the fp8 scales
// and fp8 summaries where l keeps them. On failure nothing stays
// allocated (device goroutine only).
func (b *Backend) allocPool(l *DeviceLayer) error {
	if err := b.allocLayer(l); err != nil {
		return err
	}
	if err := b.allocScales(l); err != nil {
		return err
	}
	if err := b.allocFP8(l); err != nil {
		freeScales(l)
		return err
	}
	return nil
}

func (b *Backend) allocLayer(l *DeviceLayer) error {
	kv := int64(l.kvPages()) * int64(l.KVHeads*l.PageSize*l.HeadDim*l.DType.Bytes())
	sum := int64(l.Pages) * l.sumPageBytes()
	var err error
	if l.K, err = cu.MemAlloc(kv); err != nil {
		return fmt.Errorf("cuda: alloc K (%d bytes): %w", kv, err)
	}
	if l.V, err = cu.MemAlloc(kv); err != nil {
		cu.MemFree(l.K)
		return fmt.Errorf("cuda: alloc V (%d bytes): %w", kv, err)
	}
	if l.Summary, err = cu.MemAlloc(sum); err != nil {
		cu.MemFree(l.K)
		cu.MemFree(l.V)
		return fmt.Errorf("cuda: alloc summaries (%d bytes): %w", sum, err)
	}
	return nil
}

// FreeLayer releases a layer's device memory.
func (b *Backend) FreeLayer(ctx context.Context, l *DeviceLayer) error {
	return b.do(ctx, func() error {
		release(l)
		return nil
	})
}

// release frees l's device memory (device goroutine only).
func release(l *DeviceLayer) {
	for _, p := range []cu.DevicePtr{l.K, l.V, l.Summary} {
		if p != 0 {
			cu.MemFree(p)
		}
	}
	freeFP8(l)
	freeScales(l)
	l.K, l.V, l.Summary, l.Pages = 0, 0, 0, 0
}

// Upload copies a host pool (float32, the CPU layout) into l, converting
// to l.DType; an fp8 layer takes fp8 records (h.K8, h.V8, h.KScale,
// h.VScale, copied as they are) and float32 summaries. Nil host arrays
// are skipped.
func (b *Backend) Upload(ctx context.Context, l *DeviceLayer, h kernels.Layer) error {
	kv, sum := l.Pages*l.KVHeads*l.PageSize*l.HeadDim, l.Pages*l.KVHeads*2*l.HeadDim
	if (h.K != nil && len(h.K) != kv) || (h.V != nil && len(h.V) != kv) || (h.Summary != nil && len(h.Summary) != sum) {
		return fmt.Errorf("cuda upload: host arrays K=%d V=%d summary=%d floats, the layer holds %d and %d", len(h.K), len(h.V), len(h.Summary), kv, sum)
	}
	recs := l.Pages * l.KVHeads
	if (h.K8 != nil && len(h.K8) != kv) || (h.V8 != nil && len(h.V8) != kv) || (h.KScale != nil && len(h.KScale) != recs) || (h.VScale != nil && len(h.VScale) != recs) {
		return fmt.Errorf("cuda upload: fp8 records K8=%d V8=%d codes, scales %d and %d, the layer holds %d and %d", len(h.K8), len(h.V8), len(h.KScale), len(h.VScale), kv, recs)
	}
	return b.do(ctx, func() error {
		if err := b.upload(l, h); err != nil {
			return err
		}
		return cu.Synchronize()
	})
}

func (b *Backend) upload(l *DeviceLayer, h kernels.Layer) error {
	switch {
	case l.kv8() && (h.K != nil || h.V != nil):
		return fmt.Errorf("cuda upload: %w: float32 K/V into an fp8 layer (pass its records: K8, V8, KScale, VScale)", kernels.ErrUnsupportedDType)
	case !l.kv8() && (h.K8 != nil || h.V8 != nil || h.KScale != nil || h.VScale != nil):
		return fmt.Errorf("cuda upload: %w: fp8 records into a %v layer", kernels.ErrUnsupportedDType, l.DType)
	case l.kv8():
		if err := b.uploadRecords(l, h); err != nil {
			return err
		}
	}
	for _, x := range []struct {
		dst cu.DevicePtr
		src []float32
		dt  plan.DType
	}{{l.K, h.K, l.DType}, {l.V, h.V, l.DType}, {l.Summary, h.Summary, l.sumType()}} {
		if x.src != nil {
			if err := b.convert(x.dst, x.dt, x.src); err != nil {
				return err
			}
		}
	}
	if h.Summary != nil {
		return b.encodeFP8(l, 0, 0, len(h.Summary)/(l.KVHeads*2*l.HeadDim))
	}
	return nil
}

// Read copies a device layer back to float32 host arrays (tests); an
// fp8 layer's K and V come back decoded (code value times scale).
func (b *Backend) Read(ctx context.Context, l *DeviceLayer) (kernels.Layer, error) {
	var h kernels.Layer
	err := b.do(ctx, func() error {
		var err error
		if l.kv8() {
			if h.K, h.V, err = b.readDecoded(l, 0, l.Pages); err != nil {
				return err
			}
			h.Summary, err = readAs(b, l.Summary, l.Pages*l.KVHeads*2*l.HeadDim, plan.Float32)
			return err
		}
		if h.K, err = readAs(b, l.K, l.Pages*l.KVHeads*l.PageSize*l.HeadDim, l.DType); err != nil {
			return err
		}
		if h.V, err = readAs(b, l.V, l.Pages*l.KVHeads*l.PageSize*l.HeadDim, l.DType); err != nil {
			return err
		}
		h.Summary, err = readAs(b, l.Summary, l.Pages*l.KVHeads*2*l.HeadDim, l.DType)
		return err
	})
	return h, err
}

// layer resolves the kernels.Layer of a call: its DeviceLayer, or the host
// arrays uploaded into the scratch layer (summaries only when withKV is
// false).
func (b *Backend) layer(s kernels.Shape, l kernels.Layer, withKV bool) (*DeviceLayer, error) {
	if dl, ok := l.Device.(*DeviceLayer); ok {
		if dl.K == 0 || dl.V == 0 || dl.Summary == 0 {
			return nil, errors.New("cuda: device layer is freed or was never allocated")
		}
		if dl.KVHeads != s.KVHeads || dl.HeadDim != s.HeadDim || dl.PageSize != s.PageSize {
			return nil, fmt.Errorf("cuda: device layer %dx%dx%d does not match shape %+v", dl.KVHeads, dl.PageSize, dl.HeadDim, s)
		}
		return dl, nil
	}
	rec := s.KVHeads * 2 * s.HeadDim
	pages := len(l.Summary) / rec
	dt, nk, nv := b.cfg.DType, len(l.K), len(l.V)
	if l.FP8() {
		dt, nk, nv = plan.FP8, len(l.K8), len(l.V8)
	}
	if len(l.Summary) != pages*rec || (withKV && (nk != pages*s.KVHeads*s.PageSize*s.HeadDim || nv != nk)) {
		return nil, fmt.Errorf("cuda: host pool K=%d V=%d elements, summary=%d floats is not a whole number of pages", nk, nv, len(l.Summary))
	}
	if b.host == nil || b.host.Pages < pages || b.host.KVHeads != s.KVHeads || b.host.HeadDim != s.HeadDim || b.host.PageSize != s.PageSize || b.host.DType != dt {
		if b.host != nil {
			for _, p := range []cu.DevicePtr{b.host.K, b.host.V, b.host.Summary} {
				cu.MemFree(p)
			}
			freeFP8(b.host)
			freeScales(b.host)
			b.host = nil
		}
		h := &DeviceLayer{Pages: max(pages, 1), KVHeads: s.KVHeads, HeadDim: s.HeadDim, PageSize: s.PageSize, DType: dt}
		if err := b.allocLayer(h); err != nil {
			return nil, err
		}
		if err := b.allocScales(h); err != nil {
			return nil, err
		}
		if err := b.allocFP8(h); err != nil {
			freeScales(h)
			return nil, err
		}
		b.host = h
	}
	up := kernels.Layer{Summary: l.Summary}
	if withKV {
		up.K, up.V = l.K, l.V
		up.K8, up.V8, up.KScale, up.VScale = l.K8, l.V8, l.KScale, l.VScale
	}
	return b.host, b.upload(b.host, up)
}
