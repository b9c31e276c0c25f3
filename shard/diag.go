package shard

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/questrt/questrt/kernels"
)

// diagnose measures sequence i's selection against dense attention on the
// same data: page recall of the dense top-R tokens, attention-mass recall
// 1 - eps (notes eq. 6-7) and the output's relative L2 error. The dense
// reference runs on the backend in place; the per-token logits need only
// the keys, read in place on a host-resident shard and a bounded chunk at
// a time from a DeviceResident one (see [PageKeys]). Values and summaries
// are never read back.
func (s *Shard) diagnose(ctx context.Context, ws *LocalStep, i int, res *StepResult, opt StepOptions) (Diagnostics, error) {
	rows, mode := ws.rows, ws.mode
	sh := s.shape
	d, g := sh.HeadDim, sh.Group()
	topR := opt.TopR
	if topR <= 0 {
		topR = 10
	}
	pl := res.Plans[i]
	np := pl.Pages
	lo, hi := ws.batch.Indptr[i], ws.batch.Indptr[i+1]
	one := kernels.Batch{Indptr: []int32{0, hi - lo}, LastLen: ws.batch.LastLen[i : i+1]}
	if t := ws.batch.Tables; t != nil {
		one.Tables = &kernels.DeviceTables{Set: t.Set, Seqs: t.Seqs[i : i+1]}
	} else {
		one.Pages = ws.batch.Pages[lo:hi]
	}
	q := ws.q[i*sh.QHeads*d:][:sh.QHeads*d]
	phys, err := s.batchPhys(&one)
	if err != nil {
		return Diagnostics{}, err
	}
	if len(phys) != np {
		return Diagnostics{}, fmt.Errorf("diagnostics: the step read %d pages, the plan has %d", len(phys), np)
	}
	keys, err := s.pageKeys(ws.layer, phys, true)
	if err != nil {
		return Diagnostics{}, err
	}
	dense := &kernels.Lists{Mode: kernels.GroupMax, All: true}
	od := make([]float32, sh.QHeads*d)
	lsed := make([]float32, sh.QHeads)
	dl, db := ws.kl, &one
	if s.off != nil {
		// The dense reference reads every page: copies, not the
		// device pool (which may not hold them all).
		if dl, db, err = s.hostView(ctx, ws.kl, ws.layer, &one); err != nil {
			return Diagnostics{}, err
		}
	}
	if err := s.be.Attend(ctx, sh, dl, db, q, dense, od, lsed); err != nil {
		return Diagnostics{}, err
	}
	dg := Diagnostics{Selected: make([][]int32, sh.QHeads), MinMassRecall: 1}
	if ws.scored {
		dg.Scores = make([][]float32, sh.QHeads)
	}
	stats := make([]*TokenStats, sh.QHeads)
	for h := range sh.QHeads {
		r := h / g
		if mode == kernels.PerHead {
			r = h
		}
		row := i*rows + r
		var sel []int32
		if ws.lists.All {
			sel = make([]int32, np)
			for p := range sel {
				sel[p] = int32(p)
			}
		} else {
			sel = slices.Clone(ws.lists.Pages[ws.lists.Indptr[row]:ws.lists.Indptr[row+1]])
			slices.Sort(sel)
		}
		dg.Selected[h] = sel
		if ws.scored {
			off := ws.batch.ScoreOffset(i, rows) + r*np
			dg.Scores[h] = slices.Clone(ws.scores[off : off+np])
		}
		stats[h] = NewTokenStats(float64(lsed[h]), topR)
	}
	// Page by page (each page's keys read once), every head's tokens in
	// ascending order: the order TokenStats sees is the dense order.
	scale := 1 / math.Sqrt(float64(d))
	next := make([]int, sh.QHeads) // per head: the first entry of Selected not below p
	var slack SlackStats
	stride := SlackStride(np)
	var stops []StopCollector
	if opt.StopRule && !pl.Dense {
		stops = make([]StopCollector, sh.QHeads)
	}
	for p := range np {
		kp, err := keys.Keys(ctx, p)
		if err != nil {
			return Diagnostics{}, fmt.Errorf("diagnostics: %w", err)
		}
		n := sh.PageSize
		if p == np-1 {
			n = int(one.LastLen[0])
		}
		for h := range sh.QHeads {
			sel := dg.Selected[h]
			for next[h] < len(sel) && sel[next[h]] < int32(p) {
				next[h]++
			}
			in := next[h] < len(sel) && sel[next[h]] == int32(p)
			qh := q[h*d:][:d]
			base := (h / g) * sh.PageSize * d
			for t := range n {
				stats[h].Add(float64(kernels.Dot(qh, kp[base+t*d:][:d]))*scale, in)
			}
			if p%stride == 0 {
				slack.Add(PageSlack(qh, kp[base:], n, d))
			}
			if stops != nil {
				stops[h].AddPage(qh, kp[base:], n, d)
			}
		}
	}
	if stops != nil {
		forced := make([]bool, np)
		for p := range forced {
			forced[p] = p < pl.Sink || p >= pl.Hi()
		}
		for h := range stops {
			dg.Stop = append(dg.Stop, stops[h].Row(h, forced, topR))
		}
	}
	for _, ts := range stats {
		ts.AddTo(&dg)
	}
	slack.AddTo(&dg)
	dg.CountPages(g, np)
	dg.Recall /= float64(sh.QHeads)
	dg.MassRecall /= float64(sh.QHeads)
	dg.RelL2 = RelL2(res.O[i*sh.QHeads*d:][:sh.QHeads*d], od)
	dg.AbsL2 = AbsL2(res.O[i*sh.QHeads*d:][:sh.QHeads*d], od)
	return dg, nil
}

// RelL2 is ||o - ref|| / ||ref||, computed in float64. When ref is zero
// the relative error is undefined: RelL2 is NaN then, unless o is zero
// too (0). [AbsL2] is always defined.
func RelL2(o, ref []float32) float64 {
	num, den := l2(o, ref)
	if den == 0 {
		if num == 0 {
			return 0
		}
		return math.NaN()
	}
	return math.Sqrt(num / den)
}

// AbsL2 is ||o - ref||, computed in float64.
func AbsL2(o, ref []float32) float64 {
	num, _ := l2(o, ref)
	return math.Sqrt(num)
}

// l2 returns ||o - ref||^2 and ||ref||^2.
func l2(o, ref []float32) (num, den float64) {
	for j := range ref {
		e := float64(o[j]) - float64(ref[j])
		num += e * e
		den += float64(ref[j]) * float64(ref[j])
	}
	return num, den
}

// TokenStats accumulates, for one query head, the diagnostics measured
// against dense attention: the dense softmax mass of the attended tokens
// (1 - eps, notes eq. 6-7) and which of the dense top-R tokens were
// attended. Feed it every valid token's scaled logit once.
type TokenStats struct {
	lse  float64
	r    int
	mass float64
	top  tokenHeap
}

// NewTokenStats starts a head whose dense lse is lseDense, tracking the
// top r tokens.
func NewTokenStats(lseDense float64, r int) *TokenStats {
	return &TokenStats{lse: lseDense, r: r}
}

// Add takes one token: its scaled logit and whether its page was attended.
// Among equal logits the earlier token stays in the top R.
func (ts *TokenStats) Add(logit float64, attended bool) {
	if attended {
		ts.mass += math.Exp(logit - ts.lse)
	}
	if ts.top.Len() < ts.r {
		heap.Push(&ts.top, tokenScore{logit, attended})
	} else if logit > ts.top[0].logit {
		ts.top[0] = tokenScore{logit, attended}
		heap.Fix(&ts.top, 0)
	}
}

// AddTo adds this head's recall and mass recall to dg's sums (Recall and
// MassRecall are averaged by the caller), lowers MinMassRecall and
// appends them to HeadRecall and HeadMassRecall: call it once per query
// head, in head order.
func (ts *TokenStats) AddTo(dg *Diagnostics) {
	hit := 0
	for _, t := range ts.top {
		if t.attended {
			hit++
		}
	}
	recall := 0.0
	if ts.top.Len() > 0 {
		recall = float64(hit) / float64(ts.top.Len())
	}
	dg.Recall += recall
	mass := min(ts.mass, 1)
	dg.MassRecall += mass
	dg.MinMassRecall = min(dg.MinMassRecall, mass)
	dg.HeadRecall = append(dg.HeadRecall, recall)
	dg.HeadMassRecall = append(dg.HeadMassRecall, mass)
}

type tokenScore struct {
	logit    float64
	attended bool
}

// tokenHeap is a min-heap on logit keeping the R best tokens.
type tokenHeap []tokenScore

func (h tokenHeap) Len() int           { return len(h) }
func (h tokenHeap) Less(i, j int) bool { return h[i].logit < h[j].logit }
func (h tokenHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *tokenHeap) Push(x any)        { *h = append(*h, x.(tokenScore)) }
func (h *tokenHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
