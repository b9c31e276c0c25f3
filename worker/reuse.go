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
	for r := range sq.layerSel {
		if i < 0 || r == i {
			sq.layerSel[r].ok = false
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

// Selection reuse across adjacent layers (plan.Policy.ReuseLayers).
//
// Every hosted rank also keeps, per sequence, the final selection rows
// of the last layer that selected at a step with a token (ranked, or
// reused itself, before top-p), with that layer, its plan and the
// sequence's length before the token. A listed layer reuses it when the
// kept layer is the one before it, the step brings the sequence's token
// at the same length and the plan is the same (pages, K, sink, local,
// rank): it then attends, per row, exactly the kept rows and the forced
// pages. The decision depends only on the step messages (lengths,
// plans), alike on every rank. A forced dense step leaves it alone; a
// dense or unranked plan, or a step without a token, forgets it; a
// failed step drops it with the step reuse state.

// layerSel is one rank's kept selection of one sequence at the last
// layer that selected.
type layerSel struct {
	ok     bool
	layer  int
	len    int // the sequence's length before the step's token
	plan   plan.Plan
	indptr []int32 // per selection row, CSR over pages
	pages  []int32
}

// layerOf returns sequence sq's kept layer selection on hosted rank i,
// allocating the table on first use.
func (l *Local) layerOf(sq *seqState, i int) *layerSel {
	if sq.layerSel == nil {
		sq.layerSel = make([]layerSel, len(l.ranks))
	}
	return &sq.layerSel[i]
}

// reuses reports whether pl at layer, in step row s, can attend the
// kept selection ls of the layer before it.
func (ls *layerSel) reuses(layer int, s StepSeq, pl plan.Plan) bool {
	return ls.ok && ls.layer == layer-1 && s.New && s.Len == ls.len && !pl.Dense && pl.Rank > 0 && pl == ls.plan
}

// planReuse decides, for every sequence of the step at layer on hosted
// rank i, whether it reuses a kept selection (w.reuse): the layer
// before's at this token (w.fromLayer, ReuseLayers) or its own from an
// earlier step (ReuseSteps, not for a listed layer), and reports
// whether any does and whether no sequence ranks (every sparse plan
// with pages to rank reuses).
func (l *Local) planReuse(st *stepState, i, layer int) (any, none bool) {
	w := &l.ranks[i].w
	w.reuse, w.fromLayer = w.reuse[:0], w.fromLayer[:0]
	pol := l.cfg.Policy
	steps := pol.ReuseSteps
	listed := pol.ReusesLayer(layer)
	if st.dense {
		// A forced dense step (a diagnostics pass) leaves the kept
		// selections alone.
		steps, listed = 0, false
	}
	none = true
	for si, pl := range st.plans {
		r, fl := false, false
		if listed {
			fl = l.layerOf(st.sq[si], i).reuses(layer, st.seqs[si], pl)
		} else if steps > 1 {
			r = l.reuseOf(st.sq[si], i, layer).reuses(st.seqs[si], pl, steps)
		}
		w.reuse = append(w.reuse, r || fl)
		w.fromLayer = append(w.fromLayer, fl)
		any = any || r || fl
		if !r && !fl && !pl.Dense && pl.Rank > 0 {
			none = false
		}
	}
	return any, any && none
}

// applyReuse rewrites the selection rows of the reusing sequences in
// sel (rows per sequence): to the layer before's rows (ReuseLayers), or
// to their kept pages (in the kept order) followed by the candidates
// added since the ranking step, ascending (ReuseSteps). A row is a set:
// the exact exchange's rows come in no particular order.
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
			if w.fromLayer[si] {
				ls := l.layerOf(st.sq[si], i)
				tmp.Pages = append(tmp.Pages, ls.pages[ls.indptr[r]:ls.indptr[r+1]]...)
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
// the step's selection sel (rows per sequence) is final. Across steps:
// a ranking step keeps its rows, a reusing one counts a step, a dense
// or unranked plan forgets, and a layer listed in ReuseLayers keeps
// nothing. Across layers: every sparse plan of a step with a token
// keeps its final rows as the sequence's last layer selection.
func (l *Local) keepReuse(st *stepState, i, layer, rows int, sel *shard.Chosen) {
	pol := l.cfg.Policy
	if st.dense || (!pol.ReuseOn() && !pol.ReuseLayersOn()) {
		return
	}
	w := &l.ranks[i].w
	listed := pol.ReusesLayer(layer)
	for si, pl := range st.plans {
		if pol.ReuseLayersOn() {
			ls := l.layerOf(st.sq[si], i)
			s := st.seqs[si]
			if pl.Dense || pl.Rank == 0 || !s.New {
				ls.ok = false
			} else {
				ls.ok, ls.layer, ls.len, ls.plan = true, layer, s.Len, pl
				keepRows(&ls.indptr, &ls.pages, sel, si, rows)
			}
		}
		if !pol.ReuseOn() {
			continue
		}
		rs := l.reuseOf(st.sq[si], i, layer)
		switch {
		case listed || pl.Dense || pl.Rank == 0:
			rs.ok = false
		case w.reuse[si]:
			rs.since++
			rs.last = st.seqs[si].Len
		default:
			rs.ok, rs.since, rs.plan, rs.last = true, 0, pl, st.seqs[si].Len
			keepRows(&rs.indptr, &rs.pages, sel, si, rows)
		}
	}
}

// keepRows copies sequence si's rows of sel (rows per sequence) into
// the CSR indptr, pages.
func keepRows(indptr, pages *[]int32, sel *shard.Chosen, si, rows int) {
	*indptr = append((*indptr)[:0], 0)
	*pages = (*pages)[:0]
	for r := range rows {
		k := si*rows + r
		*pages = append(*pages, sel.Pages[sel.Indptr[k]:sel.Indptr[k+1]]...)
		*indptr = append(*indptr, int32(len(*pages)))
	}
}
