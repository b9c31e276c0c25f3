//go:build cuda

package cuda

import (
	"context"
	"fmt"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Page scores (score.cuh, fp8.cuh and the tensor-core kernels of mma.cu).

// Score implements kernels.Backend.
func (b *Backend) Score(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, mode kernels.GQAMode, out []float32) error {
	if err := checkShape(s); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	if err := validate(s, l, bt, false); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	n := bt.Len()
	rows := s.Rows(mode)
	if len(q) != n*s.QHeads*s.HeadDim || len(out) < bt.Total()*rows {
		return fmt.Errorf("score: query %d or output %d floats do not fit the batch", len(q), len(out))
	}
	return b.do(ctx, func() error {
		dl, err := b.layer(s, l, false)
		if err != nil {
			return err
		}
		ind, err := upload(b, "indptr", bt.Indptr)
		if err != nil {
			return err
		}
		var pg cu.DevicePtr
		if bt.Tables != nil {
			if err := b.tablePtrs(bt, dl.Pages); err != nil {
				return err
			}
			tp, err := upload(b, "tables", b.tabs)
			if err != nil {
				return err
			}
			if pg, err = b.gatherPages(bt, tp, ind); err != nil {
				return err
			}
		} else if pg, err = upload(b, "pages", bt.Pages); err != nil {
			return err
		}
		qp, err := upload(b, "q", q)
		if err != nil {
			return err
		}
		op, err := b.buf("scores", int64(bt.Total()*rows)*4)
		if err != nil {
			return err
		}
		perHead := uint64(0)
		if mode == kernels.PerHead {
			perHead = 1
		}
		if _, err := b.launchScore(dl, s, n, bt.MaxPages(), ind, pg, qp, op, 0, perHead); err != nil {
			return err
		}
		return download(b, out[:bt.Total()*rows], op)
	})
}

// launchScore runs the score kernel: the D=128 fast path (G in 1, 2, 4, 8)
// or the generic one.
//
// tmax, when not 0, asks for the maximum of every tile of 8 pages of each
// output row as well (laid out like the scores, see quest_topk_thr); only
// the tensor-core kernel writes them, and wrote reports whether it did.
func (b *Backend) launchScore(dl *DeviceLayer, s kernels.Shape, n, maxPages int, ind, pg, qp, op, tmax cu.DevicePtr, perHead uint64) (wrote bool, err error) {
	if dl.FP8 != nil {
		return b.launchScoreFP8(dl, s.QHeads, n, maxPages, ind, pg, qp, op, tmax, perHead)
	}
	g := s.Group()
	if useMMA(s, dl.sumType()) {
		chunk := b.mmaScoreChunk(n, s.KVHeads, maxPages)
		name, err := b.mmaScoreName(s, dl.sumType())
		if err != nil {
			return false, err
		}
		grid := [3]int{s.KVHeads, (maxPages + chunk - 1) / chunk, n} // heads first (mma.cu)
		return tmax != 0, b.launch(name, grid, 128, 0,
			u(dl.Summary), u(ind), u(pg), u(qp), u(op), u(tmax), uint64(s.QHeads), uint64(s.KVHeads), perHead, uint64(chunk))
	}
	if s.HeadDim == 128 && (g == 1 || g == 2 || g == 4 || g == 8) {
		chunk := b.cfg.ScoreChunk
		if chunk <= 0 {
			chunk = min(1024, max(16, (n*s.KVHeads*maxPages+8*targetSMs-1)/(8*targetSMs)))
		}
		name := fmt.Sprintf("quest_score128_%s_g%d", dl.sumType(), g)
		if g == 4 && dl.sumType() != plan.Float32 {
			name = "quest_score128g4_" + dl.sumType().String()
		}
		return false, b.launch(name, [3]int{(maxPages + chunk - 1) / chunk, s.KVHeads, n}, 128, 0,
			u(dl.Summary), u(ind), u(pg), u(qp), u(op), uint64(s.QHeads), uint64(s.KVHeads), perHead, uint64(chunk))
	}
	if s.QHeads*2*s.HeadDim*4 > maxSmem {
		return false, fmt.Errorf("cuda: %d query heads x D %d exceed the generic scoring kernel's shared memory (the D = 128 kernels take G in 1, 2, 4, 8)", s.QHeads, s.HeadDim)
	}
	chunk := b.cfg.ScoreChunk
	if chunk <= 0 {
		chunk = 64
	}
	return false, b.launch("quest_score_"+dl.sumType().String(), [3]int{(maxPages + chunk - 1) / chunk, n, 1}, 256, s.QHeads*2*s.HeadDim*4,
		u(dl.Summary), u(ind), u(pg), u(qp), u(op), uint64(s.QHeads), uint64(s.KVHeads), uint64(s.HeadDim), perHead, uint64(chunk))
}

// mmaScoreChunk is the pages per block of the tensor-core score kernels
// (16-bit and fp8 records): Config.ScoreChunk, else about 8 blocks per SM
// with 32 to 1024 pages each (measured on an H200: better balanced than
// one wave of 4 per SM); never more chunks than gridDim.y takes, and a
// multiple of 8 (blocks start on tile boundaries).
func (b *Backend) mmaScoreChunk(n, kvHeads, maxPages int) int {
	chunk := b.cfg.ScoreChunk
	if chunk <= 0 {
		chunk = min(1024, max(32, (n*kvHeads*maxPages+8*targetSMs-1)/(8*targetSMs)))
	}
	chunk = max(chunk, (maxPages+65534)/65535) // chunks go in gridDim.y (at most 65535)
	return (chunk + 7) / 8 * 8
}

// scoreWritesTiles reports whether launchScore's kernel for dl writes tile
// maxima when asked (the tensor-core kernels).
func (b *Backend) scoreWritesTiles(s kernels.Shape, dl *DeviceLayer) bool {
	if dl.FP8 != nil {
		return b.fp8MMA(s.QHeads, dl)
	}
	return useMMA(s, dl.sumType())
}
