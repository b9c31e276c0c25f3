//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math/bits"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
)

// Top-K page selection (topk*.cuh): the one-block, threshold, two-stage,
// multi-block radix and sample variants, and the choice between them.

// TopK implements kernels.Backend.
func (b *Backend) TopK(ctx context.Context, scores []float32, plan *kernels.TopKPlan, out []int32) error {
	n := plan.Rows()
	outLen, err := plan.Check(len(scores), len(out))
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return b.do(ctx, func() error {
		sp, err := upload(b, "topk.scores", scores)
		if err != nil {
			return err
		}
		var ptrs [5]cu.DevicePtr
		for i, a := range [][]int32{plan.ScoreOff, plan.N, plan.Base, plan.K, plan.OutOff} {
			if ptrs[i], err = upload(b, fmt.Sprintf("topk.plan%d", i), a); err != nil {
				return err
			}
		}
		op, err := b.buf("topk.out", int64(outLen)*4)
		if err != nil {
			return err
		}
		if err := b.launchTopK(plan, sp, 0, ptrs, op, false); err != nil {
			return err
		}
		// Rows write disjoint ranges; copy back only what they wrote.
		tmp := make([]int32, outLen)
		copy(tmp, out)
		if err := download(b, tmp, op); err != nil {
			return err
		}
		for r := range n {
			oo, m := int(plan.OutOff[r]), min(int(plan.K[r]), int(plan.N[r]))
			copy(out[oo:oo+max(m, 0)], tmp[oo:])
		}
		return nil
	})
}

// launchTopK runs the threshold top-K (one block per row) when every row
// suits it, else the two-stage top-K when the rows suit that, else the
// multi-block radix select for long rows (topkRadix), else the radix
// select with one block per row. ptrs are the plan's ScoreOff, N, Base, K,
// OutOff on the device.
//
// tmax, when not 0, holds tile maxima from the score kernel and every row
// of the plan starts at a score row's start. pdl launches the threshold
// kernel as a programmatic dependent of the score kernel.
func (b *Backend) launchTopK(plan *kernels.TopKPlan, scores, tmax cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr, pdl bool) error {
	rows := plan.Rows()
	switch b.cfg.TopKPath {
	case "thr":
		return b.launchMode(pdl, "quest_topk_thr", [3]int{rows, 1, 1}, 1024, 0, u(scores), u(tmax), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out))
	case "twostage":
		if slice, slices, kmax := topkSlices(plan); slices > 0 {
			return b.launchTopKTwoStage(plan, scores, ptrs, out, slice, slices, kmax)
		}
	case "radix":
		if topkRadixFits(plan) {
			return b.launchTopKVariant(plan, scores, ptrs, out, topkRadixVariants[topkRadixDefault])
		}
	case "onestage":
		return b.launch("quest_topk", [3]int{rows, 1, 1}, 1024, 0, u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out))
	}
	if topkThr(plan) {
		return b.launchMode(pdl, "quest_topk_thr", [3]int{rows, 1, 1}, 1024, 0, u(scores), u(tmax), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out))
	}
	slice, slices, kmax := topkSlices(plan)
	if slices == 0 && topkRadix(plan) {
		return b.launchTopKVariant(plan, scores, ptrs, out, topkRadixVariants[topkRadixDefault])
	}
	if slices == 0 {
		return b.launch("quest_topk", [3]int{rows, 1, 1}, 1024, 0, u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out))
	}
	return b.launchTopKTwoStage(plan, scores, ptrs, out, slice, slices, kmax)
}

// launchTopKTwoStage runs the two-stage top-K (quest_topk_local over
// slices of slice scores a row, keeping kmax each, then quest_topk_merge)
// with topkSlices' choice.
func (b *Backend) launchTopKTwoStage(plan *kernels.TopKPlan, scores cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr, slice, slices, kmax int) error {
	rows := plan.Rows()
	ck, err := b.buf("topk.ckey", int64(rows*slices*kmax)*4)
	if err != nil {
		return err
	}
	ci, err := b.buf("topk.cidx", int64(rows*slices*kmax)*4)
	if err != nil {
		return err
	}
	if err := b.launch("quest_topk_local", [3]int{slices, rows, 1}, 1024, 0, u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[3]), u(ck), u(ci),
		uint64(slice), uint64(slices), uint64(kmax)); err != nil {
		return err
	}
	return b.launch("quest_topk_merge", [3]int{rows, 1, 1}, 1024, 0, u(ck), u(ci), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out),
		uint64(slices), uint64(kmax))
}

// Two-stage top-K limits (topk.cuh): a slice of a row and the candidates of
// a row must fit shared memory.
const (
	topkSliceMax = 8192
	topkCandMax  = 4096
)

// topkSlices picks the slice length for the two-stage top-K of rows of up
// to maxN candidates keeping up to maxK, or 0 when the single-block kernel
// must run (short rows, large k, rows with k >= n or k <= 0).
func topkSlices(plan *kernels.TopKPlan) (slice, slices, kmax int) {
	maxN := 0
	for r := range plan.Rows() {
		n, k := int(plan.N[r]), int(plan.K[r])
		if k <= 0 || k >= n {
			return 0, 0, 0
		}
		maxN, kmax = max(maxN, n), max(kmax, k)
	}
	if maxN < 4*topkSliceMax/2 || 2*kmax > topkCandMax {
		return 0, 0, 0 // one block per row is as fast for short rows
	}
	slices = min(topkCandMax/kmax, (maxN+topkSliceMax/4-1)/(topkSliceMax/4))
	slice = (maxN + slices - 1) / slices
	if slice > topkSliceMax || slice <= kmax {
		return 0, 0, 0
	}
	slices = (maxN + slice - 1) / slice
	if plan.Rows()*slices > 2*targetSMs {
		// Enough rows to fill the GPU one block each (measured on an
		// H200: 64 rows of 65536 run faster in one stage).
		return 0, 0, 0
	}
	return slice, slices, kmax
}

// Threshold top-K limits (topk_thr.cuh, quest_topk_thr): rows of at most
// topkThrMaxN scores keeping at most topkThrMaxK.
const (
	topkThrMaxN = 8192 * 8
	topkThrMaxK = 4096 / 8
)

// topkThr reports whether every row suits quest_topk_thr.
func topkThr(plan *kernels.TopKPlan) bool {
	for r := range plan.Rows() {
		if plan.N[r] > topkThrMaxN || plan.K[r] > topkThrMaxK {
			return false
		}
	}
	return true
}

// Multi-block radix top-K limits (topk_radix.cuh, quest_topk_radix).
const (
	topkRadixThreads = 1024 // RADIX_THREADS
	topkRadixMaxK    = 4096 // RADIX_KMAX: the largest k of a row with k < n
	topkRadixSCap    = 3072 // RADIX_SCAP
	topkRadixCtrl    = 32   // RADIX_CTRL: control ints per row
	topkRadixBins    = 4096 // RADIX_BINS
	// topkRadixTile is the fewest scores per block and pass worth a
	// block of their own.
	topkRadixTile = 16384
	// topkRadixMinN: a plan that neither the threshold nor the two-stage
	// top-K takes runs the multi-block radix select when its longest row
	// (with 0 < k < n) has at least this many scores, else one block per
	// row (quest_topk). A guess, not a measurement: tune it with
	// BenchmarkTopKLong (the radix select costs a fixed few microseconds
	// of launch, memset and pass hand-overs; one block per row scales
	// with the row).
	topkRadixMinN = 32768
	// topkRadixBufBytes bounds the candidate buffers of all rows.
	topkRadixBufBytes = 64 << 20
)

// topkRadix reports whether plan suits the multi-block radix select: a row
// with 0 < k < n of at least topkRadixMinN scores, and every such row
// keeping at most topkRadixMaxK.
func topkRadix(plan *kernels.TopKPlan) bool {
	maxN := 0
	for r := range plan.Rows() {
		if n, k := int(plan.N[r]), int(plan.K[r]); k > 0 && k < n {
			maxN = max(maxN, n)
		}
	}
	return maxN >= topkRadixMinN && topkRadixFits(plan)
}

// topkRadixFits reports whether the multi-block radix select takes plan:
// every row with 0 < k < n keeps at most topkRadixMaxK.
func topkRadixFits(plan *kernels.TopKPlan) bool {
	for r := range plan.Rows() {
		if n, k := int(plan.N[r]), int(plan.K[r]); k > 0 && k < n && k > topkRadixMaxK {
			return false
		}
	}
	return true
}

// launchTopKRadix runs quest_topk_radix over every row of plan (any n and
// k; rows with 0 < k < n must keep at most topkRadixMaxK): a memset of the
// control words and one launch, no host synchronization.
func (b *Backend) launchTopKRadix(plan *kernels.TopKPlan, scores cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr) error {
	rows := plan.Rows()
	maxN := 1
	for r := range rows {
		maxN = max(maxN, int(plan.N[r]))
	}
	ib := max(1, bits.Len(uint(maxN-1)))
	npass := (32+ib+11)/12 + 1 // 12-bit digits of the (key, index) composite, then a gathering pass
	g := max(1, min(targetSMs/rows, (maxN+topkRadixTile-1)/topkRadixTile))
	bufcap := min(1<<16, maxN, topkRadixBufBytes/(16*rows))
	bufcap = max(bufcap, topkRadixSCap)
	ctrlWords := int64(64 + rows*topkRadixCtrl)
	ctrl, err := b.buf("topk.radix.ctrl", ctrlWords*4)
	if err != nil {
		return err
	}
	if err := cu.MemsetD32Async(ctrl, 0, ctrlWords, cu.Stream{}); err != nil {
		return fmt.Errorf("cuda: zero top-K control words: %w", err)
	}
	// The histograms are zero between launches (each pass clears what it
	// used); a new buffer starts zeroed.
	old := b.bufs["topk.radix.hist"]
	hist, err := b.buf("topk.radix.hist", int64(rows*topkRadixBins)*4)
	if err != nil {
		return err
	}
	if nb := b.bufs["topk.radix.hist"]; nb != old {
		if err := cu.MemsetD32Async(hist, 0, nb.size/4, cu.Stream{}); err != nil {
			return fmt.Errorf("cuda: zero top-K histograms: %w", err)
		}
	}
	kept, err := b.buf("topk.radix.kept", int64(rows*topkRadixMaxK)*4)
	if err != nil {
		return err
	}
	cand, err := b.buf("topk.radix.cand", int64(rows)*2*int64(bufcap)*8)
	if err != nil {
		return err
	}
	grid := npass*rows*g + rows
	return b.launch("quest_topk_radix", [3]int{grid, 1, 1}, topkRadixThreads, 0, u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out),
		u(ctrl), u(hist), u(kept), u(cand), uint64(rows), uint64(g), uint64(ib), uint64(npass), uint64(bufcap))
}

// Sample-then-one-pass top-K limits (topk_sample.cuh, quest_topk_sample_t*).
const (
	topkSampleSCap  = 3072  // SAMP_SCAP
	topkSampleSMax  = 10240 // SAMP_SMAX: the most sampled scores per row
	topkSampleStats = 8     // SAMP_STATS: statistics ints before the rows'
	topkSampleRow   = 2     // SAMP_ROW: control ints per row
	// Flags (SAMP_F_*), for tests.
	topkSampleFallback = 1 // every row takes the one-block fallback
	topkSampleNoSmem   = 2 // narrow the candidates in global memory
	topkSampleDirect   = 4 // append candidates to global memory as found (no staging)
)

// topkVariant is one configuration of the multi-block top-K for long
// rows: v0 is quest_topk_radix (kernel == ""); the others run kernel,
// quest_topk_sample_t<threads>, with about perSM blocks per multiprocessor
// (rows x G blocks, G = perSM*targetSMs/rows, at least tile scores per
// block), a sample of at most mmax scores per row and flags.
type topkVariant struct {
	name    string
	kernel  string
	threads int
	perSM   int
	tile    int
	mmax    int
	flags   int
}

// topkRadixVariants are timed side by side by BenchmarkTopKLong and
// checked by TestTopKLongVariants; launchTopK runs
// topkRadixVariants[topkRadixDefault].
var topkRadixVariants = []topkVariant{
	{name: "v0"},
	{name: "v1", kernel: "quest_topk_sample_t1024", threads: 1024, perSM: 1, tile: 16384, mmax: topkSampleSMax},
	{name: "v2", kernel: "quest_topk_sample_t512", threads: 512, perSM: 2, tile: 16384, mmax: topkSampleSMax},
	{name: "v3", kernel: "quest_topk_sample_t512", threads: 512, perSM: 4, tile: 8192, mmax: topkSampleSMax},
	{name: "v4", kernel: "quest_topk_sample_t256", threads: 256, perSM: 4, tile: 8192, mmax: topkSampleSMax},
	{name: "v5", kernel: "quest_topk_sample_t512", threads: 512, perSM: 2, tile: 16384, mmax: topkSampleSMax / 2},
	{name: "v6", kernel: "quest_topk_sample_t512", threads: 512, perSM: 2, tile: 16384, mmax: topkSampleSMax, flags: topkSampleDirect},
}

// topkRadixDefault indexes the variant launchTopK runs for long rows: v1,
// the fastest on the H200 (BenchmarkTopKLong, 8 rows, k 256: 59 us at
// 655,360 pages and 101 us at 4,194,304, against v0's 69 and 228;
// bench/results/2026-12-01-topk-long-h200.md).
const topkRadixDefault = 1

func topkVariantByName(name string) (topkVariant, bool) {
	for _, v := range topkRadixVariants {
		if v.name == name {
			return v, true
		}
	}
	return topkVariant{}, false
}

// launchTopKVariant runs plan (as launchTopKRadix takes it) through
// variant v: v0 is launchTopKRadix; the others are one launch of
// v.kernel, no memset (the kernel leaves its control words zero) and no
// host synchronization.
func (b *Backend) launchTopKVariant(plan *kernels.TopKPlan, scores cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr, v topkVariant) error {
	if v.kernel == "" {
		return b.launchTopKRadix(plan, scores, ptrs, out)
	}
	rows := plan.Rows()
	maxN := 1
	for r := range rows {
		maxN = max(maxN, int(plan.N[r]))
	}
	g := max(1, min(v.perSM*targetSMs/rows, (maxN+v.tile-1)/v.tile))
	bufcap := max(topkSampleSCap, min(maxN, topkRadixBufBytes/(8*rows)))
	ctrl, err := b.topkSampleCtrl(rows)
	if err != nil {
		return err
	}
	cand, err := b.buf("topk.sample.cand", int64(rows)*int64(bufcap)*8)
	if err != nil {
		return err
	}
	return b.launch(v.kernel, [3]int{rows * g, 1, 1}, v.threads, 0,
		u(scores), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(out),
		u(ctrl), u(cand), uint64(g), uint64(bufcap), uint64(v.mmax), uint64(v.flags))
}

// topkSampleCtrl returns the sample top-K's control words for rows rows:
// zero when new (every launch leaves the rows' words zero).
func (b *Backend) topkSampleCtrl(rows int) (cu.DevicePtr, error) {
	old := b.bufs["topk.sample.ctrl"]
	ctrl, err := b.buf("topk.sample.ctrl", int64(topkSampleStats+rows*topkSampleRow)*4)
	if err != nil {
		return 0, err
	}
	if nb := b.bufs["topk.sample.ctrl"]; nb != old {
		if err := cu.MemsetD32Async(ctrl, 0, nb.size/4, cu.Stream{}); err != nil {
			return 0, fmt.Errorf("cuda: zero top-K control words: %w", err)
		}
	}
	return ctrl, nil
}
