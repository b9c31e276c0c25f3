package shard

import (
	"container/heap"
	"context"
	"math"
	"slices"

	"github.com/questrt/questrt/kernels"
)

// diagnose measures sequence i's selection against dense attention on the
// same data: page recall of the dense top-R tokens, attention-mass recall
// 1 - eps (notes eq. 6-7) and the output's relative L2 error.
func (s *Shard) diagnose(ctx context.Context, ws *LocalStep, i int, res *StepResult, opt StepOptions) (Diagnostics, error) {
	kl, rows, mode := ws.kl, ws.rows, ws.mode
	sh := s.shape
	d, g := sh.HeadDim, sh.Group()
	topR := opt.TopR
	if topR <= 0 {
		topR = 10
	}
	pl := res.Plans[i]
	np := pl.Pages
	lo, hi := ws.batch.Indptr[i], ws.batch.Indptr[i+1]
	one := kernels.Batch{Indptr: []int32{0, hi - lo}, Pages: ws.batch.Pages[lo:hi], LastLen: ws.batch.LastLen[i : i+1]}
	q := ws.q[i*sh.QHeads*d:][:sh.QHeads*d]
	dense := &kernels.Lists{Mode: kernels.GroupMax, Indptr: make([]int32, sh.KVHeads+1)}
	for h := range sh.KVHeads {
		for p := range np {
			dense.Pages = append(dense.Pages, int32(p))
		}
		dense.Indptr[h+1] = int32(len(dense.Pages))
	}
	od := make([]float32, sh.QHeads*d)
	lsed := make([]float32, sh.QHeads)
	if err := s.be.Attend(ctx, sh, kl, &one, q, dense, od, lsed); err != nil {
		return Diagnostics{}, err
	}
	dg := Diagnostics{Selected: make([][]int32, sh.QHeads), MinMassRecall: 1}
	if ws.scored {
		dg.Scores = make([][]float32, sh.QHeads)
	}
	scale := 1 / math.Sqrt(float64(d))
	attended := make([]bool, np)
	union := make([]bool, np)
	for h := range sh.QHeads {
		r := h / g
		if mode == kernels.PerHead {
			r = h
		}
		row := i*rows + r
		sel := slices.Clone(ws.lists.Pages[ws.lists.Indptr[row]:ws.lists.Indptr[row+1]])
		slices.Sort(sel)
		dg.Selected[h] = sel
		if ws.scored {
			off := ws.batch.ScoreOffset(i, rows) + r*np
			dg.Scores[h] = slices.Clone(ws.scores[off : off+np])
		}
		if h%g == 0 {
			clear(union)
		}
		clear(attended)
		for _, p := range sel {
			attended[p] = true
			union[p] = true
		}
		if h%g == g-1 {
			// The KV head reads the union of its query heads' pages.
			dg.PagesTotal += np
			for _, u := range union {
				if u {
					dg.PagesRead++
				}
			}
		}
		qh := q[h*d:][:d]
		kvh := h / g
		var mass float64
		top := &tokenHeap{}
		for p := range np {
			n := sh.PageSize
			if p == np-1 {
				n = int(one.LastLen[0])
			}
			base := (int(one.Pages[p])*sh.KVHeads + kvh) * sh.PageSize * d
			for t := range n {
				logit := float64(kernels.Dot(qh, kl.K[base+t*d:][:d])) * scale
				if attended[p] {
					mass += math.Exp(logit - float64(lsed[h]))
				}
				if top.Len() < topR {
					heap.Push(top, tokenScore{logit, int32(p)})
				} else if logit > (*top)[0].logit {
					(*top)[0] = tokenScore{logit, int32(p)}
					heap.Fix(top, 0)
				}
			}
		}
		hit := 0
		for _, ts := range *top {
			if attended[ts.page] {
				hit++
			}
		}
		dg.Recall += float64(hit) / float64(top.Len())
		mass = min(mass, 1)
		dg.MassRecall += mass
		dg.MinMassRecall = min(dg.MinMassRecall, mass)
	}
	dg.Recall /= float64(sh.QHeads)
	dg.MassRecall /= float64(sh.QHeads)
	var num, den float64
	o := res.O[i*sh.QHeads*d:][:sh.QHeads*d]
	for j := range od {
		e := float64(o[j]) - float64(od[j])
		num += e * e
		den += float64(od[j]) * float64(od[j])
	}
	if den > 0 {
		dg.RelL2 = math.Sqrt(num / den)
	}
	return dg, nil
}

type tokenScore struct {
	logit float64
	page  int32
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
