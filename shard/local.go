package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// SeqPart is one sequence's part of a step on this shard: the pages this
// shard holds (a CP rank's subset) and the sequence's global page plan.
type SeqPart struct {
	// Seq is the shard-local sequence.
	Seq pagestore.SeqID
	// Place maps this shard's local pages to the sequence's global pages
	// (an O(1) function of the layout: no page map). The zero Place is
	// the identity: the shard holds every page of the sequence.
	Place plan.Place
	// Plan is the sequence's page plan over all its pages (every CP rank
	// gets the same plan).
	Plan plan.Plan
	// Q is [QHeads][HeadDim] for this shard's query heads.
	Q []float32
}

// Candidate is a page proposed for the global top-K: its score and its
// global logical page index (the collective's wire type).
type Candidate = plan.Candidate

// LocalStep is the state of one step of one layer on one shard: Begin
// loads it, then the one step program (Run, see Program) drives its
// phases, for a single-shard Step and for each rank of a sharded grid
// alike. The caller owns it and reuses it across steps; its buffers are
// kept. The kernels read the pages (and, on a DeviceResident shard, the
// page tables) when they run, so the step's sequences must not change
// (Append, Rollback, Release) between Begin and the end of Run; the
// worker holds its lock across.
type LocalStep struct {
	layer int
	mode  kernels.GQAMode
	rows  int
	parts []SeqPart
	kl    kernels.Layer

	batch  kernels.Batch
	tables kernels.DeviceTables // batch.Tables of a DeviceResident shard
	table  []int32
	q      []float32
	qDev   bool    // BeginTensor: the queries are a device tensor, q is empty
	lastG  []int32 // per sequence: the global index of the last local page
	scored bool
	scores []float32

	topk      kernels.TopKPlan
	bestFirst bool // planTopK asks for rows best first (TopKPlan.BestFirst)
	sel       []int32
	selScores []float32 // rank, rankHier: the scores of sel

	// A prefetching shard's device ranking (rankDevice): the prefetch
	// candidates ranked below the selection, and scratch.
	pfCand    []cand
	pfRanked  bool // pfCand is this step's (prefetchNext uses it)
	order     []int32
	keepSel   []int32
	keepScore []float32
	cands     []Candidate
	cPtr      []int32 // CSR over (sequence, row) into cands

	// An offloading DeviceResident shard's step ranks through the device
	// page tables (rankBatch) and keeps its host copy of the page tables
	// in batch.Pages from one step to the next while they do not change:
	// hostTab says whose and of which table generation it is, hostSeqs
	// and hostPtr of which sequences and page counts.
	rankBatch kernels.Batch
	slotUse   kernels.SlotUse // an offloading fused step's Layer.Slots
	hostTab   hostTab
	hostPages []int32
	hostSeqs  []uint64
	hostPtr   []int32

	lists kernels.Lists
	topp  toppState // Policy.TopP: see toppLocal

	// A step program's scratch (Run): the plans of SelectReplicated, the
	// top-p messages, and the exact exchange's rows (local candidates,
	// K and the global rows).
	plans    []plan.Plan
	toppMsgs [][]byte
	xLocal   [][]Candidate
	xK       []int
	xRows    [][]int32

	// O and LSE are the partial states after attend: [seqs][QHeads][D]
	// and [seqs][QHeads].
	O, LSE []float32
	// Time holds the phases' wall times.
	Time PhaseTimes
}

// Rows is the number of selection rows per sequence (KV heads for
// group_max, query heads for per_head).
func (ls *LocalStep) Rows() int { return ls.rows }

// rowCandidates returns the candidates of (sequence i, row r) after
// candidates ran: in ascending page order, or best first (plan.Compare's
// order) when ls.bestFirst was set and the backend writes them so (the
// CPU backend does; the recent selector's always are then).
func (ls *LocalStep) rowCandidates(i, r int) []Candidate {
	k := i*ls.rows + r
	return ls.cands[ls.cPtr[k]:ls.cPtr[k+1]]
}

// global returns the global page of local page p of sequence i.
func (ls *LocalStep) global(i, p int) int32 {
	return int32(ls.parts[i].Place.Global(p))
}

// local returns the local page of global page g in sequence i, or -1.
func (ls *LocalStep) local(i int, g int32) int32 {
	if lp := ls.parts[i].Place.Local(int(g)); lp >= 0 && lp < ls.batch.NumPages(i) {
		return int32(lp)
	}
	return -1
}

// localRange returns the local pages whose global index lies in [lo, hi).
func (ls *LocalStep) localRange(i, lo, hi int) (int, int) {
	n := ls.batch.NumPages(i)
	a, b := ls.parts[i].Place.LocalRange(lo, hi)
	return min(a, n), min(b, n)
}

// Begin loads a step's parts: the local page tables of layer as one CSR
// batch. It validates the parts and changes nothing.
func (s *Shard) Begin(ls *LocalStep, layer int, parts []SeqPart) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.begin(ls, layer, parts, false)
}

// BeginTensor is Begin for a step whose queries are a device tensor
// (FusedStepTensor): the parts' Q are not read, and only FusedStepTensor
// may run the step.
func (s *Shard) BeginTensor(ls *LocalStep, layer int, parts []SeqPart) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.begin(ls, layer, parts, true)
}

// begin loads the parts; tensorQ leaves the queries to a device tensor.
func (s *Shard) begin(ls *LocalStep, layer int, parts []SeqPart, tensorQ bool) error {
	sh := s.shape
	if s.ds != nil && s.dev == nil {
		return errors.New("step: the shard is closed (its device pools are freed)")
	}
	if layer < 0 || layer >= s.cfg.Store.Layers {
		return fmt.Errorf("step: %w: layer %d outside 0..%d", ErrBadInput, layer, s.cfg.Store.Layers-1)
	}
	ls.layer, ls.parts = layer, parts
	ls.mode = s.cfg.Policy.GQA
	ls.rows = sh.Rows(ls.mode)
	// An offloading DeviceResident shard may keep last step's host page
	// tables (see hostTab): the generation is read before they are.
	cached := s.slots != nil
	var gen uint64
	if cached {
		gen = s.slots.gen.Load()
		ls.batch.Pages = nil // the cached copy, set by hostTables
	} else if ls.hostTab.s != nil {
		// batch.Pages may be the cached copy of another shard's step:
		// filled below, it is no longer one.
		ls.hostTab, ls.batch.Pages = hostTab{}, nil
	}
	ls.batch.Indptr = append(ls.batch.Indptr[:0], 0)
	ls.batch.Pages = ls.batch.Pages[:0]
	ls.batch.LastLen = ls.batch.LastLen[:0]
	ls.batch.Tables = nil
	ls.tables.Seqs = ls.tables.Seqs[:0]
	total := int32(0)
	ls.q, ls.qDev = ls.q[:0], tensorQ
	ls.Time = PhaseTimes{}
	ls.scored = false
	ls.topp.ready = false
	for i, p := range parts {
		if !tensorQ && len(p.Q) != sh.QHeads*sh.HeadDim {
			return fmt.Errorf("step: %w: part %d: query has %d floats, want %d", ErrBadInput, i, len(p.Q), sh.QHeads*sh.HeadDim)
		}
		v, err := s.store.View(p.Seq, layer)
		if err != nil {
			return fmt.Errorf("step layer %d: %w", layer, err)
		}
		if pl := p.Place; pl.Ranks > 1 && (pl.Rank < 0 || pl.Rank >= pl.Ranks) {
			return fmt.Errorf("step: %w: part %d: rank %d of %d", ErrBadInput, i, pl.Rank, pl.Ranks)
		}
		if s.dev != nil {
			// The device follows the page tables: the kernels read them
			// there, nothing is built or uploaded per step.
			ls.tables.Seqs = append(ls.tables.Seqs, uint64(p.Seq))
		}
		if (s.dev == nil || s.off != nil) && !cached {
			ls.table, err = s.store.AppendPageTable(ls.table[:0], p.Seq)
			if err != nil {
				return fmt.Errorf("step layer %d: %w", layer, err)
			}
			ls.batch.Pages = append(ls.batch.Pages, ls.table[:v.Pages]...)
		}
		total += int32(v.Pages)
		ls.batch.Indptr = append(ls.batch.Indptr, total)
		ls.batch.LastLen = append(ls.batch.LastLen, int32(v.LastPageLen))
		ls.q = append(ls.q, p.Q...)
	}
	if s.dev != nil {
		ls.tables.Set = s.tables
	}
	if s.dev != nil && s.off == nil {
		ls.batch.Pages = nil
		ls.batch.Tables = &ls.tables
	}
	if cached {
		if err := ls.hostTables(s, gen); err != nil {
			return fmt.Errorf("step layer %d: %w", layer, err)
		}
		ls.rankBatch = kernels.Batch{Indptr: ls.batch.Indptr, LastLen: ls.batch.LastLen, Tables: &ls.tables}
	}
	ls.kl = s.layer(layer)
	return nil
}

// hostTab names the host page tables held in a LocalStep's batch.Pages:
// the shard's whose slot data's table generation was gen when they were
// copied.
type hostTab struct {
	s   *Shard
	gen uint64
}

// hostTables fills ls.batch.Pages with the host page tables of the
// step's sequences (their first NumPages entries) on an offloading
// DeviceResident shard, whose store reports every change of a page table
// to the shard's slot data (a generation): when none happened since
// ls.batch.Pages was filled for the same sequences and page counts, it is
// kept as it is. gen is the generation read before the page counts.
func (ls *LocalStep) hostTables(s *Shard, gen uint64) error {
	b := &ls.batch
	if ls.hostTab == (hostTab{s, gen}) && slices.Equal(ls.hostSeqs, ls.tables.Seqs) && slices.Equal(ls.hostPtr, b.Indptr) &&
		len(ls.hostPages) == b.Total() {
		b.Pages = ls.hostPages
		return nil
	}
	ls.hostTab = hostTab{}
	ls.hostPages = ls.hostPages[:0]
	for i, p := range ls.parts {
		at := len(ls.hostPages)
		var err error
		if ls.hostPages, err = s.store.AppendPageTable(ls.hostPages, p.Seq); err != nil {
			return err
		}
		if n := b.NumPages(i); len(ls.hostPages)-at >= n {
			ls.hostPages = ls.hostPages[:at+n]
		} else {
			return fmt.Errorf("sequence %d: page table of %d entries, %d pages", p.Seq, len(ls.hostPages)-at, n)
		}
	}
	b.Pages = ls.hostPages
	ls.hostTab = hostTab{s, gen}
	ls.hostSeqs = append(ls.hostSeqs[:0], ls.tables.Seqs...)
	ls.hostPtr = append(ls.hostPtr[:0], b.Indptr...)
	return nil
}

// score computes the selector's score of every local page for every row,
// if any plan ranks pages or force is set (diagnostics). Recent and dense
// selectors score nothing.
func (s *Shard) score(ctx context.Context, ls *LocalStep, force bool) error {
	ranked := force
	for _, p := range ls.parts {
		ranked = ranked || (!p.Plan.Dense && p.Plan.Rank > 0)
	}
	sel := s.cfg.Policy.Selector
	ls.scored = ranked && (sel == plan.Quest || sel == plan.Oracle) && ls.batch.Total() > 0
	if !ls.scored {
		return nil
	}
	ls.scores = resize(ls.scores, ls.batch.Total()*ls.rows)
	t0 := time.Now()
	var err error
	if sel == plan.Quest {
		err = s.be.Score(ctx, s.shape, ls.kl, &ls.batch, ls.q, ls.mode, ls.scores)
	} else {
		var kl kernels.Layer
		var b *kernels.Batch
		if kl, b, err = s.hostView(ctx, ls.kl, ls.layer, &ls.batch); err == nil {
			err = kernels.PageMax(s.shape, kl, b, ls.q, ls.mode, ls.scores)
		}
	}
	ls.Time.Score = time.Since(t0)
	return err
}

// candidates proposes, per (sequence, row), this shard's best quota(plan)
// candidate pages among its pages inside the plan's candidate range
// (scores descending, ties to the lower page). For the recent selector the
// candidates are the most recent pages (score = page index).
func (s *Shard) candidates(ctx context.Context, ls *LocalStep, quota func(plan.Plan) int) error {
	ls.cands = ls.cands[:0]
	ls.cPtr = append(ls.cPtr[:0], 0)
	sel := s.cfg.Policy.Selector
	if sel == plan.Recent || !ls.scored {
		for i, p := range ls.parts {
			pl := p.Plan
			for range ls.rows {
				if !pl.Dense && pl.Rank > 0 && sel == plan.Recent {
					lo, hi := ls.localRange(i, pl.Lo(), pl.Hi())
					from := max(lo, hi-quota(pl))
					for j := range hi - from {
						lp := from + j
						if ls.bestFirst {
							lp = hi - 1 - j // the highest score first
						}
						g := ls.global(i, lp)
						ls.cands = append(ls.cands, Candidate{Score: float32(g), Page: g})
					}
				}
				ls.cPtr = append(ls.cPtr, int32(len(ls.cands)))
			}
		}
		return nil
	}
	total := ls.planTopK(quota)
	ls.sel = slices.Grow(ls.sel[:0], total)[:total]
	t0 := time.Now()
	if err := s.be.TopK(ctx, ls.scores, &ls.topk, ls.sel); err != nil {
		return err
	}
	ls.Time.TopK = time.Since(t0)
	ls.fillCandidates(func(base, _ int, lp int32) float32 { return ls.scores[base+int(lp)] })
	return nil
}

// planTopK lays out the top-K rows of the candidates in ls.topk: per
// ranked (sequence, row), the best quota(plan) of the local pages inside
// the plan's candidate range, best first if ls.bestFirst. It returns the
// output length.
func (ls *LocalStep) planTopK(quota func(plan.Plan) int) int {
	ls.topk.Reset()
	ls.topk.BestFirst = ls.bestFirst
	total := 0
	for i, p := range ls.parts {
		pl := p.Plan
		if pl.Dense || pl.Rank == 0 {
			continue
		}
		lo, hi := ls.localRange(i, pl.Lo(), pl.Hi())
		k := min(quota(pl), hi-lo)
		for r := range ls.rows {
			ls.topk.Add(ls.batch.ScoreOffset(i, ls.rows)+r*ls.batch.NumPages(i)+lo, hi-lo, lo, k, total)
			total += k
		}
	}
	return total
}

// fillCandidates turns the top-K output in ls.sel into the candidates;
// score(base, j, lp) is the score of local page lp, output entry j, of the
// score row starting at base.
func (ls *LocalStep) fillCandidates(score func(base, j int, lp int32) float32) {
	row := 0
	for i, p := range ls.parts {
		pl := p.Plan
		np := ls.batch.NumPages(i)
		for r := range ls.rows {
			if !pl.Dense && pl.Rank > 0 {
				off, k := int(ls.topk.OutOff[row]), int(ls.topk.K[row])
				base := ls.batch.ScoreOffset(i, ls.rows) + r*np
				for j, lp := range ls.sel[off : off+k] {
					ls.cands = append(ls.cands, Candidate{Score: score(base, off+j, lp), Page: ls.global(i, int(lp))})
				}
				row++
			}
			ls.cPtr = append(ls.cPtr, int32(len(ls.cands)))
		}
	}
}

// rank is rankDevice's work:
// one Rank call for the best quota(plan) pages of every ranked row, their
// scores kept; split, when set, rewrites the rows' outputs before they
// become the candidates.
func (s *Shard) rank(ctx context.Context, ls *LocalStep, rk kernels.Ranker, quota func(plan.Plan) int, split func()) error {
	ls.scored = false
	ls.cands = ls.cands[:0]
	ls.cPtr = append(ls.cPtr[:0], 0)
	total := ls.planTopK(quota)
	ls.sel = slices.Grow(ls.sel[:0], total)[:total]
	ls.selScores = slices.Grow(ls.selScores[:0], total)[:total]
	t0 := time.Now()
	if total > 0 {
		b := &ls.batch
		if s.slots != nil {
			b = &ls.rankBatch // the page tables on the device
		}
		if err := rk.Rank(ctx, s.shape, ls.kl, b, ls.q, ls.mode, &ls.topk, ls.sel, ls.selScores); err != nil {
			return err
		}
	}
	ls.Time.Score = time.Since(t0)
	if split != nil {
		split()
	}
	ls.fillCandidates(func(_, j int, _ int32) float32 { return ls.selScores[j] })
	return nil
}

// Chosen lists, per (sequence, row) in CSR form, the global pages chosen
// by ranking (forced pages excluded; they are added by attend). A row is
// a set: its pages come in no particular order (the exact exchange's
// rows are unordered), each once.
type Chosen struct {
	Indptr []int32
	Pages  []int32
}

// Reset empties the selection, keeping its storage.
func (sel *Chosen) Reset() {
	sel.Indptr = append(sel.Indptr[:0], 0)
	sel.Pages = sel.Pages[:0]
}

// localSelection turns this shard's own candidates into the selection: the
// global top-K when the shard holds every page.
func (ls *LocalStep) localSelection(sel *Chosen) {
	sel.Reset()
	for k := range len(ls.cPtr) - 1 {
		for _, c := range ls.cands[ls.cPtr[k]:ls.cPtr[k+1]] {
			sel.Pages = append(sel.Pages, c.Page)
		}
		sel.Indptr = append(sel.Indptr, int32(len(sel.Pages)))
	}
}

// attend attends each (sequence, row) over the forced pages and the
// selected pages that this shard holds (every local page for dense plans)
// and leaves the partial states in ls.O and ls.LSE. Selected pages the
// shard does not hold are skipped: another CP rank attends them. An
// offloading shard first brings the pages to attend into its device pool
// (Time.Recall); a tier failure fails the step with the tier's error, and
// pages that do not fit at once are attended in passes (see
// [OffloadStats]).
func (s *Shard) attend(ctx context.Context, ls *LocalStep, sel *Chosen) error {
	sh := s.shape
	if err := ls.buildLists(sel); err != nil {
		return err
	}
	n := len(ls.parts)
	ls.O = resize(ls.O, n*sh.QHeads*sh.HeadDim)
	ls.LSE = resize(ls.LSE, n*sh.QHeads)
	t0 := time.Now()
	var err error
	switch {
	case ls.topp.ready:
		err = s.attendTopP(ctx, ls)
	case s.off != nil:
		err = s.attendOffload(ctx, ls)
	default:
		err = s.be.Attend(ctx, sh, ls.kl, &ls.batch, ls.q, &ls.lists, ls.O, ls.LSE)
	}
	if err != nil {
		return fmt.Errorf("attend layer %d: %w", ls.layer, err)
	}
	ls.Time.Attend = time.Since(t0)
	return nil
}

// buildLists fills ls.lists with the local pages each (sequence, row)
// attends: the forced pages and the selected pages this shard holds
// (every local page for dense plans).
func (ls *LocalStep) buildLists(sel *Chosen) error {
	if len(sel.Indptr) != len(ls.parts)*ls.rows+1 {
		return fmt.Errorf("attend: selection has %d rows, want %d", len(sel.Indptr)-1, len(ls.parts)*ls.rows)
	}
	ls.lists.Mode = ls.mode
	ls.lists.Indptr = append(ls.lists.Indptr[:0], 0)
	ls.lists.Pages = ls.lists.Pages[:0]
	ls.lists.All = ls.allDense()
	for i, p := range ls.parts {
		if ls.lists.All {
			break // every row reads every page: nothing to list
		}
		pl := p.Plan
		for r := range ls.rows {
			if pl.Dense {
				ls.appendLocal(i, 0, pl.Pages)
			} else {
				ls.appendLocal(i, 0, pl.Sink)
				k := i*ls.rows + r
				for _, g := range sel.Pages[sel.Indptr[k]:sel.Indptr[k+1]] {
					if g < int32(pl.Lo()) || g >= int32(pl.Hi()) {
						return fmt.Errorf("attend: sequence %d row %d: selected page %d outside the candidates [%d,%d)", i, r, g, pl.Lo(), pl.Hi())
					}
					if lp := ls.local(i, g); lp >= 0 {
						ls.lists.Pages = append(ls.lists.Pages, lp)
					}
				}
				ls.appendLocal(i, pl.Hi(), pl.Pages)
			}
			ls.lists.Indptr = append(ls.lists.Indptr, int32(len(ls.lists.Pages)))
		}
	}
	return nil
}

// appendLocal appends to the lists this shard's pages of sequence i whose
// global index lies in [lo, hi) (forced pages, or every page).
func (ls *LocalStep) appendLocal(i, lo, hi int) {
	a, b := ls.localRange(i, lo, hi)
	for lp := a; lp < b; lp++ {
		ls.lists.Pages = append(ls.lists.Pages, int32(lp))
	}
}

// allDense reports whether every part of the step attends every page (a
// dense layer or step): the lists are then Lists.All.
func (ls *LocalStep) allDense() bool {
	for _, p := range ls.parts {
		if !p.Plan.Dense {
			return false
		}
	}
	return true
}

// Scored reports whether the step scored page scores in this step.
func (ls *LocalStep) Scored() bool { return ls.scored }

// LocalPages is the number of this shard's pages of sequence i.
func (ls *LocalStep) LocalPages(i int) int { return ls.batch.NumPages(i) }

// PageScore is the score of local page p of sequence i for row r (valid
// when Scored).
func (ls *LocalStep) PageScore(i, r, p int) float32 {
	return ls.scores[ls.batch.ScoreOffset(i, ls.rows)+r*ls.batch.NumPages(i)+p]
}
