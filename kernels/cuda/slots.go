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
// any number of page payloads (slots.cu).

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
	names := []string{"quest_slots_move"}
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
	if b.cfg.DType == plan.FP8 {
		return nil, fmt.Errorf("cuda: slot pools (offload): %w: fp8 K/V pages stay device-resident (offload moves 16- and 32-bit slots)", kernels.ErrUnsupportedDType)
	}
	if b.cfg.SummaryDType == plan.SummaryFP8 {
		// The slot-pool writes keep no fp8 copy of the summaries.
		return nil, errors.New("cuda: slot pools (offload) keep bf16 summaries only; fp8 summaries (SummaryDType) are not available with offload")
	}
	l := &DeviceLayer{Pages: pages, Slots: slots, KVHeads: kvHeads, HeadDim: headDim, PageSize: pageSize, DType: b.cfg.DType}
	if err := b.do(ctx, func() error { return b.allocLayer(l) }); err != nil {
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
// the append of every pool (quest_append_*, page.cuh) given the pages'
// slots.
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
		pt, err := upload(b, "append.pt", pages)
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
		return b.launch("quest_append_"+l.DType.String(), [3]int{len(pages), l.KVHeads, 1}, min(l.HeadDim, 256), 0,
			u(l.K), u(l.V), u(l.Summary), u(pt), u(st), u(kp), u(vp), uint64(slot), uint64(n), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize))
	})
}

// RescanSlot implements kernels.SlotStore with one kernel, queued.
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
		return b.launch("quest_rescan_slots_"+l.DType.String(), [3]int{1, l.KVHeads, 1}, min(l.HeadDim, 256), 0,
			u(l.K), u(l.Summary), u(pp), u(sp), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize), uint64(valid))
	})
}

// CopySlot implements kernels.SlotStore: three device-to-device copies,
// queued.
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
		return nil
	})
}

// ReadSlotKV implements kernels.SlotStore: it waits for the queued work.
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
	if pages < 1 || payload < 16 || payload%16 != 0 {
		return nil, fmt.Errorf("cuda: host tier of %d pages of %d bytes (want pages >= 1 and a payload that is a positive multiple of 16)", pages, payload)
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

// MoveSlots implements kernels.SlotStore: one kernel for the saves, one
// for the loads, queued.
func (b *Backend) MoveSlots(ctx context.Context, pools []any, ht kernels.HostTier, saves, loads []kernels.SlotMove) error {
	t, ok := ht.(*HostTier)
	if !ok || t.b != b {
		return fmt.Errorf("cuda: host tier %T is not this backend's", ht)
	}
	if len(pools) == 0 {
		return errors.New("cuda: move slots of no pools")
	}
	ls := make([]*DeviceLayer, len(pools))
	for i, p := range pools {
		l, err := slotPool(p)
		if err != nil {
			return err
		}
		if i > 0 && (l.Slots != ls[0].Slots || l.kvPageBytes() != ls[0].kvPageBytes()) {
			return errors.New("cuda: move slots of pools of different geometry")
		}
		ls[i] = l
	}
	blk := ls[0].kvPageBytes()
	if int64(len(ls))*2*blk != int64(t.payload) || blk%16 != 0 {
		return fmt.Errorf("cuda: %d pools of %d-byte K/V slots do not make the tier's %d-byte payload", len(ls), blk, t.payload)
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
		ptrs := make([]int32, 0, 4*len(ls))
		for _, l := range ls {
			for _, p := range []cu.DevicePtr{l.K, l.V} {
				ptrs = append(ptrs, int32(uint32(p)), int32(uint32(uint64(p)>>32)))
			}
		}
		kv, err := upload(b, "slots.kv", ptrs)
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
			if err := b.launch("quest_slots_move", [3]int{len(ms), 2 * len(ls), 1}, 256, 0,
				u(kv), u(t.dev), u(mp), uint64(blk), uint64(t.payload), uint64(1-i)); err != nil {
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
