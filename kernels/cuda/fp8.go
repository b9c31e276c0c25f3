//go:build cuda

package cuda

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/plan"
)

// FP8Summaries is the fp8 copy of a device layer's summaries, kept when
// the backend's Config.SummaryDType is plan.SummaryFP8 (package
// kernels/fp8 documents the encoding): Codes is [pages][KVHeads][2][D]
// E4M3fn bytes and Scales [pages][KVHeads] float32 powers of two. The
// layer's 16- or 32-bit records stay the master copy that appends,
// rescans and page copies update; every such change re-encodes the
// touched records on the device (quest_encode8_*), and the score reads
// only the fp8 copy: 2*D+4 bytes per record instead of 4*D for bf16.
//
// Pools made by NewLayer, NewPool and the scratch layer of host-array
// inputs carry the copy; other pools (nil FP8) are scored from their
// master records.
type FP8Summaries struct {
	Codes, Scales cu.DevicePtr
}

// fp8KernelNames are the kernels of fp8 summaries in fp8.cuh (quest.cu).
func fp8KernelNames() []string {
	var names []string
	for _, dt := range []plan.DType{plan.Float32, plan.Float16, plan.BFloat16} {
		names = append(names, "quest_encode8_"+dt.String())
	}
	for _, g := range fp8Groups {
		names = append(names, fmt.Sprintf("quest_score8_g%d", g))
	}
	return names
}

// fp8Groups are the compile-time group bounds of quest_score8_g*: a call
// with G query heads per KV head runs the smallest that is >= G.
var fp8Groups = []int{1, 2, 4, 8, 16, 32}

// allocFP8 gives l its fp8 copy when the backend stores fp8 summaries.
// On failure it frees l's K, V and summaries too (the caller allocated
// them just before), so the layer is left unallocated.
func (b *Backend) allocFP8(l *DeviceLayer) error {
	if b.cfg.SummaryDType != plan.SummaryFP8 {
		return nil
	}
	recs := int64(l.Pages) * int64(l.KVHeads)
	f := &FP8Summaries{}
	var err error
	if f.Codes, err = cu.MemAlloc(recs * int64(2*l.HeadDim)); err == nil {
		if f.Scales, err = cu.MemAlloc(recs * 4); err != nil {
			cu.MemFree(f.Codes)
		}
	}
	if err != nil {
		for _, p := range []cu.DevicePtr{l.K, l.V, l.Summary} {
			if p != 0 {
				cu.MemFree(p)
			}
		}
		l.K, l.V, l.Summary = 0, 0, 0
		return fmt.Errorf("cuda: alloc fp8 summaries (%d records): %w", recs, err)
	}
	l.FP8 = f
	return nil
}

// freeFP8 releases l's fp8 copy, if any.
func freeFP8(l *DeviceLayer) {
	if l.FP8 == nil {
		return
	}
	cu.MemFree(l.FP8.Codes)
	cu.MemFree(l.FP8.Scales)
	l.FP8 = nil
}

// encodeFP8 queues the encoding of n pages' records of l from its master
// records: the pages are pages[first:first+n] of the device int32 array
// pages, or first..first+n-1 when pages is 0. Nothing to do without an
// fp8 copy.
func (b *Backend) encodeFP8(l *DeviceLayer, pages cu.DevicePtr, first int64, n int) error {
	if l.FP8 == nil || n <= 0 {
		return nil
	}
	const maxGrid = 1 << 30
	for off := 0; off < n; off += maxGrid {
		m := min(n-off, maxGrid)
		f := first + int64(off)
		if err := b.launch("quest_encode8_"+l.sumType().String(), [3]int{m, l.KVHeads, 1}, 128, 0,
			u(l.Summary), u(l.FP8.Codes), u(l.FP8.Scales), u(pages), uint64(f), uint64(l.KVHeads), uint64(l.HeadDim)); err != nil {
			return err
		}
	}
	return nil
}

// copyFP8 queues the copy of page src's fp8 records to page dst.
func (b *Backend) copyFP8(l *DeviceLayer, dst, src int32) error {
	if l.FP8 == nil {
		return nil
	}
	for _, c := range []struct {
		base cu.DevicePtr
		size int64
	}{{l.FP8.Codes, int64(l.KVHeads * 2 * l.HeadDim)}, {l.FP8.Scales, int64(l.KVHeads) * 4}} {
		d, s := c.base+cu.DevicePtr(int64(dst)*c.size), c.base+cu.DevicePtr(int64(src)*c.size)
		if err := cu.MemcpyDtoDAsync(d, s, c.size, cu.Stream{}); err != nil {
			return fmt.Errorf("cuda: copy fp8 summaries of page %d to %d: %w", src, dst, err)
		}
	}
	return nil
}

// ScoreFP8CUDACores is the Config.ScoreKernel value that scores fp8
// summaries with the CUDA-core kernels (quest_score8_g*) instead of the
// tensor-core ones (for comparisons).
const ScoreFP8CUDACores = "quest_score8"

// fp8MMA reports whether the tensor-core fp8 score kernel
// (quest_score8mma_d*, mma.cu) takes this shape: D 64 or 128, at most 16
// query heads per KV head, and no ScoreFP8CUDACores override.
func (b *Backend) fp8MMA(qHeads int, dl *DeviceLayer) bool {
	g := qHeads / dl.KVHeads
	return (dl.HeadDim == 64 || dl.HeadDim == 128) && g <= 16 && b.cfg.ScoreKernel != ScoreFP8CUDACores
}

// launchScoreFP8 scores from l's fp8 records: the tensor-core kernel,
// which also writes tile maxima when tmax is not 0 (wrote), where it
// takes the shape, else quest_score8_g*.
func (b *Backend) launchScoreFP8(dl *DeviceLayer, qHeads, n, maxPages int, ind, pg, qp, op, tmax cu.DevicePtr, perHead uint64) (wrote bool, err error) {
	d, g := dl.HeadDim, qHeads/dl.KVHeads
	if b.fp8MMA(qHeads, dl) {
		chunk := b.mmaScoreChunk(n, dl.KVHeads, maxPages)
		name := fmt.Sprintf("quest_score8mma_d%d", d)
		if g > 8 {
			name += "_h16"
		}
		if name, err = b.override(b.cfg.ScoreKernel, name, g > 8); err != nil {
			return false, err
		}
		grid := [3]int{dl.KVHeads, (maxPages + chunk - 1) / chunk, n}
		return tmax != 0, b.launch(name, grid, 128, 0, u(dl.FP8.Codes), u(dl.FP8.Scales), u(ind), u(pg), u(qp), u(op), u(tmax),
			uint64(qHeads), uint64(dl.KVHeads), perHead, uint64(chunk))
	}
	if d > 128 || d%4 != 0 {
		return false, fmt.Errorf("cuda: fp8 summaries need a head dim up to 128 and a multiple of 4, not %d", d)
	}
	gm := 0
	for _, x := range fp8Groups {
		if x >= g {
			gm = x
			break
		}
	}
	if gm == 0 {
		return false, fmt.Errorf("cuda: fp8 summaries take up to 32 query heads per KV head, not %d", g)
	}
	chunk := b.cfg.ScoreChunk
	if chunk <= 0 {
		chunk = min(1024, max(16, (n*dl.KVHeads*maxPages+8*targetSMs-1)/(8*targetSMs)))
	}
	return false, b.launch(fmt.Sprintf("quest_score8_g%d", gm), [3]int{(maxPages + chunk - 1) / chunk, dl.KVHeads, n}, 128, 0,
		u(dl.FP8.Codes), u(dl.FP8.Scales), u(ind), u(pg), u(qp), u(op), uint64(qHeads), uint64(dl.KVHeads), uint64(d), perHead, uint64(chunk))
}

// ReadFP8 waits for the queued work and returns the fp8 records of pages
// of pool (a *DeviceLayer with an fp8 copy): codes
// [len(pages)][KVHeads][2][D] and scales [len(pages)][KVHeads]. For tests
// and diagnostics, not the hot path.
func (b *Backend) ReadFP8(ctx context.Context, pool any, pages []int32) ([]uint8, []float32, error) {
	l, err := devicePool(pool)
	if err != nil {
		return nil, nil, err
	}
	if l.FP8 == nil {
		return nil, nil, errors.New("cuda: the pool keeps no fp8 summaries (Config.SummaryDType)")
	}
	if err := l.checkPages(pages...); err != nil {
		return nil, nil, err
	}
	rec := l.KVHeads * 2 * l.HeadDim
	codes := make([]uint8, len(pages)*rec)
	scales := make([]float32, len(pages)*l.KVHeads)
	err = b.do(ctx, func() error {
		if err := cu.Synchronize(); err != nil {
			return err
		}
		for i, p := range pages {
			if err := cu.MemcpyDtoH(unsafe.Pointer(&codes[i*rec]), l.FP8.Codes+cu.DevicePtr(int64(p)*int64(rec)), int64(rec)); err != nil {
				return fmt.Errorf("cuda: read fp8 codes: %w", err)
			}
			if err := cu.MemcpyDtoH(unsafe.Pointer(&scales[i*l.KVHeads]), l.FP8.Scales+cu.DevicePtr(int64(p)*int64(l.KVHeads)*4), int64(l.KVHeads)*4); err != nil {
				return fmt.Errorf("cuda: read fp8 scales: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return codes, scales, nil
}

// fp8Name is "fp8" for a layer scored from an fp8 copy, "" otherwise
// (BenchResult.SummaryDType).
func fp8Name(l *DeviceLayer) string {
	if l.FP8 != nil {
		return plan.SummaryFP8.String()
	}
	return ""
}
