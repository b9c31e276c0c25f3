package kernels

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/questrt/questrt/plan"
)

// CPUConfig configures the CPU backend.
type CPUConfig struct {
	// Workers is the number of goroutines besides the caller's. Default
	// (0): runtime.GOMAXPROCS(0) - 1.
	Workers int
	// ScoreChunk is the number of pages one scoring work item covers.
	// Default 512.
	ScoreChunk int
	// AttendChunk is the number of pages one attention work item covers
	// (split-K); its partial states are merged afterwards. Default 64.
	AttendChunk int
	// SummaryDType is the storage type of the summaries Score reads.
	// SummaryKV (the default) reads Layer.Summary's float32 records as
	// they are; SummaryFP8 emulates fp8 records: Score encodes each
	// record as package fp8 stores it (outward rounding, per-record
	// scale) and scores the decoded values, exactly what an fp8 store
	// would give (see fp8.go).
	SummaryDType plan.SummaryDType
}

// DefaultCPUConfig returns the defaults documented on CPUConfig.
func DefaultCPUConfig() CPUConfig {
	return CPUConfig{Workers: max(runtime.GOMAXPROCS(0)-1, 0), ScoreChunk: 512, AttendChunk: 64}
}

// CPU is the float32 CPU backend. Calls serialize on a mutex and run in
// parallel on a fixed worker pool; after warm-up a call allocates nothing.
type CPU struct {
	cfg    CPUConfig
	mu     sync.Mutex
	pool   *workerPool
	closed bool

	score  scoreTask
	topk   topkTask
	attend attendTask
	reduce reduceTask
	merge  mergeTask
	hier   hierTask

	stepMu     sync.Mutex // guards the Step and Rank scratch
	stepCheck  StepCheck
	stepScores []float32
}

var (
	_ Backend = (*CPU)(nil)
	_ Stepper = (*CPU)(nil)
	_ Ranker  = (*CPU)(nil)
)

// Rank implements Ranker as Score and TopK in turn (ComposeRank).
func (c *CPU) Rank(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, mode GQAMode, plan *TopKPlan, out []int32, outScores []float32) error {
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	var err error
	c.stepScores, err = ComposeRank(ctx, c, c.stepScores, s, l, b, q, mode, plan, out, outScores)
	return err
}

// Step implements Stepper as Score, TopK and Attend in turn (Compose).
func (c *CPU) Step(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, plan *TopKPlan, lists *Lists, o, lse []float32) error {
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	if err := c.stepCheck.Check(b, s.Rows(lists.Mode), plan, lists); err != nil {
		return err
	}
	var err error
	c.stepScores, err = Compose(ctx, c, c.stepScores, s, l, b, q, plan, lists, o, lse)
	return err
}

// NewCPU starts a CPU backend. Zero fields of cfg take their defaults.
func NewCPU(cfg CPUConfig) *CPU {
	def := DefaultCPUConfig()
	if cfg.Workers <= 0 {
		cfg.Workers = def.Workers
	}
	if cfg.ScoreChunk <= 0 {
		cfg.ScoreChunk = def.ScoreChunk
	}
	if cfg.AttendChunk <= 0 {
		cfg.AttendChunk = def.AttendChunk
	}
	c := &CPU{cfg: cfg, pool: newWorkerPool(cfg.Workers)}
	slots := cfg.Workers + 1
	c.score.w = make([][]float32, slots)
	c.score.fp8 = cfg.SummaryDType == plan.SummaryFP8
	c.score.r8 = make([]fp8Scratch, slots)
	c.topk.idx = make([][]int32, slots)
	c.topk.keys = make([][]uint64, slots)
	c.attend.scratch = make([]attendScratch, slots)
	return c
}

// Name returns "cpu".
func (c *CPU) Name() string { return "cpu" }

// Close stops the worker pool. Further calls return ErrClosed.
func (c *CPU) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.pool.close()
	}
	return nil
}

func (c *CPU) enter(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		c.mu.Unlock()
		return err
	}
	return nil
}

// ---- score ----

type scoreItem struct{ seq, p0, p1 int32 }

type scoreTask struct {
	s     Shape
	l     Layer
	b     *Batch
	q     []float32
	mode  GQAMode
	out   []float32
	items []scoreItem
	w     [][]float32 // per worker: QHeads x 2D split queries
	fp8   bool        // emulate fp8 records (CPUConfig.SummaryDType)
	r8    []fp8Scratch
}

// Score implements Backend. A work item is a run of pages of one sequence
// with all KV heads, so it streams through the summary pool in layout order
// ([pages][KVHeads][2][D]).
func (c *CPU) Score(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, mode GQAMode, out []float32) error {
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := s.Validate(); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	if err := b.ValidateSummaries(s, l); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	n := b.Len()
	if len(q) != n*s.QHeads*s.HeadDim {
		return fmt.Errorf("score: query has %d floats, want %d", len(q), n*s.QHeads*s.HeadDim)
	}
	rows := s.Rows(mode)
	if len(out) < len(b.Pages)*rows {
		return fmt.Errorf("score: output has %d floats, want %d", len(out), len(b.Pages)*rows)
	}
	t := &c.score
	t.s, t.l, t.b, t.q, t.mode, t.out = s, l, b, q, mode, out
	t.items = t.items[:0]
	chunk := max(c.cfg.ScoreChunk/s.KVHeads, 1)
	for i := range n {
		np := b.NumPages(i)
		for p0 := 0; p0 < np; p0 += chunk {
			t.items = append(t.items, scoreItem{int32(i), int32(p0), int32(min(p0+chunk, np))})
		}
	}
	c.pool.parallel(t, len(t.items))
	t.l, t.b, t.q, t.out = Layer{}, nil, nil, nil
	return nil
}

func (t *scoreTask) run(worker, i int) {
	it := t.items[i]
	s := t.s
	d, g := s.HeadDim, s.Group()
	rec := 2 * d
	w := t.w[worker]
	if cap(w) < s.QHeads*rec {
		w = make([]float32, s.QHeads*rec)
		t.w[worker] = w
	}
	w = w[:s.QHeads*rec]
	seq := int(it.seq)
	for h := range s.QHeads {
		qh := t.q[(seq*s.QHeads+h)*d:][:d]
		wh := w[h*rec:][:rec]
		for j, x := range qh {
			wh[j] = min(x, 0)
			wh[d+j] = max(x, 0)
		}
	}
	np := t.b.NumPages(seq)
	pages := t.b.Pages[t.b.Indptr[seq]:t.b.Indptr[seq+1]]
	out := t.out[t.b.ScoreOffset(seq, t.s.Rows(t.mode)):]
	if t.l.SubBoxes > 1 {
		t.runSub(worker, it, w, pages, np, out)
		return
	}
	var u [maxScoreGroup]float32
	for p := int(it.p0); p < int(it.p1); p++ {
		recs := t.l.Summary[int(pages[p])*s.KVHeads*rec:][:s.KVHeads*rec]
		for kvh := range s.KVHeads {
			r := recs[kvh*rec:][:rec]
			scale := float32(1)
			if t.fp8 {
				r, scale = t.r8[worker].record(r)
			}
			best := float32(math.Inf(-1))
			for h0 := 0; h0 < g; h0 += maxScoreGroup {
				n := min(g-h0, maxScoreGroup)
				scoreHeads(w[(kvh*g+h0)*rec:][:n*rec], r, u[:n])
				for i, x := range u[:n] {
					if t.fp8 {
						x *= scale
					}
					if t.mode == PerHead {
						out[(kvh*g+h0+i)*np+p] = x
					} else {
						best = max(best, x)
					}
				}
			}
			if t.mode == GroupMax {
				out[kvh*np+p] = best
			}
		}
	}
}

// runSub scores the pages of item it by their sub-boxes (Layer.SubBoxes):
// a row's page bound is the largest of its query heads' (GroupMax) or its
// head's (PerHead) bounds over the page's non-empty sub-boxes, each bound
// computed by scoreHeads as the single box's is, so a page whose
// sub-boxes all equal its box scores bit for bit as with one box.
func (t *scoreTask) runSub(worker int, it scoreItem, w []float32, pages []int32, np int, out []float32) {
	s := t.s
	d, g, c := s.HeadDim, s.Group(), t.l.SubBoxes
	rec := 2 * d
	var u [maxScoreGroup]float32
	negInf := float32(math.Inf(-1))
	for p := int(it.p0); p < int(it.p1); p++ {
		recs := t.l.Sub[int(pages[p])*s.KVHeads*c*rec:][:s.KVHeads*c*rec]
		for kvh := range s.KVHeads {
			if t.mode == PerHead {
				for h := range g {
					out[(kvh*g+h)*np+p] = negInf
				}
			}
			best := negInf
			for b := range c {
				r := recs[(kvh*c+b)*rec:][:rec]
				if r[0] > r[d] {
					continue // empty: no valid key in these slots
				}
				scale := float32(1)
				if t.fp8 {
					r, scale = t.r8[worker].record(r)
				}
				for h0 := 0; h0 < g; h0 += maxScoreGroup {
					n := min(g-h0, maxScoreGroup)
					scoreHeads(w[(kvh*g+h0)*rec:][:n*rec], r, u[:n])
					for i, x := range u[:n] {
						if t.fp8 {
							x *= scale
						}
						if t.mode == PerHead {
							o := &out[(kvh*g+h0+i)*np+p]
							*o = max(*o, x)
						} else {
							best = max(best, x)
						}
					}
				}
			}
			if t.mode == GroupMax {
				out[kvh*np+p] = best
			}
		}
	}
}

// maxScoreGroup is the number of query heads scoreHeads handles per call.
const maxScoreGroup = 16

// scoreHeads writes out[h] = w[h*rec:(h+1)*rec] . r for every h <
// len(out), rec = len(r): the split queries of len(out) consecutive query
// heads against one summary record. Heads go four at a time through dot4
// and the remainder through dot, so a head's float32 score depends only on
// its position in the group: the flat score and the hierarchical search
// (boxtree.go) call this one function and get bit-identical page scores.
func scoreHeads(w, r []float32, out []float32) {
	rec := len(r)
	var u [4]float32
	h := 0
	for ; h+4 <= len(out); h += 4 {
		dot4(w[h*rec:][:4*rec], r, &u)
		copy(out[h:h+4], u[:])
	}
	for ; h < len(out); h++ {
		out[h] = dot(w[h*rec:][:rec], r)
	}
}

// ---- top-K ----

type topkTask struct {
	scores []float32
	plan   *TopKPlan
	out    []int32
	idx    [][]int32  // per worker scratch
	keys   [][]uint64 // per worker scratch (BestFirst)
}

// TopK implements Backend.
func (c *CPU) TopK(ctx context.Context, scores []float32, plan *TopKPlan, out []int32) error {
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.mu.Unlock()
	n := plan.Rows()
	if _, err := plan.Check(len(scores), len(out)); err != nil {
		return err
	}
	t := &c.topk
	t.scores, t.plan, t.out = scores, plan, out
	c.pool.parallel(t, n)
	t.scores, t.plan, t.out = nil, nil, nil
	return nil
}

func (t *topkTask) run(worker, r int) {
	p := t.plan
	n, k, base := int(p.N[r]), int(p.K[r]), p.Base[r]
	out := t.out[p.OutOff[r]:]
	if k >= n && !p.BestFirst {
		for i := range n {
			out[i] = base + int32(i)
		}
		return
	}
	if k <= 0 || n == 0 {
		return
	}
	idx := t.idx[worker]
	if cap(idx) < n {
		idx = make([]int32, n)
		t.idx[worker] = idx
	}
	idx = idx[:n]
	for i := range idx {
		idx[i] = int32(i)
	}
	scores := t.scores[p.ScoreOff[r]:][:n]
	k = min(k, n)
	if k < n {
		SelectTopK(scores, idx, k)
	}
	sel := idx[:k]
	if p.BestFirst {
		t.keys[worker] = sortBestFirst(scores, sel, t.keys[worker], base, out[:k])
		return
	}
	slices.Sort(sel)
	for i, v := range sel {
		out[i] = base + v
	}
}

// sortBestFirst writes base+i for the indices i of sel (into scores, not
// NaN) to out best first: score descending, ties to the lower index (-0
// ties with +0), plan.Compare's order. It sorts one key per entry (the
// score's order-preserving bits, inverted, above the index) in keys,
// grown as needed and returned.
func sortBestFirst(scores []float32, sel []int32, keys []uint64, base int32, out []int32) []uint64 {
	keys = slices.Grow(keys[:0], len(sel))[:len(sel)]
	for i, v := range sel {
		keys[i] = bestFirstKey(scores[v], uint32(v))
	}
	slices.Sort(keys)
	for i, key := range keys {
		out[i] = base + int32(uint32(key))
	}
	return keys
}

// bestFirstKey maps (score, i) to a key whose ascending order is score
// descending, then i ascending; -0 folds into +0 (they compare equal).
// It is the sort key of package collective's wire format.
func bestFirstKey(score float32, i uint32) uint64 {
	b := math.Float32bits(score)
	// Flip every bit of a negative score and the sign bit of a positive
	// one: the bits then order as the floats do, -0 just below +0.
	u := b ^ (uint32(int32(b)>>31) | 1<<31)
	if u == 1<<31-1 {
		u = 1 << 31 // -0 -> +0
	}
	return uint64(^u)<<32 | uint64(i)
}

// SelectTopK reorders idx (indices into scores) so that idx[:k] holds the k
// best entries: higher score first, ties to the lower index. It runs in
// expected O(len(idx)) time (quickselect with a median-of-three pivot) and
// leaves idx[:k] in no particular order.
func SelectTopK(scores []float32, idx []int32, k int) {
	better := func(a, b int32) bool {
		sa, sb := scores[a], scores[b]
		return sa > sb || (sa == sb && a < b)
	}
	lo, hi := 0, len(idx)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		// Median of three moved to hi as the pivot.
		if better(idx[mid], idx[lo]) {
			idx[mid], idx[lo] = idx[lo], idx[mid]
		}
		if better(idx[hi], idx[lo]) {
			idx[hi], idx[lo] = idx[lo], idx[hi]
		}
		if better(idx[mid], idx[hi]) {
			idx[mid], idx[hi] = idx[hi], idx[mid]
		}
		pivot := idx[hi]
		store := lo
		for i := lo; i < hi; i++ {
			if better(idx[i], pivot) {
				idx[i], idx[store] = idx[store], idx[i]
				store++
			}
		}
		idx[store], idx[hi] = idx[hi], idx[store]
		switch {
		case store == k-1 || store == k:
			return
		case store < k-1:
			lo = store + 1
		default:
			hi = store - 1
		}
	}
}

// ---- attention ----

type attendItem struct {
	seq, row int32
	lo, hi   int32 // range in lists.Pages
	part     int32 // index of this item's partial state block
}

type attendScratch struct {
	logits []float32 // G x S
	acc    []float32 // G x D
	m, l   []float64 // G
	k, v   []float32 // S x D: one fp8 record of K and of V, dequantized
}

type attendTask struct {
	s       Shape
	l       Layer
	b       *Batch
	q       []float32
	lists   *Lists
	items   []attendItem
	rowItem []int32 // first item of each row, len rows+1
	partO   []float32
	partL   []float32
	scratch []attendScratch
	seen    []bool    // Lists.Check scratch
	keep    *TopPKeep // AttendTopP: the tokens to read (nil: all)
}

type reduceTask struct {
	a   *attendTask
	o   []float32
	lse []float32
}

// Attend implements Backend.
func (c *CPU) Attend(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, lists *Lists, o, lse []float32) error {
	return c.attendKeep(ctx, s, l, b, q, lists, nil, o, lse)
}

// attendKeep is Attend reading the tokens keep keeps (nil: all).
func (c *CPU) attendKeep(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, lists *Lists, keep *TopPKeep, o, lse []float32) error {
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := s.Validate(); err != nil {
		return fmt.Errorf("attend: %w", err)
	}
	if err := b.Validate(s, l); err != nil {
		return fmt.Errorf("attend: %w", err)
	}
	n := b.Len()
	hq, d := s.QHeads, s.HeadDim
	if len(q) != n*hq*d {
		return fmt.Errorf("attend: query has %d floats, want %d", len(q), n*hq*d)
	}
	if len(o) != n*hq*d || len(lse) != n*hq {
		return fmt.Errorf("attend: output sizes o=%d lse=%d, want %d and %d", len(o), len(lse), n*hq*d, n*hq)
	}
	rows := s.Rows(lists.Mode)
	if !lists.All && (len(lists.Indptr) != n*rows+1 || lists.Indptr[0] != 0 || int(lists.Indptr[n*rows]) != len(lists.Pages)) {
		return fmt.Errorf("attend: lists indptr has %d entries for %d rows and %d pages", len(lists.Indptr), n*rows, len(lists.Pages))
	}
	t := &c.attend
	var err error
	if t.seen, err = lists.Check(b, rows, t.seen); err != nil {
		return fmt.Errorf("attend: %w", err)
	}
	t.s, t.l, t.b, t.q, t.lists, t.keep = s, l, b, q, lists, keep
	t.items = t.items[:0]
	t.rowItem = t.rowItem[:0]
	chunk := int32(c.cfg.AttendChunk)
	for row := range n * rows {
		t.rowItem = append(t.rowItem, int32(len(t.items)))
		// Items cover list positions, or pages when the list is all of
		// them (the same boundaries relative to the row).
		lo, hi := int32(0), int32(b.NumPages(row/rows))
		if !lists.All {
			lo, hi = lists.Indptr[row], lists.Indptr[row+1]
		}
		for p := lo; p < hi; p += chunk {
			t.items = append(t.items, attendItem{seq: int32(row / rows), row: int32(row % rows), lo: p, hi: min(p+chunk, hi), part: int32(len(t.items))})
		}
	}
	t.rowItem = append(t.rowItem, int32(len(t.items)))
	heads := s.Group()
	if lists.Mode == PerHead {
		heads = 1
	}
	t.partO = grow(t.partO, len(t.items)*heads*d)
	t.partL = grow(t.partL, len(t.items)*heads)
	c.pool.parallel(t, len(t.items))
	c.reduce = reduceTask{a: t, o: o, lse: lse}
	c.pool.parallel(&c.reduce, n*rows)
	c.reduce = reduceTask{}
	t.l, t.b, t.q, t.lists, t.keep = Layer{}, nil, nil, nil, nil
	return nil
}

// pageKV returns the first n tokens' keys and values of K/V record rec
// (physical page x KV heads + KV head), dequantized into sc for an fp8
// layer.
func pageKV(l Layer, rec, n, sz, d int, sc *attendScratch) (kp, vp []float32) {
	base := rec * sz * d
	if l.FP8() {
		// Dequantize the page's valid tokens of this head (the
		// elements a GPU kernel would decode in registers).
		kp, vp = sc.k[:n*d], sc.v[:n*d]
		decodeKV(kp, l.K8[base:][:n*d], l.KScale[rec])
		decodeKV(vp, l.V8[base:][:n*d], l.VScale[rec])
		return kp, vp
	}
	return l.K[base:][:n*d], l.V[base:][:n*d]
}

// pageLogits writes the scaled logits q_h.k_tok * scale of heads query
// heads (q is [heads][d]) against the n keys kp into logits[h*sz+tok].
// Attention and the top-p logits share it, so both see the same bits.
func pageLogits(q, kp []float32, n, heads, d, sz int, scale float32, logits []float32) {
	var four [4]float32
	for tok := range n {
		krow := kp[tok*d:][:d]
		h := 0
		for ; h+4 <= heads; h += 4 {
			dot4(q[h*d:][:4*d], krow, &four)
			for i, x := range four {
				logits[(h+i)*sz+tok] = x * scale
			}
		}
		for ; h < heads; h++ {
			logits[h*sz+tok] = dot(q[h*d:][:d], krow) * scale
		}
	}
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func (t *attendTask) run(worker, i int) {
	it := t.items[i]
	s := t.s
	d, sz := s.HeadDim, s.PageSize
	g := s.Group()
	seq := int(it.seq)
	var kvh, h0, heads int
	if t.lists.Mode == PerHead {
		kvh, h0, heads = int(it.row)/g, int(it.row), 1
	} else {
		kvh, h0, heads = int(it.row), int(it.row)*g, g
	}
	sc := &t.scratch[worker]
	if cap(sc.logits) < heads*sz {
		sc.logits = make([]float32, heads*sz)
	}
	if cap(sc.acc) < heads*d {
		sc.acc = make([]float32, heads*d)
	}
	if cap(sc.m) < heads {
		sc.m = make([]float64, heads)
		sc.l = make([]float64, heads)
	}
	if t.l.FP8() && cap(sc.k) < sz*d {
		sc.k = make([]float32, sz*d)
		sc.v = make([]float32, sz*d)
	}
	logits, acc := sc.logits[:heads*sz], sc.acc[:heads*d]
	m, l := sc.m[:heads], sc.l[:heads]
	clear(acc)
	for h := range heads {
		m[h], l[h] = math.Inf(-1), 0
	}
	q := t.q[(seq*s.QHeads+h0)*d:][:heads*d]
	scale := float32(1 / math.Sqrt(float64(d)))
	np := t.b.NumPages(seq)
	pages := t.b.Pages[t.b.Indptr[seq]:t.b.Indptr[seq+1]]
	for i := it.lo; i < it.hi; i++ {
		lp := i
		if !t.lists.All {
			lp = t.lists.Pages[i]
		}
		n := sz
		if int(lp) == np-1 {
			n = int(t.b.LastLen[seq])
		}
		rec := int(pages[lp])*s.KVHeads + kvh
		kp, vp := pageKV(t.l, rec, n, sz, d, sc)
		pageLogits(q, kp, n, heads, d, sz, scale, logits)
		if t.keep != nil && !t.keep.mask(logits, heads, n, sz, int32(seq*s.QHeads+h0), t.keep.Global[i]*int32(sz)) {
			continue // no kept token in this page
		}
		for h := range heads {
			lg := logits[h*sz:][:n]
			pm := float64(lg[0])
			for _, x := range lg[1:] {
				pm = max(pm, float64(x))
			}
			if pm > m[h] {
				if l[h] != 0 {
					alpha := math.Exp(m[h] - pm)
					l[h] *= alpha
					scaleVec(float32(alpha), acc[h*d:][:d])
				}
				m[h] = pm
			}
			var sum float64
			for j, x := range lg {
				p := math.Exp(float64(x) - m[h])
				sum += p
				lg[j] = float32(p)
			}
			l[h] += sum
		}
		for h := range heads {
			gemvT(logits[h*sz:][:n], vp, acc[h*d:][:d])
		}
	}
	po := t.partO[int(it.part)*heads*d:][:heads*d]
	pl := t.partL[int(it.part)*heads:][:heads]
	for h := range heads {
		if l[h] == 0 {
			clear(po[h*d:][:d])
			pl[h] = float32(math.Inf(-1))
			continue
		}
		inv := float32(1 / l[h])
		for j, x := range acc[h*d:][:d] {
			po[h*d+j] = x * inv
		}
		pl[h] = float32(m[h] + math.Log(l[h]))
	}
}

func (r *reduceTask) run(_, row int) {
	a := r.a
	s := a.s
	d, g := s.HeadDim, s.Group()
	rows := s.Rows(a.lists.Mode)
	seq, rr := row/rows, row%rows
	heads, h0 := g, rr*g
	if a.lists.Mode == PerHead {
		heads, h0 = 1, rr
	}
	o := r.o[(seq*s.QHeads+h0)*d:][:heads*d]
	lse := r.lse[seq*s.QHeads+h0:][:heads]
	clear(o)
	for h := range lse {
		lse[h] = float32(math.Inf(-1))
	}
	for it := a.rowItem[row]; it < a.rowItem[row+1]; it++ {
		MergeStates(d, o, lse, a.partO[int(it)*heads*d:][:heads*d], a.partL[int(it)*heads:][:heads])
	}
}

// ---- merge ----

type mergeTask struct {
	dim              int
	o, lse, o2, lse2 []float32
}

// Merge implements Backend.
func (c *CPU) Merge(ctx context.Context, dim int, o, lse, o2, lse2 []float32) error {
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if dim <= 0 || len(lse) != len(lse2) || len(o) != len(lse)*dim || len(o2) != len(o) {
		return fmt.Errorf("merge: sizes o=%d lse=%d o2=%d lse2=%d dim=%d do not match", len(o), len(lse), len(o2), len(lse2), dim)
	}
	const block = 256
	c.merge = mergeTask{dim, o, lse, o2, lse2}
	c.pool.parallel(&c.merge, (len(lse)+block-1)/block)
	c.merge = mergeTask{}
	return nil
}

func (t *mergeTask) run(_, i int) {
	const block = 256
	lo, hi := i*block, min((i+1)*block, len(t.lse))
	d := t.dim
	MergeStates(d, t.o[lo*d:hi*d], t.lse[lo:hi], t.o2[lo*d:hi*d], t.lse2[lo:hi])
}

// MergeStates folds the partial states (o2, lse2) into (o, lse), state by
// state (o is [n][d], lse is [n]): lse = logaddexp(lse, lse2),
// o = o*exp(lse_old-lse) + o2*exp(lse2-lse). The empty state (0, -Inf) is
// the identity on either side; no NaN arises. It is the CPU reference of
// Backend.Merge and the merge used by collectives on host memory.
func MergeStates(d int, o, lse, o2, lse2 []float32) {
	for h := range lse {
		b := float64(lse2[h])
		if math.IsInf(b, -1) {
			continue
		}
		a := float64(lse[h])
		oh, o2h := o[h*d:][:d], o2[h*d:][:d]
		if math.IsInf(a, -1) {
			copy(oh, o2h)
			lse[h] = lse2[h]
			continue
		}
		m := max(a, b)
		wa, wb := math.Exp(a-m), math.Exp(b-m)
		sum := wa + wb
		fa, fb := float32(wa/sum), float32(wb/sum)
		for j := range oh {
			oh[j] = oh[j]*fa + o2h[j]*fb
		}
		lse[h] = float32(m + math.Log(sum))
	}
}
