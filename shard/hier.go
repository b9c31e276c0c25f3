package shard

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// hierState is the shard's hierarchical selection (Policy.HierGroup): a
// box tree per (sequence, layer), kept in step with the page summaries,
// and the search's counters.
type hierState struct {
	trees map[hierKey]*hierTree
	batch []*kernels.BoxTree // one step's trees, in batch order
	rows  []kernels.HierStats
	stats HierStats
}

type hierKey struct {
	seq   pagestore.SeqID
	layer int
}

type hierTree struct {
	tree *kernels.BoxTree
	cuts uint64 // the sequence's Store.Cuts when last synced
}

// hierBuckets is the resolution of HierStats.Hist: records read per row
// and step in percent of the row's candidates, 0..hierBuckets-1 (the last
// bucket holds everything above).
const hierBuckets = 201

// HierStats counts the hierarchical search's work on a shard since it was
// made (Policy.HierGroup > 0).
type HierStats struct {
	// Totals sums the rows of every ranked step.
	Totals kernels.HierStats
	// Hist[p] counts (row, step) pairs whose search scored p percent of
	// the row's candidates in records (boxes plus pages), rounded up; the
	// last bucket holds 200% and above.
	Hist [hierBuckets]int64
	// Sync is the time spent keeping the trees in step with the
	// summaries.
	Sync time.Duration
}

// Quantile returns the q-quantile (0..1) of the records read per row and
// step, in percent of the candidates (a bucket's upper edge).
func (h HierStats) Quantile(q float64) int {
	var n int64
	for _, c := range h.Hist {
		n += c
	}
	if n == 0 {
		return 0
	}
	want := int64(q*float64(n) + 0.5)
	var acc int64
	for p, c := range h.Hist {
		acc += c
		if acc >= max(want, 1) {
			return p
		}
	}
	return hierBuckets - 1
}

// HierStats returns a snapshot of the hierarchical search's counters
// (zero when Policy.HierGroup is 0 or the shard never searched).
func (s *Shard) HierStats() HierStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hier == nil {
		return HierStats{}
	}
	return s.hier.stats
}

// canHier reports whether the shard ranks by the hierarchical search: the
// quest selector with Policy.HierGroup set, on the CPU backend with host
// pools, no offload and no prefetch.
func (s *Shard) canHier() (*kernels.CPU, bool) {
	c, ok := s.be.(*kernels.CPU)
	return c, ok && s.cfg.Policy.HierGroup > 0 && s.cfg.Policy.Selector == plan.Quest &&
		s.dev == nil && s.off == nil && s.pf == nil
}

// rankHier is rankOne by the hierarchical search (s.mu held).
func (s *Shard) rankHier(ctx context.Context, c *kernels.CPU, ls *LocalStep, quota func(plan.Plan) int) error {
	if s.hier == nil {
		s.hier = &hierState{trees: map[hierKey]*hierTree{}}
	}
	h := s.hier
	t0 := time.Now()
	h.batch = h.batch[:0]
	for i, p := range ls.parts {
		cuts, err := s.store.Cuts(p.Seq)
		if err != nil {
			return fmt.Errorf("hier rank layer %d: %w", ls.layer, err)
		}
		k := hierKey{p.Seq, ls.layer}
		ht := h.trees[k]
		from := 0
		if ht == nil {
			tree, err := kernels.NewBoxTree(s.cfg.Policy.HierGroup)
			if err != nil {
				return fmt.Errorf("hier rank: %w", err)
			}
			ht = &hierTree{tree: tree, cuts: cuts}
			h.trees[k] = ht
		} else if ht.cuts == cuts {
			// Only the old tail page and pages after it changed.
			from = max(ht.tree.Pages()-1, 0)
		}
		ht.cuts = cuts
		pages := ls.batch.Pages[ls.batch.Indptr[i]:ls.batch.Indptr[i+1]]
		if err := ht.tree.Sync(s.shape, ls.kl.Summary, pages, from); err != nil {
			return fmt.Errorf("hier rank layer %d: %w", ls.layer, err)
		}
		h.batch = append(h.batch, ht.tree)
	}
	h.stats.Sync += time.Since(t0)
	ls.scored = false
	ls.cands = ls.cands[:0]
	ls.cPtr = append(ls.cPtr[:0], 0)
	total := ls.planTopK(quota)
	ls.sel = slices.Grow(ls.sel[:0], total)[:total]
	ls.selScores = slices.Grow(ls.selScores[:0], total)[:total]
	t1 := time.Now()
	if total > 0 {
		n := ls.topk.Rows()
		h.rows = slices.Grow(h.rows[:0], n)[:n]
		if err := c.HierRank(ctx, kernels.HierConfig{}, s.shape, ls.kl, &ls.batch, h.batch, ls.q, ls.mode, &ls.topk, ls.sel, ls.selScores, h.rows); err != nil {
			return fmt.Errorf("hier rank layer %d: %w", ls.layer, err)
		}
		for _, st := range h.rows {
			if st.Rows == 0 {
				continue
			}
			h.stats.Totals.Add(st)
			pct := (100*st.Records() + st.Candidates - 1) / max(st.Candidates, 1)
			h.stats.Hist[min(pct, hierBuckets-1)]++
		}
	}
	ls.Time.Score = time.Since(t1)
	ls.fillCandidates(func(_, j int, _ int32) float32 { return ls.selScores[j] })
	return nil
}

// dropHier forgets the trees of sequence id (s.mu held).
func (s *Shard) dropHier(id pagestore.SeqID) {
	if s.hier == nil {
		return
	}
	for k := range s.hier.trees {
		if k.seq == id {
			delete(s.hier.trees, k)
		}
	}
}

// Add adds o's counts to h.
func (h *HierStats) Add(o HierStats) {
	h.Totals.Add(o.Totals)
	for i, c := range o.Hist {
		h.Hist[i] += c
	}
	h.Sync += o.Sync
}

// Since returns the counts of h accumulated after the snapshot old of
// the same counters (h minus old).
func (h HierStats) Since(old HierStats) HierStats {
	d := h
	t, o := &d.Totals, old.Totals
	t.Rows, t.Candidates, t.Boxes, t.Pages = t.Rows-o.Rows, t.Candidates-o.Candidates, t.Boxes-o.Boxes, t.Pages-o.Pages
	t.Flat, t.Fallbacks, t.Skipped = t.Flat-o.Flat, t.Fallbacks-o.Fallbacks, t.Skipped-o.Skipped
	for i, c := range old.Hist {
		d.Hist[i] -= c
	}
	d.Sync -= old.Sync
	return d
}
