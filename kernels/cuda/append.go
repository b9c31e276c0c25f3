//go:build cuda

package cuda

import (
	"context"
	"fmt"

	"gorgonia.org/cu"
)

// Appends of new tokens to device pages (quest_append_*, page.cuh): K
// and V stored in the pool's type, the touched pages' summaries widened;
// fp8 pools quantize on the device (quest_append_fp8, kvfp8.go).

// WriteTokens implements kernels.DeviceStore with one append kernel
// (stores the tokens converted to the pool's type and widens the pages'
// summaries with the stored keys). It is queued, not waited for.
func (b *Backend) WriteTokens(ctx context.Context, pool any, pages []int32, slot int, k, v []float32) error {
	l, err := devicePool(pool)
	if err != nil {
		return err
	}
	if err := l.checkTokens("cuda write tokens", len(pages), slot, k, v); err != nil {
		return err
	}
	if l.Slots > 0 {
		return errSlotPool
	}
	if err := l.checkPages(pages...); err != nil {
		return err
	}
	return b.do(ctx, func() error { return b.appendTokens(l, pages, slot, k, v) })
}

// Append writes n tokens (k, v: float32 [n][KVHeads][D]) of one sequence at
// positions pos0.. into l through pageTable (logical -> physical) and
// widens the touched pages' summaries on the device (the first token of a
// page resets its summary).
func (b *Backend) Append(ctx context.Context, l *DeviceLayer, pageTable []int32, pos0 int, k, v []float32) error {
	tok := l.KVHeads * l.HeadDim
	if len(k) == 0 || len(k)%tok != 0 || len(v) != len(k) {
		return fmt.Errorf("cuda append: k %d and v %d floats are not whole tokens of %d", len(k), len(v), tok)
	}
	n := len(k) / tok
	if pos0 < 0 {
		return fmt.Errorf("cuda append: position %d < 0", pos0)
	}
	if (pos0+n+l.PageSize-1)/l.PageSize > len(pageTable) {
		return fmt.Errorf("cuda append: %d pages needed, page table has %d", (pos0+n+l.PageSize-1)/l.PageSize, len(pageTable))
	}
	for _, p := range pageTable {
		if p < 0 || int(p) >= l.Pages {
			return fmt.Errorf("cuda append: physical page %d outside pool of %d", p, l.Pages)
		}
	}
	return b.do(ctx, func() error {
		if err := b.appendTokens(l, pageTable, pos0, k, v); err != nil {
			return err
		}
		return cu.Synchronize()
	})
}

// appendTokens queues the append kernel: tokens at positions pos0.. of a
// sequence whose logical pages are pageTable, with no slot list (K and V
// go to the physical pages; device goroutine only).
func (b *Backend) appendTokens(l *DeviceLayer, pageTable []int32, pos0 int, k, v []float32) error {
	kp, err := upload(b, "append.k", k)
	if err != nil {
		return err
	}
	vp, err := upload(b, "append.v", v)
	if err != nil {
		return err
	}
	return b.appendFrom(l, pageTable, pos0, len(k)/(l.KVHeads*l.HeadDim), kp, vp)
}

// appendFrom is appendTokens of n tokens whose k and v are float32 in
// device memory at kp and vp (device goroutine only).
func (b *Backend) appendFrom(l *DeviceLayer, pageTable []int32, pos0, n int, kp, vp cu.DevicePtr) error {
	pt, err := upload(b, keptAppendPages, pageTable)
	if err != nil {
		return err
	}
	touched := (pos0+n-1)/l.PageSize - pos0/l.PageSize + 1
	if l.kv8() {
		if err := b.append8(l, pt, 0, kp, vp, pos0, n, touched); err != nil {
			return err
		}
		return b.encodeFP8(l, pt, int64(pos0/l.PageSize), touched)
	}
	if err := b.launch("quest_append_"+l.DType.String(), [3]int{touched, l.KVHeads, 1}, min(l.HeadDim, 256), 0,
		u(l.K), u(l.V), u(l.Summary), u(pt), 0, u(kp), u(vp), uint64(pos0), uint64(n), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.PageSize)); err != nil {
		return err
	}
	return b.encodeFP8(l, pt, int64(pos0/l.PageSize), touched) // the touched pages' fp8 records, if kept
}
