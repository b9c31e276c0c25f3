package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// abortTimeout bounds the best-effort aborts a failing rank sends to its
// peers (on a context detached from the step's, which may be done).
const abortTimeout = 100 * time.Millisecond

// rankWork is one rank's reusable state for a layer.
type rankWork struct {
	parts []shard.SeqPart
	ls    shard.LocalStep
	sel   shard.Chosen
	prog  shard.Program
	grp   stepGroup
	t     Times
	// Selection reuse (reuse.go): per batch index, whether the layer
	// reuses the sequence's kept selection; scratch for the rewrite.
	reuse []bool
	// fromLayer, per batch index, says the reuse takes the layer
	// before's selection (plan.Policy.ReuseLayers).
	fromLayer []bool
	tmp       shard.Chosen
	// The program's hooks, made once per rank: the reuse of the layer
	// in progress (at) and the union quota.
	at         reuseAt
	selected   func(*shard.Chosen)
	unionQuota func(plan.Plan) int
}

// reuseAt is the layer a rank's step program runs, for its Selected
// hook: the step, the hosted rank, the layer and whether a sequence
// reuses a kept selection.
type reuseAt struct {
	st       *stepState
	i, layer int
	any      bool
}

// stepGroup is a rank's collective group as the step program's
// shard.Group: the exchanges of one (step, layer), under its tags.
type stepGroup struct {
	g          *collective.Group
	rank, size int
	d          int
	step       uint64
	layer      int
}

func (g *stepGroup) Rank() int { return g.rank }
func (g *stepGroup) Size() int { return g.size }

// SelectExact is the group's SelectExactUnordered: the shard takes a
// row as a set (shard.Group).
func (g *stepGroup) SelectExact(ctx context.Context, local [][]collective.Candidate, k []int, dst [][]int32) ([][]int32, error) {
	return g.g.SelectExactUnordered(ctx, collective.MakeTag(g.step, g.layer, collective.OpSelect), local, k, dst)
}

func (g *stepGroup) AllGather(ctx context.Context, msg []byte) ([][]byte, error) {
	return g.g.AllGather(ctx, collective.MakeTag(g.step, g.layer, collective.OpTopP), msg)
}

func (g *stepGroup) Reduce(ctx context.Context, o, lse []float32) error {
	return g.g.Reduce(ctx, collective.MakeTag(g.step, g.layer, collective.OpReduce), 0, g.d, o, lse)
}

// abort tells the peers of rk that wait on its messages of (step, layer)
// that it gives up: the selection exchange when sel is set (it has not
// sent its candidates), and the merge at the root when rk is not the root.
func (l *Local) abort(rk *rank, step uint64, layer int, err error, sel, topp bool) {
	actx, cancel := context.WithTimeout(context.Background(), abortTimeout)
	defer cancel()
	if sel {
		collective.Abort(actx, rk.tr, collective.MakeTag(step, layer, collective.OpSelect), err)
	}
	if topp {
		collective.Abort(actx, rk.tr, collective.MakeTag(step, layer, collective.OpTopP), err)
	}
	if rk.id.CP != 0 {
		collective.AbortRank(actx, rk.tr, collective.MakeTag(step, layer, collective.OpReduce), 0, err)
	}
}

// runRank runs hosted rank i's part of a layer and fills out: its new
// tokens first, then the step program.
func (l *Local) runRank(ctx context.Context, st *stepState, i, layer int, in *RankInput, out *RankOutput) error {
	rk := l.ranks[i]
	out.Appended, out.Time = 0, Times{}
	out.O, out.LSE = out.O[:0], out.LSE[:0]
	out.Diag.Rows = 0
	out.Diag.Indptr, out.Diag.Pages, out.Diag.Scores = out.Diag.Indptr[:0], out.Diag.Pages[:0], out.Diag.Scores[:0]
	if err := l.takeNew(st, i, layer, in, out); err != nil {
		l.abort(rk, st.id, layer, err, l.cfg.Mode == Exact, l.toppExchange(st))
		return fmt.Errorf("rank %v: %w", rk.id, err)
	}
	if err := l.rankStep(ctx, st, i, layer, in.Q); err != nil {
		return fmt.Errorf("rank %v: %w", rk.id, err)
	}
	w := &rk.w
	out.Time = w.t
	if rk.id.CP == 0 {
		out.O = append(out.O, w.ls.O...)
		out.LSE = append(out.LSE, w.ls.LSE...)
	}
	if st.diag {
		l.diagOut(st, rk, out)
	}
	return nil
}

// takeNew appends the step's new tokens routed to hosted rank i, in batch
// order: to its store the tokens it owns, to its mirror every one.
func (l *Local) takeNew(st *stepState, i, layer int, in *RankInput, out *RankOutput) error {
	rk := l.ranks[i]
	tok := l.cfg.KVHeadsPerRank() * l.cfg.HeadDim
	own := st.own[i]
	k := 0
	for j, si := range st.fresh {
		stores := k < len(own) && own[k] == si
		if !stores && rk.mirror == nil {
			continue
		}
		if stores {
			if err := rk.sh.Append(st.sq[si].local[i], layer, in.K[k*tok:(k+1)*tok], in.V[k*tok:(k+1)*tok]); err != nil {
				if changedBy(err) {
					err = fmt.Errorf("%w: %w", ErrChanged, err)
				}
				return fmt.Errorf("new token of sequence %d: %w", st.ids[si], err)
			}
			l.crashPoint("step/append")
			k++
		}
		if rk.mirror != nil {
			if err := rk.mirror.Append(st.ids[si], layer, in.MirrorK[j*tok:(j+1)*tok]); err != nil {
				return fmt.Errorf("new token of sequence %d: %w: %w", st.ids[si], ErrChanged, err)
			}
		}
		out.Appended++
	}
	return nil
}

// rankStep is one rank's step program for one layer: the shard's one
// step program (shard.Program) with the rank's group: local scoring and
// candidates, the selection exchange (exact), the mirror's global top-K
// (replicated) or the local picks (union), the kept selections of
// selection reuse (reuse.go), top-p pruning, sparse attention over the
// selected and forced pages the rank holds, and the merge of the partial
// states at CP rank 0 of the TP group. The merged states stay in the
// rank's LocalStep (O, LSE).
func (l *Local) rankStep(ctx context.Context, st *stepState, i, layer int, q []float32) error {
	c := l.cfg
	rk := l.ranks[i]
	qd := c.QHeadsPerRank() * c.HeadDim
	w := &rk.w
	w.t = Times{}
	w.parts = w.parts[:0]
	for si, sq := range st.sq {
		w.parts = append(w.parts, shard.SeqPart{Seq: sq.local[i], Place: sq.layout.Place(rk.id.CP), Plan: st.plans[si], Q: q[si*qd : (si+1)*qd]})
	}
	if err := rk.sh.Begin(&w.ls, layer, w.parts); err != nil {
		l.abort(rk, st.id, layer, err, c.Mode == Exact, l.toppExchange(st))
		return err
	}
	anyReuse, noRank := l.planReuse(st, i, layer)
	w.grp = stepGroup{g: rk.g, rank: rk.id.CP, size: c.CP, d: c.HeadDim, step: st.id, layer: layer}
	p := &w.prog
	*p = shard.Program{
		Group:       &w.grp,
		Phased:      st.phased,
		Diagnostics: st.diag,
		// One rank holds every page: its local top-K is the global one,
		// and a fusing backend runs the whole local step in one call.
		// (Not under selection reuse, across steps or layers: a ranking
		// step must hand back the selection it keeps, which the fused
		// call does not.)
		Fuse:     c.CP == 1 && !c.Policy.ReuseOn() && !c.Policy.ReuseLayersOn(),
		NoRank:   noRank,
		Selected: l.selectedHook(w),
	}
	w.at = reuseAt{st: st, i: i, layer: layer, any: anyReuse}
	switch c.Mode {
	case Exact:
		p.Selection = shard.SelectExact
		if c.CP == 1 {
			// One rank's local top-K is the global one: no exchange, and
			// the rows keep the top-K's ascending order, as the fused
			// step's (the exchange's rows come in no particular order).
			p.Selection = shard.SelectLocal
		}
	case Union:
		if w.unionQuota == nil {
			cp := c.CP
			w.unionQuota = func(pl plan.Plan) int { return plan.UnionQuota(pl.Rank, cp) }
		}
		p.Selection, p.Quota = shard.SelectLocal, w.unionQuota
	case Replicated:
		p.Selection, p.Mirror, p.IDs = shard.SelectReplicated, rk.mirror, st.ids
	}
	pr, err := rk.sh.Run(ctx, &w.ls, &w.sel, p)
	lt := w.ls.Time
	w.t.Score, w.t.TopK, w.t.Select, w.t.Attend, w.t.Merge, w.t.Fused = lt.Score, lt.TopK, lt.Select, lt.Attend, lt.Merge, lt.Fused
	if !pr.Fused {
		w.t.RankSkipped = noRank
		for _, r := range w.reuse {
			if r {
				w.t.Reused++
			}
		}
	}
	if err != nil && !pr.Reduced {
		// Tell the peers that wait on this rank's messages: the
		// selection exchange and the top-p messages if this rank has not
		// settled them, and the merge at the root if this rank is not the
		// root. (A failed merge told the group itself.)
		l.abort(rk, st.id, layer, err, !pr.Selected, !pr.TopPSent)
	}
	return err
}

// selectedHook returns rank work w's Selected hook (made once): the
// reused rows rewritten and the kept selections updated (reuse.go) for
// the layer in w.at.
func (l *Local) selectedHook(w *rankWork) func(*shard.Chosen) {
	if w.selected == nil {
		w.selected = func(sel *shard.Chosen) {
			at := &w.at
			if at.any {
				l.applyReuse(at.st, at.i, at.layer, w.ls.Rows(), sel, &w.tmp)
			}
			l.keepReuse(at.st, at.i, at.layer, w.ls.Rows(), sel)
		}
	}
	return w.selected
}

// toppOn reports whether the step prunes by top-p (Policy.TopP) after
// the selection: the policy asks for it and a sequence has a sparse
// plan (the same answer on every rank).
func (l *Local) toppOn(st *stepState) bool {
	if !l.cfg.Policy.TopPOn() {
		return false
	}
	for _, pl := range st.plans {
		if !pl.Dense {
			return true
		}
	}
	return false
}

// toppExchange reports whether the step's top-p messages travel among
// the CP ranks.
func (l *Local) toppExchange(st *stepState) bool { return l.cfg.CP > 1 && l.toppOn(st) }

// diagOut copies the rank's selection and page scores into out.
func (l *Local) diagOut(st *stepState, rk *rank, out *RankOutput) {
	ls := &rk.w.ls
	dg := &out.Diag
	dg.Rows = ls.Rows()
	dg.Indptr = append(dg.Indptr, rk.w.sel.Indptr...)
	dg.Pages = append(dg.Pages, rk.w.sel.Pages...)
	if !ls.Scored() {
		dg.Scores = nil
		return
	}
	for si := range st.seqs {
		n := ls.LocalPages(si)
		var sc []float32
		if si < cap(dg.Scores) {
			sc = dg.Scores[:si+1][si][:0]
		}
		for r := range dg.Rows {
			for lp := range n {
				sc = append(sc, ls.PageScore(si, r, lp))
			}
		}
		dg.Scores = append(dg.Scores, sc)
	}
}
