package engine

import (
	"context"
	"fmt"
	"math"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/shard"
	"github.com/questrt/questrt/worker"
)

// diagnose fills res.Diag after a sparse run from the plain data the
// workers returned (every rank's selection and page scores), then runs a
// dense reference step through the workers on the same data (ForceDense,
// no new tokens) for the output error, and computes the attention mass
// and top-R recall from the keys of every rank's pages, read back through
// the workers (Worker.Keys, keyChunkBytes at a time: remote workers send
// them over the network, so diagnostics cost O(context) bytes per step).
// No values or summaries are read back.
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
	outs := make([][]*worker.RankOutput, c.TP)
	scored := false
	for tp := range c.TP {
		for cp := range c.CP {
			out := e.output(e.reps, tp, cp)
			if out == nil {
				return fmt.Errorf("no reply from shard (tp %d, cp %d)", tp, cp)
			}
			outs[tp] = append(outs[tp], out)
			scored = scored || out.Diag.Scores != nil
		}
	}
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
				for cp, out := range outs[tp] {
					dd := &out.Diag
					row := i*dd.Rows + r
					for _, gp := range dd.Pages[dd.Indptr[row]:dd.Indptr[row+1]] {
						if sq.layout.Owner(int(gp)) == cp {
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
				for cp, out := range outs[tp] {
					if out.Diag.Scores == nil {
						continue
					}
					rows := out.Diag.Rows
					all := out.Diag.Scores[i]
					n := len(all) / rows
					place := sq.layout.Place(cp)
					for lp, s := range all[r*n : (r+1)*n] {
						sc[place.Global(lp)] = s
					}
				}
				dg.Scores[h] = sc
			}
		}
		dg.CountPages(g, np)
		res.Diag = append(res.Diag, dg)
	}
	// Dense reference on the same data, through the workers (the new
	// tokens are in already).
	if e.dreps == nil {
		e.dreps = make([]worker.LayerReply, len(e.workers))
	}
	if err := e.run(ctx, layer, reqs, seqs, runOptions{dense: true}, e.dreps); err != nil {
		return err
	}
	dense := &Result{}
	e.gather(len(reqs), e.dreps, dense)
	res.DenseLSE = append(res.DenseLSE[:0], dense.LSE...)
	scale := 1 / math.Sqrt(float64(d))
	stats := make([]*shard.TokenStats, c.QHeads)
	next := make([]int, c.QHeads)
	// One key reader per rank, kept across steps with its buffer.
	if e.keys == nil {
		e.keys = make([][]keyReader, c.TP)
		for tp := range e.keys {
			e.keys[tp] = make([]keyReader, c.CP)
		}
	}
	keys := e.keys
	for i, sq := range seqs {
		dg := &res.Diag[i]
		n := sq.lens[layer]
		np := res.Plans[i].Pages
		// A key reader over each rank's pages of the sequence, through its
		// worker (Keys, a chunk at a time). Values and summaries are not
		// needed: the dense reference above ran on the backends.
		for tp := range c.TP {
			for cp := range c.CP {
				keys[tp][cp].reset(e.worker(tp, cp), uint64(reqs[i].Seq), worker.Rank{TP: tp, CP: cp}, layer,
					sq.layout.Place(cp).Count(np), max(1, keyChunkBytes/(4*e.kvT*c.PageSize*d)))
			}
		}
		for h := range c.QHeads {
			stats[h] = shard.NewTokenStats(float64(dense.LSE[i*c.QHeads+h]), topR)
			next[h] = 0
		}
		var slack shard.SlackStats
		stride := shard.SlackStride(np)
		stopRule := opt.StopRule && !res.Plans[i].Dense
		if stopRule {
			if len(e.stopCols) < c.QHeads {
				e.stopCols = make([]shard.StopCollector, c.QHeads)
			}
			for h := range c.QHeads {
				e.stopCols[h].Reset()
			}
		}
		// Page by page in global order (each page's keys read once per TP
		// rank), every head's tokens in ascending order.
		blk := c.PageSize * d
		for p := range np {
			cp := sq.layout.Owner(p)
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
					valid := min(c.PageSize, n-p*c.PageSize)
					for t := range valid {
						stats[h].Add(float64(kernels.Dot(q, page[t*d:(t+1)*d]))*scale, in)
					}
					if p%stride == 0 {
						slack.Add(shard.PageSlack(q, page, valid, d))
					}
					if stopRule {
						e.stopCols[h].AddPage(q, page, valid, d)
					}
				}
			}
		}
		for _, ts := range stats {
			ts.AddTo(dg)
		}
		slack.AddTo(dg)
		if stopRule {
			pl := res.Plans[i]
			forced := make([]bool, np)
			for p := range forced {
				forced[p] = p < pl.Sink || p >= pl.Hi()
			}
			dg.Stop = dg.Stop[:0]
			for h := range c.QHeads {
				dg.Stop = append(dg.Stop, e.stopCols[h].Row(h, forced, topR))
			}
		}
		dg.Recall /= float64(c.QHeads)
		dg.MassRecall /= float64(c.QHeads)
		o, od := res.O[i*c.QHeads*d:(i+1)*c.QHeads*d], dense.O[i*c.QHeads*d:(i+1)*c.QHeads*d]
		dg.RelL2, dg.AbsL2 = shard.RelL2(o, od), shard.AbsL2(o, od)
	}
	return nil
}

// keyChunkBytes bounds the keys one Worker.Keys call of the diagnostics
// reads.
const keyChunkBytes = 1 << 20

// keyReader reads one rank's keys of a sequence through its worker, a
// chunk of local pages at a time (the diagnostics read them in increasing
// local order).
type keyReader struct {
	w          worker.Worker
	seq        uint64
	rank       worker.Rank
	layer      int
	pages      int // the rank's local pages of the sequence
	chunk      int // pages per call
	lo, n, blk int
	rep        worker.KeysReply
}

// reset points k at another sequence's pages, keeping its buffer.
func (k *keyReader) reset(w worker.Worker, seq uint64, r worker.Rank, layer, pages, chunk int) {
	k.w, k.seq, k.rank, k.layer, k.pages, k.chunk = w, seq, r, layer, pages, chunk
	k.lo, k.n = 0, 0
}

// Keys returns the keys of local page lp, [KVHeads/TP][PageSize][HeadDim].
func (k *keyReader) Keys(ctx context.Context, lp int) ([]float32, error) {
	if lp < k.lo || lp >= k.lo+k.n {
		n := min(k.chunk, k.pages-lp)
		if n <= 0 {
			return nil, fmt.Errorf("diagnostics: page %d of rank %v's %d", lp, k.rank, k.pages)
		}
		if err := k.w.Keys(ctx, worker.KeysRequest{Seq: k.seq, Rank: k.rank, Layer: k.layer, From: lp, Count: n}, &k.rep); err != nil {
			return nil, err
		}
		if len(k.rep.K)%n != 0 || len(k.rep.K) == 0 {
			return nil, fmt.Errorf("diagnostics: rank %v sent %d key floats for %d pages", k.rank, len(k.rep.K), n)
		}
		k.lo, k.n, k.blk = lp, n, len(k.rep.K)/n
	}
	o := (lp - k.lo) * k.blk
	return k.rep.K[o : o+k.blk], nil
}
