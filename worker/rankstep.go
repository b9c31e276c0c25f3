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
	local [][]collective.Candidate
	k     []int
	lists [][]int32
	t     Times
	// Selection reuse (reuse.go): per batch index, whether the layer
	// reuses the sequence's kept selection; scratch for the rewrite.
	reuse []bool
	// fromLayer, per batch index, says the reuse takes the layer
	// before's selection (plan.Policy.ReuseLayers).
	fromLayer []bool
	tmp       shard.Chosen
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

// rankStep is one rank's step program for one layer: local scoring and
// candidates, the selection exchange (exact), the mirror's global top-K
// (replicated) or the local picks (union), sparse attention over the
// selected and forced pages the rank holds, and the merge of the partial
// states at CP rank 0 of the TP group. The merged states stay in the
// rank's LocalStep (O, LSE).
func (l *Local) rankStep(ctx context.Context, st *stepState, i, layer int, q []float32) error {
	c := l.cfg
	rk := l.ranks[i]
	d := c.HeadDim
	qd := c.QHeadsPerRank() * d
	w := &rk.w
	w.t = Times{}
	sh, g := rk.sh, rk.g
	selTag := collective.MakeTag(st.id, layer, collective.OpSelect)
	redTag := collective.MakeTag(st.id, layer, collective.OpReduce)
	// fail tells the peers that wait on this rank's messages: the
	// selection exchange if this rank has not sent its candidates yet, and
	// the merge at the root if this rank is not the root.
	selSent := c.Mode != Exact
	toppSent := !l.toppExchange(st)
	fail := func(err error) error {
		l.abort(rk, st.id, layer, err, !selSent, !toppSent)
		return err
	}
	w.parts = w.parts[:0]
	for si, sq := range st.sq {
		w.parts = append(w.parts, shard.SeqPart{Seq: sq.local[i], Place: sq.layout.Place(rk.id.CP), Plan: st.plans[si], Q: q[si*qd : (si+1)*qd]})
	}
	if err := sh.Begin(&w.ls, layer, w.parts); err != nil {
		return fail(err)
	}
	anyReuse, noRank := l.planReuse(st, i, layer)
	if noRank {
		// Every sequence that would rank reuses its kept selection: no
		// score phase (but for diagnostics) and no selection exchange.
		selSent = true
		if st.diag {
			if err := sh.Score(ctx, &w.ls, true); err != nil {
				return fail(err)
			}
		}
		w.sel.Reset()
		for range len(st.plans) * w.ls.Rows() {
			w.sel.Indptr = append(w.sel.Indptr, 0)
		}
		return l.finishRank(ctx, st, i, layer, anyReuse, noRank, st.diag, fail, &toppSent)
	}
	if c.CP == 1 && !st.phased && !l.toppOn(st) && !c.Policy.ReuseOn() && !c.Policy.ReuseLayersOn() {
		// One rank holds every page: its local top-K is the global one,
		// and a fusing backend runs the whole local step in one call.
		// (Not under selection reuse, across steps or layers: a ranking
		// step must hand back the selection it keeps, which the fused
		// call does not.)
		done, err := sh.FusedStep(ctx, &w.ls)
		if err != nil {
			return fail(err)
		}
		if done {
			w.t.Fused = w.ls.Time.Fused
			t0 := time.Now()
			err := g.Reduce(ctx, redTag, 0, d, w.ls.O, w.ls.LSE)
			w.t.Merge = time.Since(t0)
			return err
		}
	}
	if c.Mode != Replicated && !st.diag && allDense(st.plans) {
		// Every rank attends all its pages (a dense layer, or budgets
		// that cover the sequences): nothing to score, rank or exchange
		// (DESIGN: dense layers skip steps 1-3). Every rank of the group
		// plans from the same BeginStep, so all of them skip the
		// exchange together.
		selSent = true
		w.sel.Reset()
		for range len(st.plans) * w.ls.Rows() {
			w.sel.Indptr = append(w.sel.Indptr, 0)
		}
		// finishRank keeps the reuse state (a dense plan drops a
		// sequence's kept selection) and attends.
		return l.finishRank(ctx, st, i, layer, anyReuse, false, false, fail, &toppSent)
	}
	quota := func(pl plan.Plan) int { return pl.Rank }
	if c.Mode == Union {
		quota = func(pl plan.Plan) int { return plan.UnionQuota(pl.Rank, c.CP) }
	}
	// A ranking backend scores and picks the candidates in one call: only
	// the candidates come back from the device.
	ranked := false
	if c.Mode != Replicated && !st.phased {
		var err error
		if ranked, err = sh.RankCandidates(ctx, &w.ls, quota); err != nil {
			return fail(err)
		}
	}
	scoreLocal := c.Mode != Replicated || st.diag
	if scoreLocal && !ranked {
		if err := sh.Score(ctx, &w.ls, st.diag); err != nil {
			return fail(err)
		}
	}
	switch c.Mode {
	case Exact, Union:
		if !ranked {
			if err := sh.Candidates(ctx, &w.ls, quota); err != nil {
				return fail(err)
			}
		}
		if c.Mode == Union {
			w.ls.LocalSelection(&w.sel)
			break
		}
		rows := w.ls.Rows()
		w.local, w.k = w.local[:0], w.k[:0]
		for si, pl := range st.plans {
			for r := range rows {
				w.local = append(w.local, w.ls.RowCandidates(si, r))
				k := 0
				if !pl.Dense {
					k = pl.Rank
				}
				w.k = append(w.k, k)
			}
		}
		t0 := time.Now()
		lists, err := g.SelectExact(ctx, selTag, w.local, w.k, w.lists)
		w.t.Select = time.Since(t0)
		selSent = true // the group aborted its own peers if it failed
		if err != nil {
			return fail(err)
		}
		w.lists = lists
		w.sel.Reset()
		for _, row := range lists {
			w.sel.Pages = append(w.sel.Pages, row...)
			w.sel.Indptr = append(w.sel.Indptr, int32(len(w.sel.Pages)))
		}
	case Replicated:
		t0 := time.Now()
		if err := sh.ReplicatedSelect(ctx, rk.mirror, layer, st.ids, st.plans, q, &w.sel); err != nil {
			return fail(err)
		}
		w.t.Score = time.Since(t0)
	}
	return l.finishRank(ctx, st, i, layer, anyReuse, noRank, scoreLocal, fail, &toppSent)
}

// finishRank is the end of rankStep once the step's selection is in
// w.sel: the reused rows rewritten and the kept selections updated
// (reuse.go), top-p pruning, attention and the merge at the root.
func (l *Local) finishRank(ctx context.Context, st *stepState, i, layer int, anyReuse, noRank, scoreLocal bool, fail func(error) error, toppSent *bool) error {
	c := l.cfg
	rk := l.ranks[i]
	w := &rk.w
	sh, g := rk.sh, rk.g
	redTag := collective.MakeTag(st.id, layer, collective.OpReduce)
	if anyReuse {
		l.applyReuse(st, i, layer, w.ls.Rows(), &w.sel, &w.tmp)
	}
	l.keepReuse(st, i, layer, w.ls.Rows(), &w.sel)
	w.t.RankSkipped = noRank
	w.t.Reused = 0
	for _, r := range w.reuse {
		if r {
			w.t.Reused++
		}
	}
	if l.toppOn(st) {
		msg, err := sh.TopPLocal(ctx, &w.ls, &w.sel)
		if err != nil {
			return fail(err)
		}
		msgs := [][]byte{msg}
		if l.toppExchange(st) {
			t0 := time.Now()
			msgs, err = g.AllGather(ctx, collective.MakeTag(st.id, layer, collective.OpTopP), msg)
			w.t.Select += time.Since(t0)
			*toppSent = true // the group aborted its own peers if it failed
			if err != nil {
				return fail(err)
			}
		}
		if err := sh.TopPCut(&w.ls, msgs, c.Policy.TopP, rk.id.CP == 0); err != nil {
			return fail(err)
		}
	}
	return l.attendReduce(ctx, rk, redTag, scoreLocal, fail)
}

// attendReduce attends rank rk's pages of its selection (rk.w.sel) and
// merges the partial states at CP rank 0 of the TP group; scored says
// the rank scored its pages in this layer (their time is reported).
func (l *Local) attendReduce(ctx context.Context, rk *rank, redTag uint64, scored bool, fail func(error) error) error {
	w := &rk.w
	if err := rk.sh.Attend(ctx, &w.ls, &w.sel); err != nil {
		return fail(err)
	}
	lt := w.ls.Time
	if scored {
		w.t.Score = lt.Score
	}
	w.t.TopK, w.t.Attend = lt.TopK, lt.Attend
	t0 := time.Now()
	err := rk.g.Reduce(ctx, redTag, 0, l.cfg.HeadDim, w.ls.O, w.ls.LSE)
	w.t.Merge = time.Since(t0)
	return err
}

// allDense reports whether every plan reads all its pages.
func allDense(plans []plan.Plan) bool {
	for _, pl := range plans {
		if !pl.Dense {
			return false
		}
	}
	return true
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
