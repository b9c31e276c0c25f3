//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
)

// Rank (kernels.Ranker): score and top-K with the chosen pages' scores.

// Rank implements kernels.Ranker: the batch, queries and plan go up in one
// copy; score, top-K (a programmatic dependent of the score) and a kernel
// that picks the chosen pages' scores run back to back; the chosen pages
// and their scores come back in one copy. The scores stay on the device.
func (b *Backend) Rank(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, mode kernels.GQAMode, plan *kernels.TopKPlan, out []int32, outScores []float32) error {
	if err := checkShape(s); err != nil {
		return fmt.Errorf("rank: %w", err)
	}
	if err := validate(s, l, bt, false); err != nil {
		return fmt.Errorf("rank: %w", err)
	}
	outLen, err := kernels.CheckRank(s, bt, mode, plan, out, outScores)
	if err != nil {
		return err
	}
	n := bt.Len()
	if len(q) != n*s.QHeads*s.HeadDim {
		return fmt.Errorf("rank: query has %d floats, want %d", len(q), n*s.QHeads*s.HeadDim)
	}
	if plan.Rows() == 0 || outLen == 0 {
		return nil
	}
	rows := s.Rows(mode)
	tiles := rowStarts(bt, rows, plan)
	return b.do(ctx, func() error {
		dl, err := b.layer(s, l, false)
		if err != nil {
			return err
		}
		in := &b.in
		in.reset()
		pages := bt.Pages
		if bt.Tables != nil {
			if err := b.tablePtrs(bt, dl.Pages); err != nil {
				return err
			}
			pages = b.tabs
		}
		iInd, iPg, iQ := pack(in, bt.Indptr), pack(in, pages), pack(in, q)
		var pi [5]int
		for i, x := range [][]int32{plan.ScoreOff, plan.N, plan.Base, plan.K, plan.OutOff} {
			pi[i] = pack(in, x)
		}
		if err := b.send(in, "rank.in"); err != nil {
			return err
		}
		ind, pg := in.ptr(iInd), in.ptr(iPg)
		if bt.Tables != nil {
			if pg, err = b.gatherPages(bt, pg, ind); err != nil {
				return err
			}
		}
		var ptrs [5]cu.DevicePtr
		for i := range ptrs {
			ptrs[i] = in.ptr(pi[i])
		}
		o := &b.out
		o.reset()
		iOut, iSc := o.region(int64(outLen)*4), o.region(int64(outLen)*4)
		if o.base, err = b.buf("rank.out", o.total); err != nil {
			return err
		}
		sp, err := b.scoreTopK(dl, s, bt, mode, plan, ind, pg, in.ptr(iQ), ptrs, o.ptr(iOut), tiles)
		if err != nil {
			return err
		}
		if err := b.launch("quest_pick_scores", [3]int{plan.Rows(), 1, 1}, 128, 0, u(sp), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(o.ptr(iOut)), u(o.ptr(iSc))); err != nil {
			return err
		}
		b.rankOut = slices.Grow(b.rankOut[:0], outLen)[:outLen]
		b.rankScores = slices.Grow(b.rankScores[:0], outLen)[:outLen]
		setHost(o, iOut, b.rankOut)
		setHost(o, iSc, b.rankScores)
		if err := b.receive(o); err != nil {
			return err
		}
		// Rows write disjoint ranges; copy back only what they wrote.
		for r := range plan.Rows() {
			oo, m := int(plan.OutOff[r]), max(min(int(plan.K[r]), int(plan.N[r])), 0)
			copy(out[oo:oo+m], b.rankOut[oo:])
			copy(outScores[oo:oo+m], b.rankScores[oo:])
		}
		return nil
	})
}

// rowStarts reports whether every plan row that reads tile maxima (0 < K
// < N) ranks a prefix of one score row of the batch: candidates from the
// row's start, at most the row's length (the tiles the score kernel writes
// for that row).
func rowStarts(bt *kernels.Batch, rows int, plan *kernels.TopKPlan) bool {
	for r := range plan.Rows() {
		if plan.K[r] <= 0 || plan.K[r] >= plan.N[r] {
			continue // no tile maximum is read
		}
		off := int(plan.ScoreOff[r])
		// The sequence whose scores hold off: the last i with
		// Indptr[i]*rows <= off.
		i := sort.Search(bt.Len(), func(i int) bool { return int(bt.Indptr[i+1])*rows > off })
		if i >= bt.Len() {
			return false
		}
		np := bt.NumPages(i)
		if np == 0 || (off-bt.ScoreOffset(i, rows))%np != 0 || int(plan.N[r]) > np {
			return false
		}
	}
	return true
}
