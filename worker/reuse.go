package worker

import (
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// Selection reuse across steps (plan.Policy.ReuseSteps, issue 32 item 5).
//
// Every hosted rank keeps, per sequence and layer, the selection of the
// layer's last ranking step: the global pages each selection row ranked
// (what the exact exchange, the replicated mirror or, under union, the
// rank's own picks chose), the plan of that step, the steps that reused
// it since and the sequence's length at the last step that used it. A
// step of a sparse layer reuses it when the policy asks for reuse (a
// step forced dense as a whole, such as the dense pass of diagnostics,
// neither reuses nor changes anything), fewer than ReuseSteps-1 steps
// reused it already, the step brings the sequence's token at exactly one
// past the last step's position (so the previous step of this layer was
// the last change to the sequence: a rollback, tokens appended outside
// steps or a step without a token make the layer rank afresh), and the
// plan has the same shape (K, Sink, Local, Rank) over at least as many
// pages. It then attends, per row, the kept pages plus the candidates
// [Hi0, Hi) that were forced (local) at the ranking step or appended
// since, and the forced pages as always; otherwise the layer ranks
// afresh and keeps the new selection. The decision depends only on the
// step messages every rank of the grid gets alike (lengths, plans, step
// outcomes), never on a message some ranks miss (a rollback reaches only
// the ranks that drop pages), so every CP rank of a TP group, each
// keeping its copy, decides alike and a CP x TP layout reads the pages
// the single shard reads. A failed step drops the kept selections of
// its sequences on every hosted rank (the coordinator ends a failed step
// on every worker), a dense plan at the layer drops it, and a new
// seqState (a fork's child, a recovered or adopted sequence) has none:
// those rank afresh at their next sparse step. A fork leaves the
// parent's state alone. A rollback followed by re-appending exactly as
// many tokens outside steps before the next step is not seen by the
// length rule: the layer then reuses its kept pages (alike on every
// rank).

// reuseSel is one rank's kept selection of one sequence at one layer.
type reuseSel struct {
	ok     bool
	since  int       // steps that reused it (0 right after the ranking step)
	last   int       // the sequence's length before the token of the last step that used it
	plan   plan.Plan // the plan of the ranking step
	indptr []int32   // per selection row, CSR over pages
	pages  []int32   // global pages the rows ranked
}

// reuseOf returns sequence sq's kept selection of hosted rank i at
// layer, allocating the table on first use.
func (l *Local) reuseOf(sq *seqState, i, layer int) *reuseSel {
	if sq.reuse == nil {
		sq.reuse = make([][]reuseSel, len(l.ranks))
	}
	if sq.reuse[i] == nil {
		sq.reuse[i] = make([]reuseSel, l.cfg.Layers)
	}
	return &sq.reuse[i][layer]
}

// dropReuse forgets sequence sq's kept selections on hosted rank i (-1:
// every hosted rank).
func (sq *seqState) dropReuse(i int) {
	for r := range sq.reuse {
		if i >= 0 && r != i {
			continue
		}
		for k := range sq.reuse[r] {
			sq.reuse[r][k].ok = false
		}
	}
}

// reuses reports whether pl can attend the kept selection rs (see the
// comment above) under a policy reusing every steps steps.
func (rs *reuseSel) reuses(s StepSeq, pl plan.Plan, steps int) bool {
	p0 := rs.plan
	return rs.ok && steps > 1 && s.New && s.Len == rs.last+1 && rs.since+1 < steps && !pl.Dense && pl.Rank > 0 &&
		pl.Sink == p0.Sink && pl.Local == p0.Local && pl.Rank == p0.Rank && pl.K == p0.K && pl.Pages >= p0.Pages
}

// planReuse decides, for every sequence of the step at layer on hosted
// rank i, whether it reuses its kept selection (w.reuse), and reports
// whether any does and whether no sequence ranks (every sparse plan
// with pages to rank reuses).
func (l *Local) planReuse(st *stepState, i, layer int) (any, none bool) {
	w := &l.ranks[i].w
	w.reuse = w.reuse[:0]
	steps := l.cfg.Policy.ReuseSteps
	if st.dense {
		steps = 0 // a forced dense step (a diagnostics pass) leaves the kept selections alone
	}
	none = true
	for si, pl := range st.plans {
		r := false
		if steps > 1 {
			r = l.reuseOf(st.sq[si], i, layer).reuses(st.seqs[si], pl, steps)
		}
		w.reuse = append(w.reuse, r)
		any = any || r
		if !r && !pl.Dense && pl.Rank > 0 {
			none = false
		}
	}
	return any, any && none
}

// applyReuse rewrites the selection rows of the reusing sequences in
// sel (rows per sequence) to their kept pages plus the candidates added
// since the ranking step, ascending.
func (l *Local) applyReuse(st *stepState, i, layer, rows int, sel *shard.Chosen, tmp *shard.Chosen) {
	w := &l.ranks[i].w
	tmp.Reset()
	for si, pl := range st.plans {
		for r := range rows {
			k := si*rows + r
			if k+1 >= len(sel.Indptr) || !w.reuse[si] {
				if k+1 < len(sel.Indptr) {
					tmp.Pages = append(tmp.Pages, sel.Pages[sel.Indptr[k]:sel.Indptr[k+1]]...)
				}
				tmp.Indptr = append(tmp.Indptr, int32(len(tmp.Pages)))
				continue
			}
			rs := l.reuseOf(st.sq[si], i, layer)
			tmp.Pages = append(tmp.Pages, rs.pages[rs.indptr[r]:rs.indptr[r+1]]...)
			for g := rs.plan.Hi(); g < pl.Hi(); g++ {
				tmp.Pages = append(tmp.Pages, int32(g))
			}
			tmp.Indptr = append(tmp.Indptr, int32(len(tmp.Pages)))
		}
	}
	sel.Indptr = append(sel.Indptr[:0], tmp.Indptr...)
	sel.Pages = append(sel.Pages[:0], tmp.Pages...)
}

// keepReuse updates the kept selections of hosted rank i at layer after
// the step's selection sel (rows per sequence) is final: a ranking step
// keeps its rows, a reusing one counts a step, a dense or unranked plan
// forgets.
func (l *Local) keepReuse(st *stepState, i, layer, rows int, sel *shard.Chosen) {
	if !l.cfg.Policy.ReuseOn() || st.dense {
		return
	}
	w := &l.ranks[i].w
	for si, pl := range st.plans {
		rs := l.reuseOf(st.sq[si], i, layer)
		switch {
		case w.reuse[si]:
			rs.since++
			rs.last = st.seqs[si].Len
		case pl.Dense || pl.Rank == 0:
			rs.ok = false
		default:
			rs.ok, rs.since, rs.plan, rs.last = true, 0, pl, st.seqs[si].Len
			rs.indptr = append(rs.indptr[:0], 0)
			rs.pages = rs.pages[:0]
			for r := range rows {
				k := si*rows + r
				rs.pages = append(rs.pages, sel.Pages[sel.Indptr[k]:sel.Indptr[k+1]]...)
				rs.indptr = append(rs.indptr, int32(len(rs.pages)))
			}
		}
	}
}
