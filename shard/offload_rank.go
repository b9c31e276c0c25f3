package shard

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/questrt/questrt/kernels"
)

// splitPrefetch keeps, in each ranked row's output, the plan's K best
// pages (score descending, ties to the lower page) in ascending page
// order, as a top-K of K writes them, and moves the rest to ls.pfCand
// (physical pages with their scores).
func (ls *LocalStep) splitPrefetch() {
	row := 0
	for i, p := range ls.parts {
		pl := p.Plan
		if pl.Dense || pl.Rank == 0 {
			continue
		}
		pages := ls.batch.Pages[ls.batch.Indptr[i]:ls.batch.Indptr[i+1]]
		for range ls.rows {
			off, k := int(ls.topk.OutOff[row]), int(ls.topk.K[row])
			keep := min(pl.Rank, k)
			if k > keep {
				ls.order = ls.order[:0]
				for j := off; j < off+k; j++ {
					ls.order = append(ls.order, int32(j))
				}
				slices.SortFunc(ls.order, func(a, b int32) int {
					if c := cmp.Compare(ls.selScores[b], ls.selScores[a]); c != 0 {
						return c
					}
					return cmp.Compare(ls.sel[a], ls.sel[b])
				})
				for _, j := range ls.order[keep:] {
					ls.pfCand = append(ls.pfCand, cand{score: ls.selScores[j], page: pages[ls.sel[j]]})
				}
				// The kept ones back in ascending page order, in place.
				ls.order = ls.order[:keep]
				slices.SortFunc(ls.order, func(a, b int32) int { return cmp.Compare(ls.sel[a], ls.sel[b]) })
				ls.keepSel, ls.keepScore = ls.keepSel[:0], ls.keepScore[:0]
				for _, j := range ls.order {
					ls.keepSel, ls.keepScore = append(ls.keepSel, ls.sel[j]), append(ls.keepScore, ls.selScores[j])
				}
				copy(ls.sel[off:], ls.keepSel)
				copy(ls.selScores[off:], ls.keepScore)
				ls.topk.K[row] = int32(keep)
			}
			row++
		}
	}
}

// compact readdresses the step for attention by device slot over only the
// pages ls.lists attend (one pass: all of them resident): o.batch holds,
// per sequence, the slots of its attended pages, the sequence's last page
// (if attended) last so that its valid length stays LastLen, and o.lists
// the rows renumbered to those positions in their own order. Attention
// over it equals attention over the whole batch bit for bit (the same
// pages, rows in the same order), and costs O(pages attended) on the host
// instead of O(pages).
func (o *offload) compact(s *Shard, ls *LocalStep) error {
	b := &ls.batch
	o.cPages = o.cPages[:0]
	o.cIndptr = append(o.cIndptr[:0], 0)
	o.cLast = o.cLast[:0]
	l := &o.lists
	l.Mode, l.All = ls.lists.Mode, false
	l.Indptr = append(l.Indptr[:0], 0)
	l.Pages = l.Pages[:0]
	for i := range ls.parts {
		pages := b.Pages[b.Indptr[i]:b.Indptr[i+1]]
		np := len(pages)
		ep := next(&o.posEp, o.posMark)
		base := int32(len(o.cPages))
		n := int32(0)
		lastListed := false
		rows := ls.lists.Indptr[i*ls.rows : (i+1)*ls.rows+1]
		for _, lp := range ls.lists.Pages[rows[0]:rows[len(rows)-1]] {
			if int(lp) == np-1 {
				lastListed = true
				continue
			}
			if p := pages[lp]; o.posMark[p] != ep {
				o.posMark[p], o.pos[p] = ep, n
				o.cPages = append(o.cPages, p)
				n++
			}
		}
		if lastListed {
			p := pages[np-1]
			o.posMark[p], o.pos[p] = ep, n // a page is once in a sequence
			o.cPages = append(o.cPages, p)
			n++
		}
		for k := range ls.rows {
			for _, lp := range ls.lists.Pages[rows[k]:rows[k+1]] {
				l.Pages = append(l.Pages, o.pos[pages[lp]])
			}
			l.Indptr = append(l.Indptr, int32(len(l.Pages)))
		}
		last := int32(s.cfg.Store.PageSize) // every attended page is full
		if lastListed {
			last = b.LastLen[i]
		}
		o.cIndptr = append(o.cIndptr, base+n)
		o.cLast = append(o.cLast, last)
	}
	o.slots = s.store.AppendSlots(o.slots[:0], o.cPages)
	for j, sl := range o.slots {
		if sl < 0 {
			return fmt.Errorf("page %d is to be attended but not resident after its recall", o.cPages[j])
		}
	}
	o.batch = kernels.Batch{Indptr: o.cIndptr, Pages: o.slots, LastLen: o.cLast}
	return nil
}
