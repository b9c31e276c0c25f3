package kernels

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/questrt/questrt/plan"
)

// HierConfig configures the hierarchical exact top-K ([CPU.HierRank]).
type HierConfig struct {
	// MinRatio: a row searches its tree only when K*Group*MinRatio <= N
	// (N its candidates): with fewer candidates per selected page the
	// best case, opening K groups, reads too large a share of the row for
	// the search to beat flat scoring. Default 4.
	MinRatio int
	// FlatAfter: a search that has scored more than this fraction of its
	// row's candidates (pages plus boxes) gives up and scores the rest
	// flat, so a row costs at most about (1+FlatAfter) flat scores of
	// records. Default 0.5.
	FlatAfter float64
	// MaxSkip bounds the fallback memory: after a row's search falls
	// back, the row's next rankings over the same tree score flat without
	// searching, 16 of them after a first fallback, twice as many after
	// each further fallback in a row, at most MaxSkip; a search that
	// completes forgets it. A call whose every row scores flat runs
	// [CPU.Rank] (scores in parallel over the worker pool). On data the
	// bounds cannot prune, a ranking then costs a flat Rank plus, in the
	// steady state, one fallen-back search (about 6 flat Ranks at
	// FlatAfter 0.5) in MaxSkip+1 calls. Default 256; negative: no
	// memory, every eligible row searches on every call.
	MaxSkip int
}

// firstSkip is the rankings a row scores flat after its first fallback.
const firstSkip = 16

// DefaultHierConfig returns the defaults documented on HierConfig.
func DefaultHierConfig() HierConfig { return HierConfig{MinRatio: 4, FlatAfter: 0.5, MaxSkip: 256} }

func (c HierConfig) withDefaults() HierConfig {
	def := DefaultHierConfig()
	if c.MinRatio <= 0 {
		c.MinRatio = def.MinRatio
	}
	if c.FlatAfter <= 0 {
		c.FlatAfter = def.FlatAfter
	}
	if c.MaxSkip == 0 {
		c.MaxSkip = def.MaxSkip
	}
	return c
}

// HierStats counts the work of HierRank calls (summed over rows).
type HierStats struct {
	// Rows is the number of ranked rows (plan rows with K > 0).
	Rows int64
	// Candidates is the number of candidate pages of those rows: the
	// records a flat score reads.
	Candidates int64
	// Boxes and Pages are the box and page records the rows scored
	// (flat rows and fallbacks included): Boxes+Pages against Candidates
	// is the share of summary records read.
	Boxes, Pages int64
	// Flat counts rows scored flat from the start (shallow tree, too few
	// candidates per selected page, K >= N); Fallbacks rows whose search
	// gave up after FlatAfter of the work; Skipped rows scored flat
	// without searching because their search fell back recently
	// (HierConfig.MaxSkip).
	Flat, Fallbacks, Skipped int64
}

// Add adds o's counts to s.
func (s *HierStats) Add(o HierStats) {
	s.Rows += o.Rows
	s.Candidates += o.Candidates
	s.Boxes += o.Boxes
	s.Pages += o.Pages
	s.Flat += o.Flat
	s.Fallbacks += o.Fallbacks
	s.Skipped += o.Skipped
}

// Records is Boxes + Pages, the summary records scored.
func (s HierStats) Records() int64 { return s.Boxes + s.Pages }

// hierNode is a box in the search's max-heap.
type hierNode struct {
	bound float64
	level int32 // index into BoxTree.levels
	node  int32
}

type hierScratch struct {
	heap  []hierNode
	top   []plan.Candidate // min-heap: the worst kept candidate at 0
	sc    []float32        // row scores by candidate index (fallback)
	stamp []uint32
	gen   uint32
	idx   []int32
	keys  []uint64 // BestFirst's sort keys (flat)
	u     [maxScoreGroup]float32
}

// hierMemo is a row's fallback memory (HierConfig.MaxSkip): left more
// rankings score flat; next is the skip after the next fallback.
type hierMemo struct{ left, next int32 }

// A row's way through HierRank.
const (
	hierNone   uint8 = iota // nothing to rank (K or N 0)
	hierFlat                // scored flat: the search cannot help
	hierSkip                // scored flat: the search fell back recently
	hierSearch              // searched
)

type hierTask struct {
	cfg   HierConfig
	s     Shape
	l     Layer
	b     *Batch
	trees []*BoxTree
	w     []float32 // split queries: [sequences][QHeads][2D]
	mode  GQAMode
	plan  *TopKPlan
	out   []int32
	outSc []float32
	stats []HierStats // per plan row
	way   []uint8     // per plan row: hierNone..hierSearch
	scr   []hierScratch
}

// HierRank is [CPU.Rank] (Score then TopK, each chosen page's score in
// outScores) computed by a best-first search over box trees, one per
// sequence of b synced with its pages (trees[i] covers
// b.Pages[b.Indptr[i]:b.Indptr[i+1]]): each row scores boxes from the top
// of its tree down, opening only boxes whose bound can beat the row's
// running K-th page score, and returns exactly Rank's pages (the same set,
// ties to the lower page) and scores (bit-identical: pages are scored by
// the flat kernel's own code). Rows the search cannot help, and a search
// that scores more than cfg.FlatAfter of its row, are scored flat (see
// HierConfig). A backend scoring fp8 summaries (CPUConfig.SummaryDType)
// runs Rank itself. When rowStats is not nil (one entry per plan row),
// rowStats[r] is set to row r's work (zero for a row with K or N 0).
func (c *CPU) HierRank(ctx context.Context, cfg HierConfig, s Shape, l Layer, b *Batch, trees []*BoxTree, q []float32, mode GQAMode, plan *TopKPlan, out []int32, outScores []float32, rowStats []HierStats) error {
	if rowStats != nil && len(rowStats) != plan.Rows() {
		return fmt.Errorf("hier rank: %d row stats for %d rows", len(rowStats), plan.Rows())
	}
	if c.score.fp8 {
		if err := c.Rank(ctx, s, l, b, q, mode, plan, out, outScores); err != nil {
			return err
		}
		for r := range rowStats {
			rowStats[r] = HierStats{}
			if plan.K[r] > 0 && plan.N[r] > 0 {
				n := int64(plan.N[r])
				rowStats[r] = HierStats{Rows: 1, Candidates: n, Pages: n, Flat: 1}
			}
		}
		return nil
	}
	if err := s.Validate(); err != nil {
		return fmt.Errorf("hier rank: %w", err)
	}
	if err := b.ValidateSummaries(s, l); err != nil {
		return fmt.Errorf("hier rank: %w", err)
	}
	if _, err := CheckRank(s, b, mode, plan, out, outScores); err != nil {
		return fmt.Errorf("hier rank: %w", err)
	}
	n, d := b.Len(), s.HeadDim
	if len(q) != n*s.QHeads*d {
		return fmt.Errorf("hier rank: query has %d floats, want %d", len(q), n*s.QHeads*d)
	}
	if len(trees) != n {
		return fmt.Errorf("hier rank: %d trees for %d sequences", len(trees), n)
	}
	for i, t := range trees {
		if t == nil || t.pages != b.NumPages(i) || (t.pages > 0 && (t.kvh != s.KVHeads || t.d != d)) {
			return fmt.Errorf("%w: sequence %d: tree does not cover its %d pages of this shape (sync it first)", ErrHierConfig, i, b.NumPages(i))
		}
	}
	cfg = cfg.withDefaults()
	for _, tr := range trees {
		if rows := s.Rows(mode); len(tr.memo) != rows {
			tr.memo = make([]hierMemo, rows)
		}
	}
	if err := c.enter(ctx); err != nil {
		return err
	}
	t := &c.hier
	t.s, t.b, t.trees, t.mode, t.plan, t.cfg = s, b, trees, mode, plan, cfg
	t.stats = slices.Grow(t.stats[:0], plan.Rows())[:plan.Rows()]
	clear(t.stats)
	t.way = slices.Grow(t.way[:0], plan.Rows())[:plan.Rows()]
	search := false
	for r := range plan.Rows() {
		t.way[r] = t.decide(r)
		search = search || t.way[r] == hierSearch
	}
	if !search && cfg.MaxSkip >= 0 {
		// Every row scores flat: the flat kernels, parallel over pages.
		for r, w := range t.way {
			if w == hierNone {
				continue
			}
			n := int64(plan.N[r])
			t.stats[r] = HierStats{Rows: 1, Candidates: n, Pages: n}
			if w == hierFlat {
				t.stats[r].Flat = 1
			} else {
				t.stats[r].Skipped = 1
			}
		}
		copy(rowStats, t.stats)
		t.b, t.trees, t.plan = nil, nil, nil
		c.mu.Unlock()
		return c.Rank(ctx, s, l, b, q, mode, plan, out, outScores)
	}
	defer c.mu.Unlock()
	rec := 2 * d
	t.w = grow(t.w, n*s.QHeads*rec)
	for i := range n * s.QHeads {
		qh, wh := q[i*d:][:d], t.w[i*rec:][:rec]
		for j, x := range qh {
			wh[j] = min(x, 0)
			wh[d+j] = max(x, 0)
		}
	}
	if len(t.scr) == 0 {
		t.scr = make([]hierScratch, c.cfg.Workers+1)
	}
	t.l, t.out, t.outSc = l, out, outScores
	c.pool.parallel(t, plan.Rows())
	copy(rowStats, t.stats)
	t.l, t.b, t.trees, t.plan, t.out, t.outSc = Layer{}, nil, nil, nil, nil, nil
	return nil
}

// decide returns plan row r's way through HierRank, counting down its
// fallback memory when it skips the search.
func (t *hierTask) decide(r int) uint8 {
	p := t.plan
	n, k := int(p.N[r]), int(p.K[r])
	if k <= 0 || n <= 0 {
		return hierNone
	}
	seq, row := t.rowOf(r)
	tree := t.trees[seq]
	if k >= n || tree.Levels() < 2 || k*tree.group*t.cfg.MinRatio > n {
		return hierFlat
	}
	if m := &tree.memo[row]; t.cfg.MaxSkip >= 0 && m.left > 0 {
		m.left--
		return hierSkip
	}
	return hierSearch
}

// rowOf returns the sequence and score row that plan row r ranks.
func (t *hierTask) rowOf(r int) (seq, row int) {
	rows := t.s.Rows(t.mode)
	off := int(t.plan.ScoreOff[r])
	// The sequence whose score block holds off: the last i with
	// Indptr[i]*rows <= off among sequences with pages.
	lo, hi := 0, t.b.Len()-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if t.b.ScoreOffset(mid, rows) <= off {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	for lo > 0 && t.b.NumPages(lo) == 0 {
		lo--
	}
	np := t.b.NumPages(lo)
	return lo, (off - t.b.ScoreOffset(lo, rows)) / max(np, 1)
}

func (t *hierTask) run(worker, r int) {
	p := t.plan
	n, k, base := int(p.N[r]), int(p.K[r]), int(p.Base[r])
	if k <= 0 || n <= 0 {
		return
	}
	out, outSc := t.out[p.OutOff[r]:][:min(k, n)], t.outSc[p.OutOff[r]:][:min(k, n)]
	seq, row := t.rowOf(r)
	s := t.s
	g, rec := s.Group(), 2*s.HeadDim
	kvh, head := row, -1 // head: the query head of a per-head row
	if t.mode == PerHead {
		kvh, head = row/g, row%g
	}
	sc := &t.scr[worker]
	st := &t.stats[r]
	st.Rows, st.Candidates = 1, int64(n)
	e := rowEval{
		w:    t.w[(seq*s.QHeads+kvh*g)*rec:][:g*rec],
		head: head, g: g, rec: rec, kvh: kvh, kvHeads: s.KVHeads,
		sum:   t.l.Summary,
		pages: t.b.Pages[t.b.Indptr[seq]:t.b.Indptr[seq+1]],
		u:     &sc.u,
	}
	tree := t.trees[seq]
	switch t.way[r] {
	case hierFlat, hierSkip:
		if t.way[r] == hierFlat {
			st.Flat = 1
		} else {
			st.Skipped = 1
		}
		t.flat(sc, e, base, n, k, out, outSc, nil, st)
		return
	}
	memo := &tree.memo[row]
	sc.gen++
	if sc.gen == 0 { // wrapped: stale stamps could collide
		clear(sc.stamp)
		sc.gen = 1
	}
	if len(sc.stamp) < n {
		sc.stamp = make([]uint32, n)
		sc.sc = make([]float32, n)
	}
	budget := int64(t.cfg.FlatAfter * float64(n))
	lo, hi := base, base+n
	sc.heap, sc.top = sc.heap[:0], sc.top[:0]
	top := len(tree.levels) - 1
	span := 1 // pages under a box of level li+1
	for range len(tree.levels) {
		span *= tree.group
	}
	for node := range tree.Nodes(top + 1) {
		if node*span < hi && (node+1)*span > lo {
			sc.heap = heapPush(sc.heap, hierNode{bound: e.bound(tree, top, node), level: int32(top), node: int32(node)})
			st.Boxes++
		}
	}
	for len(sc.heap) > 0 {
		var nd hierNode
		nd, sc.heap = heapPop(sc.heap)
		if len(sc.top) == k && nd.bound < float64(sc.top[0].Score) {
			break // no box left can hold a page that beats the K-th
		}
		gsz := tree.group
		if nd.level == 0 {
			for lp := max(int(nd.node)*gsz, lo); lp < min(int(nd.node)*gsz+gsz, hi); lp++ {
				x := e.page(lp)
				st.Pages++
				sc.sc[lp-base], sc.stamp[lp-base] = x, sc.gen
				c := plan.Candidate{Score: x, Page: int32(lp)}
				if len(sc.top) < k {
					sc.top = minPush(sc.top, c)
				} else if compareCand(c, sc.top[0]) < 0 {
					sc.top[0] = c
					minFix(sc.top)
				}
			}
		} else {
			cs := 1 // pages under a child (level nd.level, 1-based)
			for range int(nd.level) {
				cs *= tree.group
			}
			nChild := tree.Nodes(int(nd.level))
			for ch := int(nd.node) * gsz; ch < min(int(nd.node)*gsz+gsz, nChild); ch++ {
				if ch*cs >= hi || (ch+1)*cs <= lo {
					continue
				}
				bd := e.bound(tree, int(nd.level)-1, ch)
				st.Boxes++
				if len(sc.top) < k || bd >= float64(sc.top[0].Score) {
					sc.heap = heapPush(sc.heap, hierNode{bound: bd, level: nd.level - 1, node: int32(ch)})
				}
			}
		}
		if st.Boxes+st.Pages > budget {
			st.Fallbacks = 1
			if t.cfg.MaxSkip >= 0 {
				memo.left = max(memo.next, min(firstSkip, int32(t.cfg.MaxSkip)))
				memo.next = min(2*memo.left, int32(t.cfg.MaxSkip))
			}
			t.flat(sc, e, base, n, k, out, outSc, sc.stamp, st)
			return
		}
	}
	*memo = hierMemo{}
	if t.plan.BestFirst {
		slices.SortFunc(sc.top, compareCand)
	} else {
		slices.SortFunc(sc.top, func(a, b plan.Candidate) int { return int(a.Page - b.Page) })
	}
	for j, c := range sc.top {
		out[j], outSc[j] = c.Page, c.Score
	}
}

// flat scores the row's candidates (those not stamped with the current
// generation when stamp is set) and selects as TopK does.
func (t *hierTask) flat(sc *hierScratch, e rowEval, base, n, k int, out []int32, outSc []float32, stamp []uint32, st *HierStats) {
	if len(sc.sc) < n {
		sc.sc = make([]float32, n)
	}
	scores := sc.sc[:n]
	for i := range n {
		if stamp != nil && stamp[i] == sc.gen {
			continue
		}
		scores[i] = e.page(base + i)
		st.Pages++
	}
	best := t.plan.BestFirst
	if k >= n && !best {
		for i := range n {
			out[i], outSc[i] = int32(base+i), scores[i]
		}
		return
	}
	sc.idx = slices.Grow(sc.idx[:0], n)[:n]
	for i := range sc.idx {
		sc.idx[i] = int32(i)
	}
	k = min(k, n)
	if k < n {
		SelectTopK(scores, sc.idx, k)
	}
	sel := sc.idx[:k]
	if best {
		sc.keys = sortBestFirst(scores, sel, sc.keys, int32(base), out[:k])
		for j, p := range out[:k] {
			outSc[j] = scores[int(p)-base]
		}
		return
	}
	slices.Sort(sel)
	for j, v := range sel {
		out[j], outSc[j] = int32(base)+v, scores[v]
	}
}

// rowEval scores pages and boxes for one row.
type rowEval struct {
	w       []float32 // split queries of the KV head's g query heads
	head    int       // the row's query head in the group, or -1 (group max)
	g, rec  int
	kvh     int
	kvHeads int
	sum     []float32
	pages   []int32
	u       *[maxScoreGroup]float32
}

// score returns the row's float32 score of record r: the flat kernel's
// value, bit for bit (same heads grouping through scoreHeads).
func (e rowEval) score(r []float32) float32 {
	if e.head >= 0 {
		// The head's value as scoreHeads computes it in its group: its
		// quad through dot4, or dot for the last g%4 heads.
		q0 := e.head / 4 * 4
		if q0+4 <= e.g {
			scoreHeads(e.w[q0*e.rec:][:4*e.rec], r, e.u[:4])
			return e.u[e.head-q0]
		}
		return dot(e.w[e.head*e.rec:][:e.rec], r)
	}
	best := float32(math.Inf(-1))
	for h0 := 0; h0 < e.g; h0 += maxScoreGroup {
		m := min(e.g-h0, maxScoreGroup)
		scoreHeads(e.w[h0*e.rec:][:m*e.rec], r, e.u[:m])
		for _, x := range e.u[:m] {
			best = max(best, x)
		}
	}
	return best
}

func (e rowEval) page(lp int) float32 {
	return e.score(e.sum[(int(e.pages[lp])*e.kvHeads+e.kvh)*e.rec:][:e.rec])
}

// bound returns the row's float32 score of box node of tree level li
// (0-based), an upper bound of the float32 score of every page under it
// (see BoxTree on why no margin is needed).
func (e rowEval) bound(t *BoxTree, li, node int) float64 {
	return float64(e.score(t.levels[li][(node*e.kvHeads+e.kvh)*e.rec:][:e.rec]))
}

// compareCand is plan.Compare: score descending, then page ascending.
func compareCand(a, b plan.Candidate) int {
	if a.Score != b.Score {
		if a.Score > b.Score {
			return -1
		}
		return 1
	}
	return int(a.Page) - int(b.Page)
}

// heapPush and heapPop keep a max-heap of boxes by bound.
func heapPush(h []hierNode, x hierNode) []hierNode {
	h = append(h, x)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p].bound >= h[i].bound {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func heapPop(h []hierNode) (hierNode, []hierNode) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h[l].bound > h[m].bound {
			m = l
		}
		if r < len(h) && h[r].bound > h[m].bound {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}

// minPush and minFix keep a heap of candidates with the one chosen last
// (compareCand greatest) at 0.
func minPush(h []plan.Candidate, c plan.Candidate) []plan.Candidate {
	h = append(h, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if compareCand(h[p], h[i]) >= 0 {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func minFix(h []plan.Candidate) {
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && compareCand(h[l], h[m]) > 0 {
			m = l
		}
		if r < len(h) && compareCand(h[r], h[m]) > 0 {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
