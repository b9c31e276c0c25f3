package shard

import (
	"context"
	"fmt"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Group is a step program's link to the other CP ranks of the shard's TP
// group (the worker's is a collective.Group with the step's tags). The
// shard calls it from the goroutine that runs the program, without its
// own lock held; each method blocks until the group answers or ctx is
// done, and a failing method has told the other members itself.
type Group interface {
	// Rank is this shard's CP rank in the group, Size the group's.
	Rank() int
	Size() int
	// SelectExact derives each row's global top-K (k[row] pages) from
	// every member's candidates (local: this member's, per row best
	// first, plan.Compare's order, where the backend writes them so,
	// else in ascending page order), as collective.Group.SelectExact
	// or SelectExactUnordered: a row's pages may come in any order (the
	// shard takes a row as a set), the same on every member.
	SelectExact(ctx context.Context, local [][]Candidate, k []int, dst [][]int32) ([][]int32, error)
	// AllGather returns every member's message in rank order.
	AllGather(ctx context.Context, msg []byte) ([][]byte, error)
	// Reduce merges the members' partial states (o [heads][D], lse
	// [heads]) into rank 0's o and lse.
	Reduce(ctx context.Context, o, lse []float32) error
}

// Selection is how a step program turns pages into the step's selection.
type Selection int

const (
	// SelectLocal takes the shard's own candidates: the global top-K on
	// a shard that holds every page, a rank's union picks otherwise.
	SelectLocal Selection = iota
	// SelectExact exchanges every rank's candidates (Group.SelectExact):
	// each rank derives the same global top-K.
	SelectExact
	// SelectReplicated computes the global top-K from the Program's
	// Mirror alone (replicatedSelect); the shard scores nothing but for
	// diagnostics.
	SelectReplicated
)

// Program is the one step program of one layer on one shard, after
// Begin: the single shard's Step and each rank of a CP x TP grid (the
// worker) run it. Its phases, each skipped where it has nothing to do:
//
//  1. fused: the whole local step in one backend call (fused) when
//     Fuse allows it and the step is neither phased nor pruned by top-p;
//     then only the merge (Group.Reduce) is left;
//  2. ranking: no sequence ranks (NoRank, or every plan dense and the
//     selection not replicated): empty selection rows; otherwise, unless
//     phased, the hierarchical search or one Ranker call for the local
//     candidates, else score and candidates;
//  3. selection: the local candidates, the exact exchange or the mirror
//     (Selection), then the caller's Selected hook;
//  4. top-p (Policy.TopP, a sparse plan): local logits, their exchange
//     among the group's ranks, the cut;
//  5. attention over the selected and forced pages the shard holds (an
//     offloading shard recalls them first), and the merge of the partial
//     states at CP rank 0.
type Program struct {
	// Group links the shard to the other CP ranks; nil: the shard holds
	// every page of the step alone (no exchange, no merge).
	Group Group
	// Selection is how the step selects (SelectExact needs a Group,
	// SelectReplicated a Mirror).
	Selection Selection
	// Quota is the number of candidates a ranked row proposes; nil: the
	// plan's whole ranked budget (plan.Plan.Rank).
	Quota func(plan.Plan) int
	// Mirror and IDs (the mirror's key per part) serve SelectReplicated.
	Mirror *Mirror
	IDs    []uint64
	// Phased runs score, top-K and attention as separate backend calls
	// (no fused step, no ranking call); Diagnostics implies it and scores
	// every page (Scored, PageScore).
	Phased, Diagnostics bool
	// Fuse allows the fused step: the shard holds every page and the
	// caller needs no selection back.
	Fuse bool
	// Queue lets the fused step of a kernels.QueuedStepper return before
	// the device finishes (see StepOptions.Queue), writing QueueO and
	// QueueLSE at the next Sync.
	Queue            bool
	QueueO, QueueLSE []float32
	// NoRank says that no sequence ranks in this step (each reuses a
	// selection the caller keeps): the selection rows stay empty for
	// Selected to fill, and no rank exchanges candidates.
	NoRank bool
	// Selected, if set, sees the step's selection before top-p and
	// attention, and may rewrite it.
	Selected func(sel *Chosen)
}

// Progress reports how far a step program got, for a caller that must
// tell the group's other members of its failure: the exchanges it has
// settled and whether it reached the merge.
type Progress struct {
	// Fused: the step ran fused; Queued: and its outputs come at Sync.
	Fused, Queued bool
	// Selected: the selection needs no exchange from this rank any more
	// (it took part in it, or every rank skips it alike).
	Selected bool
	// TopPSent: the top-p messages need no exchange from this rank.
	TopPSent bool
	// Reduced: the program called Group.Reduce (which tells the group of
	// its own failure).
	Reduced bool
}

// Run runs program p over ls (after Begin) and leaves the step's
// selection in sel and the partial states in ls.O and ls.LSE (merged at
// CP rank 0 with a Group). Run holds the shard's lock throughout but
// for the Group's exchanges.
func (s *Shard) Run(ctx context.Context, ls *LocalStep, sel *Chosen, p *Program) (Progress, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.run(ctx, ls, sel, p)
}

// unlocked runs f without the shard's lock (held by the caller).
func (s *Shard) unlocked(f func() error) error {
	s.mu.Unlock()
	defer s.mu.Lock()
	return f()
}

func (s *Shard) run(ctx context.Context, ls *LocalStep, sel *Chosen, p *Program) (Progress, error) {
	var pr Progress
	phased := p.Phased || p.Diagnostics
	topp := s.cfg.Policy.TopPOn() && ls.anySparse()
	toppGather := topp && p.Group != nil && p.Group.Size() > 1
	pr.Selected = p.Selection != SelectExact
	pr.TopPSent = !toppGather
	quota := p.Quota
	if quota == nil {
		quota = rankQuota
	}
	if p.Fuse && !phased && !topp && !p.NoRank {
		done, err := s.runFused(ctx, ls, p, &pr)
		if done || err != nil {
			return pr, err
		}
	}
	ls.pfRanked = false
	skip := p.NoRank || (p.Selection != SelectReplicated && !p.Diagnostics && ls.allDense())
	if p.Diagnostics && (skip || p.Selection == SelectReplicated) {
		// Diagnostics read every page's score, which the selection below
		// does not compute.
		if err := s.score(ctx, ls, true); err != nil {
			return pr, err
		}
	}
	switch {
	case skip:
		// No sequence ranks: nothing to score, rank or exchange (DESIGN:
		// dense layers skip steps 1-3). Every rank of a group decides
		// alike from the same plans.
		pr.Selected = true
		sel.Reset()
		ls.cands = ls.cands[:0]
		ls.cPtr = append(ls.cPtr[:0], 0)
		for range len(ls.parts) * ls.rows {
			sel.Indptr = append(sel.Indptr, 0)
			ls.cPtr = append(ls.cPtr, 0)
		}
	case p.Selection == SelectReplicated:
		t0 := time.Now()
		ls.plans = ls.plans[:0]
		for _, pt := range ls.parts {
			ls.plans = append(ls.plans, pt.Plan)
		}
		if err := s.replicatedSelect(ctx, p.Mirror, ls.layer, p.IDs, ls.plans, ls.q, sel); err != nil {
			return pr, err
		}
		if !p.Diagnostics {
			ls.Time.Score = time.Since(t0)
		}
	default:
		// The exact exchange takes candidates in any order and skips its
		// sort for rows that come best first.
		ls.bestFirst = p.Selection == SelectExact
		if err := s.rankLocal(ctx, ls, quota, phased, p.Diagnostics, p.Group == nil); err != nil {
			return pr, err
		}
		if p.Selection == SelectLocal {
			ls.localSelection(sel)
			break
		}
		if err := s.selectExact(ctx, ls, p.Group, sel, &pr); err != nil {
			return pr, err
		}
	}
	if p.Selected != nil {
		p.Selected(sel)
	}
	if topp {
		msg, err := s.toppLocal(ctx, ls, sel)
		if err != nil {
			return pr, err
		}
		ls.toppMsgs = append(ls.toppMsgs[:0], msg)
		msgs := ls.toppMsgs
		if toppGather {
			t0 := time.Now()
			err = s.unlocked(func() (err error) {
				msgs, err = p.Group.AllGather(ctx, msg)
				return err
			})
			ls.Time.Select += time.Since(t0)
			pr.TopPSent = true // the group aborted its own peers if it failed
			if err != nil {
				return pr, err
			}
		}
		if err := s.toppCut(ls, msgs, s.cfg.Policy.TopP, p.Group == nil || p.Group.Rank() == 0); err != nil {
			return pr, err
		}
	}
	if err := s.attend(ctx, ls, sel); err != nil {
		return pr, err
	}
	return pr, s.reduce(ctx, ls, p, &pr)
}

// runFused runs the fused step (queued when p.Queue and the backend
// queues) and its merge; it reports whether the step ran fused.
func (s *Shard) runFused(ctx context.Context, ls *LocalStep, p *Program, pr *Progress) (bool, error) {
	if qs, ok := s.be.(kernels.QueuedStepper); ok && p.Queue {
		done, err := s.fusedInto(ctx, ls, qs.StepQueued, p.QueueO, p.QueueLSE)
		if done {
			pr.Fused, pr.Queued = err == nil, err == nil
			return true, err
		}
	}
	done, err := s.fused(ctx, ls)
	if !done || err != nil {
		return done, err
	}
	pr.Fused = true
	return true, s.reduce(ctx, ls, p, pr)
}

// rankLocal computes the shard's candidates: unless phased, by the
// hierarchical search or one ranking backend call (rankDevice), else by
// score (of every page with force) and candidates.
func (s *Shard) rankLocal(ctx context.Context, ls *LocalStep, quota func(plan.Plan) int, phased, force, alone bool) error {
	if !phased {
		ranked, err := s.rankOne(ctx, ls, quota, alone)
		if ranked || err != nil {
			return err
		}
	}
	if err := s.score(ctx, ls, force); err != nil {
		return err
	}
	return s.candidates(ctx, ls, quota)
}

// rankOne is the ranking in one call, when the shard can: the
// hierarchical search (canHier) or one ranking backend call
// (rankDevice; alone: the shard holds every page). It reports whether
// it ran; when it did not, nothing changed.
func (s *Shard) rankOne(ctx context.Context, ls *LocalStep, quota func(plan.Plan) int, alone bool) (bool, error) {
	if c, ok := s.canHier(); ok {
		return true, s.rankHier(ctx, c, ls, quota)
	}
	return s.rankDevice(ctx, ls, quota, alone)
}

// selectExact exchanges the shard's candidates with the group's other
// ranks and sets sel to the global top-K they agree on.
func (s *Shard) selectExact(ctx context.Context, ls *LocalStep, g Group, sel *Chosen, pr *Progress) error {
	ls.xLocal, ls.xK = ls.xLocal[:0], ls.xK[:0]
	for i, pt := range ls.parts {
		for r := range ls.rows {
			ls.xLocal = append(ls.xLocal, ls.rowCandidates(i, r))
			k := 0
			if !pt.Plan.Dense {
				k = pt.Plan.Rank
			}
			ls.xK = append(ls.xK, k)
		}
	}
	t0 := time.Now()
	var rows [][]int32
	err := s.unlocked(func() (err error) {
		rows, err = g.SelectExact(ctx, ls.xLocal, ls.xK, ls.xRows)
		return err
	})
	ls.Time.Select = time.Since(t0)
	pr.Selected = true // the group aborted its own peers if it failed
	if err != nil {
		return err
	}
	ls.xRows = rows
	sel.Reset()
	for _, row := range ls.xRows {
		sel.Pages = append(sel.Pages, row...)
		sel.Indptr = append(sel.Indptr, int32(len(sel.Pages)))
	}
	return nil
}

// reduce merges the partial states at the group's rank 0 (nothing for
// a shard alone).
func (s *Shard) reduce(ctx context.Context, ls *LocalStep, p *Program, pr *Progress) error {
	if p.Group == nil {
		return nil
	}
	pr.Reduced = true
	t0 := time.Now()
	err := s.unlocked(func() error { return p.Group.Reduce(ctx, ls.O, ls.LSE) })
	ls.Time.Merge = time.Since(t0)
	return err
}

// rankDevice ranks the candidates in one backend call when the backend is
// a kernels.Ranker and the selector is quest: the scores stay where they
// are computed (on the device for the CUDA backend) and only the
// candidates come back. A prefetching shard ranks so only alone (it
// holds every page, so its top-K is the global one) and without
// cross-layer prefetch: it then asks for the best K + PrefetchPages
// pages of each row and splits them (splitPrefetch): the best K are the
// candidates, the others the row's prefetch candidates (ls.pfCand). It
// reports whether it ran; when it did not, nothing changed.
func (s *Shard) rankDevice(ctx context.Context, ls *LocalStep, quota func(plan.Plan) int, alone bool) (bool, error) {
	rk, ok := s.be.(kernels.Ranker)
	if !ok || s.cfg.Policy.Selector != plan.Quest {
		return false, nil
	}
	extra := 0
	if s.pf != nil {
		if !alone || s.pfPlan.cross {
			// Prefetch ranks the pages below the global selection from
			// the scores; cross-layer prefetch scores layer l+1 from the
			// host's copy of the batch.
			return false, nil
		}
		extra = s.pfPlan.pages
	}
	ls.pfCand = ls.pfCand[:0]
	ls.pfRanked = extra > 0
	var split func()
	if extra > 0 {
		split = ls.splitPrefetch
	}
	q := quota
	if extra > 0 {
		q = func(pl plan.Plan) int { return quota(pl) + extra }
	}
	if err := s.rank(ctx, ls, rk, q, split); err != nil {
		return true, fmt.Errorf("rank layer %d: %w", ls.layer, err)
	}
	return true, nil
}
