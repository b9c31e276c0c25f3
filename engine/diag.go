package engine

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// diagnose fills res.Diag after a sparse run: the attended pages and scores
// per query head gathered from every shard, then a dense run on the same
// data for the output error (on the backends, in place), and the attention
// mass and top-R recall from the keys of every shard's pages: read in
// place on host-resident shards, a bounded chunk at a time from
// device-resident ones (shard.PageKeys). No values or summaries are read
// back.
func (e *Engine) diagnose(ctx context.Context, layer int, reqs []Request, seqs []*seqState, opt StepOptions, res *Result) error {
	c := e.cfg
	d, g := c.HeadDim, c.QHeads/c.KVHeads
	topR := opt.TopR
	if topR <= 0 {
		topR = 10
	}
	rowOf := func(hl int) int {
		if c.Policy.GQA == kernels.PerHead {
			return hl
		}
		return hl / g
	}
	scored := e.work[0][0].ls.Scored()
	res.Diag = res.Diag[:0]
	for i, sq := range seqs {
		pl := res.Plans[i]
		np := pl.Pages
		dg := shard.Diagnostics{Selected: make([][]int32, c.QHeads), MinMassRecall: 1}
		if scored {
			dg.Scores = make([][]float32, c.QHeads)
		}
		attended := make([]bool, np)
		for h := range c.QHeads {
			tp, hl := h/e.qT, h%e.qT
			r := rowOf(hl)
			rows := e.work[tp][0].ls.Rows()
			clear(attended)
			if pl.Dense {
				for p := range attended {
					attended[p] = true
				}
			} else {
				for p := range pl.Sink {
					attended[p] = true
				}
				for p := pl.Hi(); p < np; p++ {
					attended[p] = true
				}
				for cp := range c.CP {
					sel := &e.work[tp][cp].sel
					row := i*rows + r
					for _, gp := range sel.Pages[sel.Indptr[row]:sel.Indptr[row+1]] {
						if e.owner(sq, int(gp)) == cp {
							attended[gp] = true
						}
					}
				}
			}
			var list []int32
			for p, a := range attended {
				if a {
					list = append(list, int32(p))
				}
			}
			dg.Selected[h] = list
			if scored {
				sc := make([]float32, np)
				for cp := range c.CP {
					ls := &e.work[tp][cp].ls
					for lp := range ls.LocalPages(i) {
						sc[sq.layout.Place(cp).Global(lp)] = ls.PageScore(i, r, lp)
					}
				}
				dg.Scores[h] = sc
			}
		}
		dg.CountPages(g, np)
		res.Diag = append(res.Diag, dg)
	}
	// Dense reference on the same data.
	dense := &Result{}
	densePlans := make([]plan.Plan, len(res.Plans))
	for i, pl := range res.Plans {
		densePlans[i] = pl.AsDense()
	}
	if err := e.run(ctx, layer, reqs, seqs, densePlans, false, false, dense); err != nil {
		return err
	}
	scale := 1 / math.Sqrt(float64(d))
	stats := make([]*shard.TokenStats, c.QHeads)
	next := make([]int, c.QHeads)
	keys := make([][]*shard.PageKeys, c.TP)
	var table []int32
	for i, sq := range seqs {
		dg := &res.Diag[i]
		n := sq.lens[layer]
		np := res.Plans[i].Pages
		// A key reader over each shard's pages of the sequence (in place
		// on host-resident shards; page lp of keys[tp][cp] is the shard's
		// local page lp). Values and summaries are not needed: the dense
		// reference above ran on the backends.
		for tp := range c.TP {
			keys[tp] = keys[tp][:0]
			for cp := range c.CP {
				sh := e.shards[tp][cp]
				var err error
				if table, err = sh.Store().AppendPageTable(table[:0], sq.local[tp][cp]); err != nil {
					return err
				}
				kr, err := sh.PageKeys(layer, slices.Clone(table))
				if err != nil {
					return fmt.Errorf("diagnostics: %w", err)
				}
				keys[tp] = append(keys[tp], kr)
			}
		}
		for h := range c.QHeads {
			stats[h] = shard.NewTokenStats(float64(dense.LSE[i*c.QHeads+h]), topR)
			next[h] = 0
		}
		// Page by page in global order (each page's keys read once per TP
		// rank), every head's tokens in ascending order.
		blk := c.PageSize * d
		for p := range np {
			cp := e.owner(sq, p)
			lp := sq.layout.Place(cp).Local(p)
			for tp := range c.TP {
				kp, err := keys[tp][cp].Keys(ctx, lp)
				if err != nil {
					return fmt.Errorf("diagnostics: %w", err)
				}
				for hl := range e.qT {
					h := tp*e.qT + hl
					sel := dg.Selected[h]
					for next[h] < len(sel) && sel[next[h]] < int32(p) {
						next[h]++
					}
					in := next[h] < len(sel) && sel[next[h]] == int32(p)
					q := reqs[i].Q[h*d : (h+1)*d]
					page := kp[(hl/g)*blk:][:blk]
					for t := range min(c.PageSize, n-p*c.PageSize) {
						stats[h].Add(float64(kernels.Dot(q, page[t*d:(t+1)*d]))*scale, in)
					}
				}
			}
		}
		for _, ts := range stats {
			ts.AddTo(dg)
		}
		dg.Recall /= float64(c.QHeads)
		dg.MassRecall /= float64(c.QHeads)
		o, od := res.O[i*c.QHeads*d:(i+1)*c.QHeads*d], dense.O[i*c.QHeads*d:(i+1)*c.QHeads*d]
		dg.RelL2, dg.AbsL2 = shard.RelL2(o, od), shard.AbsL2(o, od)
	}
	return nil
}
