//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>

// Pinned host memory the device maps into its address space: kernels
// read and write it over PCIe directly (zero-copy).
static CUresult questHostAllocMapped(void** p, size_t n) {
	return cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
}
static CUresult questHostDevicePtr(CUdeviceptr* d, void* p) { return cuMemHostGetDevicePointer(d, p, 0); }
static CUresult questHostFreeMapped(void* p) { return cuMemFreeHost(p); }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// The offload side of the backend (kernels.SlotStore): slot pools, whose
// K/V live in fewer device slots than the pool has pages, and a host tier
// in pinned memory the device maps, between which one kernel launch moves
// any number of page payloads (slots.cu). Every storage type, fp8
// records included (their codes and scales indexed by slot, a page's tier
// payload its records as stored), and fp8 summaries (Config.SummaryDType,
// kept by physical page like the master summaries).

var _ kernels.SlotStore = (*Backend)(nil)

// errSlotPool is returned by the page-addressed K/V operations of
// kernels.DeviceStore on a slot pool.
var errSlotPool = errors.New("cuda: a slot pool's K/V are addressed by slot (use the kernels.SlotStore methods)")

// loadSlotKernels loads slots.ptx and adds its kernels to fn (device
// goroutine, at start-up).
func loadSlotKernels(fn map[string]cu.Function) (cu.Module, error) {
	mod, err := cu.LoadData(PTXSlots)
	if err != nil {
		return mod, fmt.Errorf("cuda: load offload PTX: %w", err)
	}
	names := []string{"quest_slots_move", "quest_slot_table_write", "quest_slot_resolve"}
	for _, dt := range []plan.DType{plan.Float32, plan.Float16, plan.BFloat16} {
		names = append(names, "quest_rescan_slots_"+dt.String())
	}
	for _, n := range names {
		f, err := mod.Function(n)
		if err != nil {
			mod.Unload()
			return mod, fmt.Errorf("cuda: kernel %s: %w", n, err)
		}
		fn[n] = f
	}
	return mod, nil
}

// PoolDType implements kernels.SlotStore: the backend's storage type.
func (b *Backend) PoolDType() plan.DType { return b.cfg.DType }

// NewSlotPool implements kernels.SlotStore: a DeviceLayer with Slots set.
func (b *Backend) NewSlotPool(ctx context.Context, pages, slots, kvHeads, headDim, pageSize int) (any, error) {
	if slots < 1 || slots > pages {
		return nil, fmt.Errorf("cuda: slot pool of %d slots for %d pages (want 1..pages)", slots, pages)
	}
	l := &DeviceLayer{Pages: pages, Slots: slots, KVHeads: kvHeads, HeadDim: headDim, PageSize: pageSize, DType: b.cfg.DType}
	if l.kv8() && (kvHeads*pageSize*headDim)%4 != 0 {
		return nil, fmt.Errorf("cuda: slot pool of fp8 records of %d x %d x %d codes: the tier moves 4-byte words (want a multiple of 4)", kvHeads, pageSize, headDim)
	}
	err := b.do(ctx, func() error {
		if err := b.allocPool(l); err != nil {
			return err
		}
		// Unwritten slots read as zeros (fp8: codes and scales 0), as
		// on the CPU.
		n := int64(l.kvPages()) * l.kvPageBytes() / 4
		for _, p := range []cu.DevicePtr{l.K, l.V} {
			if err := cu.MemsetD32(p, 0, n); err != nil {
				release(l)
				return fmt.Errorf("cuda: clear slot pool: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

func slotPool(pool any) (*DeviceLayer, error) {
	l, err := devicePool(pool)
	if err != nil {
		return nil, err
	}
	if l.Slots == 0 {
		return nil, errors.New("cuda: not a slot pool")
	}
	return l, nil
}

func (l *DeviceLayer) checkSlots(slots ...int32) error {
	for _, s := range slots {
		if s < 0 || int(s) >= l.Slots {
			return fmt.Errorf("cuda: slot %d outside the %d slots", s, l.Slots)
		}
	}
	return nil
}

// WriteSlotTokens implements kernels.SlotStore with one kernel, queued:
// the append of every pool (quest_append_*, page.cuh; fp8 records:
// quest_append_fp8, which quantizes as the page-addressed append does)
// given the pages' slots, then the touched pages' fp8 summaries, if kept.
func (b *Backend) WriteSlotTokens(ctx context.Context, pool any, pages, slots []int32, slot int, k, v []float32) error {
	l, err := slotPool(pool)
	if err != nil {
		return err
	}
	if err := l.checkTokens("cuda write slot tokens", len(pages), slot, k, v); err != nil {
		return err
	}
	if len(slots) != len(pages) {
		return fmt.Errorf("cuda write slot tokens: %d slots for %d pages", len(slots), len(pages))
	}
	n := len(k) / (l.KVHeads * l.HeadDim)
	if err := errors.Join(l.checkPages(pages...), l.checkSlots(slots...)); err != nil {
		return err
	}
	return b.do(ctx, func() error {
		pt, err := upload(b, keptAppendPages, pages)
		if err != nil {
			return err
		}
		st, err := upload(b, "append.st", slots)
		if err != nil {
			return err
		}
		kp, err := upload(b, "append.k", k)
		if err != nil {
			return err
		}
		vp, err := upload(b, "append.v", v)
		if err != nil {
			return err
		}
		if l.kv8() {
			err = b.append8(l, pt, st, kp, vp, slot, n, len(pages))
		} else {
			err = b.launch("quest_append_"+l.DType.String(), [3]int{len(pages), l.KVHeads, 1}, min(l.HeadDim, 256), 0,
				u(l.K), u(l.V), u(l.Summary), u(pt), u(st), u(kp), u(vp), uint64(slot), uint64(n), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize))
		}
		if err != nil {
			return err
		}
		return b.encodeFP8(l, pt, 0, len(pages))
	})
}

// RescanSlot implements kernels.SlotStore with one kernel (fp8 records:
// over the dequantized keys, quest_rescan_slots_fp8), queued, then the
// page's fp8 summaries, if kept.
func (b *Backend) RescanSlot(ctx context.Context, pool any, page, slot int32, valid int) error {
	l, err := slotPool(pool)
	if err != nil {
		return err
	}
	if valid < 0 || valid > l.PageSize {
		return fmt.Errorf("cuda rescan slot: %d valid slots outside 0..%d", valid, l.PageSize)
	}
	if err := errors.Join(l.checkPages(page), l.checkSlots(slot)); err != nil {
		return err
	}
	return b.do(ctx, func() error {
		pp, err := upload(b, "rescan.pages", []int32{page})
		if err != nil {
			return err
		}
		sp, err := upload(b, "rescan.slots", []int32{slot})
		if err != nil {
			return err
		}
		if l.kv8() {
			err = b.launch("quest_rescan_slots_fp8", [3]int{1, l.KVHeads, 1}, min(l.HeadDim, 256), 0,
				u(l.K), u(l.KScale), u(l.Summary), u(pp), u(sp), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize), uint64(valid))
		} else {
			err = b.launch("quest_rescan_slots_"+l.DType.String(), [3]int{1, l.KVHeads, 1}, min(l.HeadDim, 256), 0,
				u(l.K), u(l.Summary), u(pp), u(sp), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize), uint64(valid))
		}
		if err != nil {
			return err
		}
		return b.encodeFP8(l, pp, 0, 1)
	})
}

// CopySlot implements kernels.SlotStore: three device-to-device copies
// (fp8 records: their scales too; fp8 summaries: theirs), queued.
func (b *Backend) CopySlot(ctx context.Context, pool any, dst, src, dstSlot, srcSlot int32) error {
	l, err := slotPool(pool)
	if err != nil {
		return err
	}
	if err := errors.Join(l.checkPages(dst, src), l.checkSlots(dstSlot, srcSlot)); err != nil {
		return err
	}
	return b.do(ctx, func() error {
		kv, sum := l.kvPageBytes(), l.sumPageBytes()
		for _, c := range []struct {
			base     cu.DevicePtr
			size     int64
			dst, src int32
		}{{l.K, kv, dstSlot, srcSlot}, {l.V, kv, dstSlot, srcSlot}, {l.Summary, sum, dst, src}} {
			d, s := c.base+cu.DevicePtr(int64(c.dst)*c.size), c.base+cu.DevicePtr(int64(c.src)*c.size)
			if err := cu.MemcpyDtoDAsync(d, s, c.size, cu.Stream{}); err != nil {
				return fmt.Errorf("cuda: copy slot %d to %d: %w", c.src, c.dst, err)
			}
		}
		if err := b.copyScales(l, dstSlot, srcSlot); err != nil {
			return err
		}
		return b.copyFP8(l, dst, src)
	})
}

// ReadSlotKV implements kernels.SlotStore: it waits for the queued work
// (fp8 records come back decoded, code value times scale).
func (b *Backend) ReadSlotKV(ctx context.Context, pool any, slot int32) (k, v []float32, err error) {
	l, err := slotPool(pool)
	if err != nil {
		return nil, nil, err
	}
	if err := l.checkSlots(slot); err != nil {
		return nil, nil, err
	}
	n := l.KVHeads * l.PageSize * l.HeadDim
	err = b.do(ctx, func() error {
		if l.kv8() {
			if err := cu.Synchronize(); err != nil {
				return fmt.Errorf("cuda: read slot %d: %w", slot, err)
			}
			var err error
			if k, v, err = b.readDecoded(l, int64(slot), 1); err != nil {
				return fmt.Errorf("cuda: read slot %d: %w", slot, err)
			}
			return nil
		}
		off := cu.DevicePtr(int64(slot) * l.kvPageBytes())
		var err error
		if k, err = readAs(b, l.K+off, n, l.DType); err != nil {
			return fmt.Errorf("cuda: read slot %d: %w", slot, err)
		}
		if v, err = readAs(b, l.V+off, n, l.DType); err != nil {
			return fmt.Errorf("cuda: read slot %d: %w", slot, err)
		}
		return nil
	})
	return k, v, err
}

// HostTier is the backend's host tier (kernels.HostTier, the method set
// of pagestore/tier.Tier): pages payloads in pinned host memory the
// device maps. MoveSlots writes and reads it from the device; Read and
// Write on the host first wait for the device's queued work. Safe for
// concurrent use.
type HostTier struct {
	b       *Backend
	pages   int
	payload int

	mu     sync.Mutex
	host   unsafe.Pointer // nil once closed
	dev    cu.DevicePtr
	full   []bool
	closed bool
}

// NewHostTier implements kernels.SlotStore.
func (b *Backend) NewHostTier(ctx context.Context, pages, payload int) (kernels.HostTier, error) {
	if pages < 1 || payload < 4 || payload%4 != 0 {
		return nil, fmt.Errorf("cuda: host tier of %d pages of %d bytes (want pages >= 1 and a payload that is a positive multiple of 4)", pages, payload)
	}
	t := &HostTier{b: b, pages: pages, payload: payload, full: make([]bool, pages)}
	size := C.size_t(int64(pages) * int64(payload))
	err := b.do(ctx, func() error {
		if r := C.questHostAllocMapped(&t.host, size); r != C.CUDA_SUCCESS {
			return fmt.Errorf("cuda: cuMemHostAlloc(%d bytes, mapped): CUresult %d", int64(size), int(r))
		}
		var d C.CUdeviceptr
		if r := C.questHostDevicePtr(&d, t.host); r != C.CUDA_SUCCESS {
			C.questHostFreeMapped(t.host)
			t.host = nil
			return fmt.Errorf("cuda: cuMemHostGetDevicePointer: CUresult %d", int(r))
		}
		t.dev = cu.DevicePtr(d)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Slots implements kernels.HostTier.
func (t *HostTier) Slots() int { return t.pages }

// PayloadBytes implements kernels.HostTier.
func (t *HostTier) PayloadBytes() int { return t.payload }

// check validates a call (mu held); n < 0 skips the size check.
func (t *HostTier) check(ctx context.Context, slot, n int) error {
	switch {
	case t.closed:
		return tier.ErrClosed
	case ctx.Err() != nil:
		return ctx.Err()
	case slot < 0 || slot >= t.pages:
		return fmt.Errorf("cuda host tier: slot %d outside %d: %w", slot, t.pages, tier.ErrSlot)
	case n >= 0 && n != t.payload:
		return fmt.Errorf("cuda host tier: %d bytes, payload %d: %w", n, t.payload, tier.ErrSize)
	}
	return nil
}

func (t *HostTier) bytes(slot int) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(t.host, int64(slot)*int64(t.payload))), t.payload)
}

// sync waits for the device's queued work (moves to and from the tier).
func (t *HostTier) sync(ctx context.Context) error {
	return t.b.do(ctx, func() error { return cu.Synchronize() })
}

// Write implements kernels.HostTier.
func (t *HostTier) Write(ctx context.Context, slot int, payload []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ctx, slot, len(payload)); err != nil {
		return err
	}
	if err := t.sync(ctx); err != nil {
		return fmt.Errorf("cuda host tier write: %w", err)
	}
	copy(t.bytes(slot), payload)
	t.full[slot] = true
	return nil
}

// Read implements kernels.HostTier.
func (t *HostTier) Read(ctx context.Context, slot int, dst []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ctx, slot, len(dst)); err != nil {
		return err
	}
	if !t.full[slot] {
		return fmt.Errorf("cuda host tier: slot %d: %w", slot, tier.ErrEmpty)
	}
	if err := t.sync(ctx); err != nil {
		return fmt.Errorf("cuda host tier read: %w", err)
	}
	copy(dst, t.bytes(slot))
	return nil
}

// Free implements kernels.HostTier.
func (t *HostTier) Free(ctx context.Context, slot int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ctx, slot, -1); err != nil {
		return err
	}
	if !t.full[slot] {
		return fmt.Errorf("cuda host tier: slot %d: %w", slot, tier.ErrEmpty)
	}
	t.full[slot] = false
	return nil
}

// Close implements kernels.HostTier: it waits for the device's queued
// work and frees the memory.
func (t *HostTier) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	return t.b.do(context.Background(), func() error {
		err := cu.Synchronize()
		C.questHostFreeMapped(t.host)
		t.host, t.dev = nil, 0
		return err
	})
}

// slotSegments appends, for each slot array of l in the tier's payload
// order, its device address and its bytes per slot: K then V, or for fp8
// records K codes, K scales, V codes, V scales (packFP8's layout).
func (l *DeviceLayer) slotSegments(segs []slotSegment) []slotSegment {
	kv := l.kvPageBytes()
	if !l.kv8() {
		return append(segs, slotSegment{l.K, kv}, slotSegment{l.V, kv})
	}
	sc := int64(l.KVHeads) * 4
	return append(segs, slotSegment{l.K, kv}, slotSegment{l.KScale, sc}, slotSegment{l.V, kv}, slotSegment{l.VScale, sc})
}

// slotSegment is one slot array of a pool: its device address and the
// bytes of one slot's part (the stride between slots).
type slotSegment struct {
	base cu.DevicePtr
	size int64
}

// MoveSlots implements kernels.SlotStore: one kernel for the saves, one
// for the loads, queued. A payload is the segments of every pool in
// order (slotSegments), each a multiple of 4 bytes.
func (b *Backend) MoveSlots(ctx context.Context, pools []any, ht kernels.HostTier, saves, loads []kernels.SlotMove) error {
	t, ok := ht.(*HostTier)
	if !ok || t.b != b {
		return fmt.Errorf("cuda: host tier %T is not this backend's", ht)
	}
	if len(pools) == 0 {
		return errors.New("cuda: move slots of no pools")
	}
	ls := make([]*DeviceLayer, len(pools))
	var segs []slotSegment
	for i, p := range pools {
		l, err := slotPool(p)
		if err != nil {
			return err
		}
		if i > 0 && (l.Slots != ls[0].Slots || l.kvPageBytes() != ls[0].kvPageBytes() || l.DType != ls[0].DType || l.KVHeads != ls[0].KVHeads) {
			return errors.New("cuda: move slots of pools of different geometry")
		}
		ls[i] = l
		segs = l.slotSegments(segs)
	}
	var total int64
	for _, sg := range segs {
		if sg.size%4 != 0 {
			return fmt.Errorf("cuda: a %d-byte slot segment is not a multiple of 4", sg.size)
		}
		total += sg.size
	}
	if total != int64(t.payload) {
		return fmt.Errorf("cuda: %d pools of %v slots (%d bytes) do not make the tier's %d-byte payload", len(ls), ls[0].DType, total, t.payload)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return tier.ErrClosed
	}
	for i, ms := range [2][]kernels.SlotMove{saves, loads} {
		for _, m := range ms {
			if m.Page < 0 || int(m.Page) >= t.pages {
				return fmt.Errorf("cuda: move of tier page %d outside %d: %w", m.Page, t.pages, tier.ErrSlot)
			}
			if err := ls[0].checkSlots(m.Slot); err != nil {
				return err
			}
			if i == 1 && !t.full[m.Page] && !slices.ContainsFunc(saves, func(s kernels.SlotMove) bool { return s.Page == m.Page }) {
				return fmt.Errorf("cuda: load of tier page %d, which holds no payload: %w", m.Page, tier.ErrEmpty)
			}
		}
	}
	err := b.do(ctx, func() error {
		// Three 64-bit values per segment: address, bytes, payload
		// offset (as int32 pairs, little-endian).
		desc := make([]int32, 0, 6*len(segs))
		off := int64(0)
		for _, sg := range segs {
			for _, x := range []uint64{uint64(sg.base), uint64(sg.size), uint64(off)} {
				desc = append(desc, int32(uint32(x)), int32(uint32(x>>32)))
			}
			off += sg.size
		}
		sp, err := upload(b, "slots.segs", desc)
		if err != nil {
			return err
		}
		for i, ms := range [2][]kernels.SlotMove{saves, loads} {
			if len(ms) == 0 {
				continue
			}
			name := [2]string{"slots.saves", "slots.loads"}[i]
			mp, err := upload(b, name, unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(ms))), 2*len(ms)))
			if err != nil {
				return err
			}
			if err := b.launch("quest_slots_move", [3]int{len(ms), len(segs), 1}, 256, 0,
				u(sp), u(t.dev), u(mp), uint64(t.payload), uint64(1-i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, m := range saves {
		t.full[m.Page] = true
	}
	return nil
}
