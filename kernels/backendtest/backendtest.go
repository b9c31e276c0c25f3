// Package backendtest is the conformance suite every kernels.Backend must
// pass (the CPU backend in CI, the CUDA backend on a GPU host). It checks
// each kernel against a naive float64 reference written here, independently
// of the backends: scores, top-K with its tie rule, sparse paged attention
// (tail lengths, shuffled page tables, GQA modes, ragged batches), dense
// equivalence at full budget, and the merge of partial states.
package backendtest

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/questrt/questrt/kernels"
)

// Fixture is a random page pool of one layer plus a ragged batch over it
// whose page tables are a random permutation of the physical pages.
type Fixture struct {
	Shape kernels.Shape
	Layer kernels.Layer
	Batch kernels.Batch
	Q     []float32 // [seqs][QHeads][D]
	Lens  []int     // tokens per sequence
	// ref, when set, holds the float32 elements the references read
	// (an fp8 fixture's dequantized K and V; NewFixtureFP8); Layer
	// then holds only what the backend reads.
	ref kernels.Layer
}

// keys returns the float32 keys and values the references read.
func (f *Fixture) kv() (k, v []float32) {
	if f.ref.K != nil {
		return f.ref.K, f.ref.V
	}
	return f.Layer.K, f.Layer.V
}

// NewFixture builds a fixture with the given sequence lengths (tokens).
// Values are uniform in [-1, 1); keys get a per-page offset so pages differ.
func NewFixture(rng *rand.Rand, s kernels.Shape, lens []int) *Fixture {
	return NewFixtureQ(rng, s, lens, nil)
}

// NewFixtureQ is NewFixture with keys and values rounded by quant (the
// storage type of a backend: bf16, fp16) before the summaries and every
// reference are computed, so the references see exactly the stored data.
func NewFixtureQ(rng *rand.Rand, s kernels.Shape, lens []int, quant func(float32) float32) *Fixture {
	total := 0
	for _, n := range lens {
		total += (n + s.PageSize - 1) / s.PageSize
	}
	pool := total + 3 // a few pages nobody owns
	per := s.KVHeads * s.PageSize * s.HeadDim
	f := &Fixture{Shape: s, Lens: slices.Clone(lens)}
	f.Layer = kernels.Layer{
		K:       make([]float32, pool*per),
		V:       make([]float32, pool*per),
		Summary: make([]float32, pool*s.KVHeads*2*s.HeadDim),
	}
	for i := range f.Layer.K {
		f.Layer.K[i] = float32(rng.Float64()*2 - 1)
		f.Layer.V[i] = float32(rng.Float64()*2 - 1)
	}
	// Unowned pages and padding slots hold huge garbage: a kernel that
	// reads them produces visibly wrong results.
	for i := range f.Layer.Summary {
		f.Layer.Summary[i] = 1e6
	}
	perm := rng.Perm(pool)
	f.Batch.Indptr = []int32{0}
	next := 0
	for _, n := range lens {
		np := (n + s.PageSize - 1) / s.PageSize
		for p := range np {
			phys := perm[next]
			next++
			f.Batch.Pages = append(f.Batch.Pages, int32(phys))
			valid := s.PageSize
			if p == np-1 {
				valid = n - p*s.PageSize
			}
			for h := range s.KVHeads {
				off := rng.Float64()*2 - 1
				base := (phys*s.KVHeads + h) * s.PageSize * s.HeadDim
				for t := range s.PageSize {
					for j := range s.HeadDim {
						i := base + t*s.HeadDim + j
						if t >= valid {
							f.Layer.K[i], f.Layer.V[i] = 1e4, 1e4
							continue
						}
						f.Layer.K[i] += float32(off)
						if quant != nil {
							f.Layer.K[i], f.Layer.V[i] = quant(f.Layer.K[i]), quant(f.Layer.V[i])
						}
					}
				}
				f.fillSummary(phys, h, valid)
			}
		}
		f.Batch.Indptr = append(f.Batch.Indptr, int32(len(f.Batch.Pages)))
		last := n - (np-1)*s.PageSize
		if np == 0 {
			last = 0
		}
		f.Batch.LastLen = append(f.Batch.LastLen, int32(last))
	}
	f.Q = make([]float32, len(lens)*s.QHeads*s.HeadDim)
	for i := range f.Q {
		f.Q[i] = float32(rng.Float64()*4 - 2)
	}
	return f
}

func (f *Fixture) fillSummary(phys, h, valid int) {
	s := f.Shape
	d := s.HeadDim
	rec := f.Layer.Summary[(phys*s.KVHeads+h)*2*d:][:2*d]
	for j := range d {
		lo, hi := math.Inf(1), math.Inf(-1)
		for t := range valid {
			k, _ := f.kv()
			x := float64(k[((phys*s.KVHeads+h)*s.PageSize+t)*d+j])
			lo, hi = min(lo, x), max(hi, x)
		}
		rec[j], rec[d+j] = float32(lo), float32(hi)
	}
}

// Key returns key t of logical page p of sequence seq for KV head h.
func (f *Fixture) Key(seq, p, h, t int) []float32 {
	k, _ := f.kv()
	return f.row(k, seq, p, h, t)
}

// Value is like Key for values.
func (f *Fixture) Value(seq, p, h, t int) []float32 {
	_, v := f.kv()
	return f.row(v, seq, p, h, t)
}

func (f *Fixture) row(a []float32, seq, p, h, t int) []float32 {
	s := f.Shape
	phys := int(f.Batch.Pages[int(f.Batch.Indptr[seq])+p])
	return a[((phys*s.KVHeads+h)*s.PageSize+t)*s.HeadDim:][:s.HeadDim]
}

// Valid is the number of valid tokens in logical page p of sequence seq.
func (f *Fixture) Valid(seq, p int) int {
	return min(f.Shape.PageSize, f.Lens[seq]-p*f.Shape.PageSize)
}

// Query returns query head h of sequence seq.
func (f *Fixture) Query(seq, h int) []float32 {
	d := f.Shape.HeadDim
	return f.Q[(seq*f.Shape.QHeads+h)*d:][:d]
}

// RefScore is the min/max bound of logical page p for query head h in
// float64, computed from the keys themselves (not the stored summary).
func (f *Fixture) RefScore(seq, p, h int) float64 {
	s := f.Shape
	kvh := h / s.Group()
	q := f.Query(seq, h)
	var u float64
	for j := range s.HeadDim {
		lo, hi := math.Inf(1), math.Inf(-1)
		for t := range f.Valid(seq, p) {
			x := float64(f.Key(seq, p, kvh, t)[j])
			lo, hi = min(lo, x), max(hi, x)
		}
		u += max(float64(q[j])*lo, float64(q[j])*hi)
	}
	return u
}

// RefTrueMax is max over the page's valid keys of q.k, in float64.
func (f *Fixture) RefTrueMax(seq, p, h int) float64 {
	s := f.Shape
	q := f.Query(seq, h)
	best := math.Inf(-1)
	for t := range f.Valid(seq, p) {
		best = max(best, dot64(q, f.Key(seq, p, h/s.Group(), t)))
	}
	return best
}

// RefAttend is attention of query head h over the listed logical pages in
// float64: returns o and lse (natural log, scaled logits).
func (f *Fixture) RefAttend(seq, h int, pages []int32) ([]float64, float64) {
	s := f.Shape
	d := s.HeadDim
	kvh := h / s.Group()
	q := f.Query(seq, h)
	scale := 1 / math.Sqrt(float64(d))
	var logits []float64
	var vals [][]float32
	for _, p := range pages {
		for t := range f.Valid(seq, int(p)) {
			logits = append(logits, dot64(q, f.Key(seq, int(p), kvh, t))*scale)
			vals = append(vals, f.Value(seq, int(p), kvh, t))
		}
	}
	o := make([]float64, d)
	if len(logits) == 0 {
		return o, math.Inf(-1)
	}
	m := slices.Max(logits)
	var z float64
	for _, x := range logits {
		z += math.Exp(x - m)
	}
	for i, x := range logits {
		w := math.Exp(x-m) / z
		for j := range d {
			o[j] += w * float64(vals[i][j])
		}
	}
	return o, m + math.Log(z)
}

func dot64(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

// RefTopK returns the k best of scores (desc, ties to lower index), as
// indices in ascending order, by a full sort.
func RefTopK(scores []float32, k int) []int32 {
	idx := make([]int32, len(scores))
	for i := range idx {
		idx[i] = int32(i)
	}
	sort.SliceStable(idx, func(a, b int) bool { return scores[idx[a]] > scores[idx[b]] })
	idx = idx[:min(k, len(idx))]
	slices.Sort(idx)
	return idx
}

// NewBackend makes a backend for one test; the suite closes it.
type NewBackend func(t *testing.T) kernels.Backend

// Options adapt the suite to a backend.
type Options struct {
	// Quantize rounds keys and values to the backend's storage type
	// (nil: float32 storage).
	Quantize func(float32) float32
	// Tol scales the relative tolerances of outputs (1: the CPU's fp32
	// tolerances; a backend with fast-math exp may need 10).
	Tol float64
	// SummaryFP8 says that the backend scores fp8 summaries (package
	// kernels/fp8): the score reference is then RefScoreFP8, and the
	// upper bound is checked on those scores as on any others.
	SummaryFP8 bool
	// KVFP8 runs the suite on fp8 K/V records (plan.FP8): fixtures come
	// from NewFixtureFP8 (Quantize is ignored), so the upper bound is
	// checked against exact scores on the dequantized stored keys, and
	// attention against float64 attention over them.
	KVFP8 bool
}

// fixture builds the fixture of a test under the options.
func (o Options) fixture(rng *rand.Rand, s kernels.Shape, lens []int) *Fixture {
	if o.KVFP8 {
		return NewFixtureFP8(rng, s, lens)
	}
	return NewFixtureQ(rng, s, lens, o.Quantize)
}

// Run runs the whole conformance suite with float32 storage.
func Run(t *testing.T, nb NewBackend) { RunWith(t, nb, Options{}) }

// RunWith runs the whole conformance suite with options.
func RunWith(t *testing.T, nb NewBackend, o Options) {
	if o.Tol == 0 {
		o.Tol = 1
	}
	t.Run("Score", func(t *testing.T) { testScore(t, nb, o) })
	t.Run("UpperBound", func(t *testing.T) { testUpperBound(t, nb, o) })
	t.Run("TopK", func(t *testing.T) { testTopK(t, nb) })
	t.Run("AttendSparse", func(t *testing.T) { testAttendSparse(t, nb, o) })
	t.Run("DenseEquivalence", func(t *testing.T) { testDense(t, nb, o) })
	t.Run("ShuffleInvariance", func(t *testing.T) { testShuffle(t, nb, o) })
	t.Run("BadLists", func(t *testing.T) { testBadLists(t, nb) })
	t.Run("Merge", func(t *testing.T) { testMerge(t, nb) })
	t.Run("SplitMerge", func(t *testing.T) { testSplitMerge(t, nb, o) })
	t.Run("Step", func(t *testing.T) { testStep(t, nb, o) })
	t.Run("Rank", func(t *testing.T) { testRank(t, nb, o) })
}

// RoundBF16 rounds x to the nearest bfloat16 (ties to even), as CUDA's
// __float2bfloat16_rn does for finite values.
func RoundBF16(x float32) float32 {
	b := math.Float32bits(x)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b & 0xffff0000)
}

// RoundF16 rounds x to the nearest IEEE half (ties to even), subnormals
// included, as CUDA's __float2half_rn does for values in half's range.
func RoundF16(x float32) float32 {
	a := math.Abs(float64(x))
	if a == 0 || math.IsInf(a, 0) || math.IsNaN(a) {
		return x
	}
	_, e := math.Frexp(a) // a = f * 2^e, f in [0.5, 1)
	e--                   // a in [2^e, 2^(e+1))
	e = max(e, -14)       // subnormal spacing below 2^-14
	ulp := math.Ldexp(1, e-10)
	r := math.RoundToEven(a/ulp) * ulp
	return float32(math.Copysign(r, float64(x)))
}

var shapes = []kernels.Shape{
	{QHeads: 4, KVHeads: 4, HeadDim: 16, PageSize: 16},   // MHA
	{QHeads: 8, KVHeads: 2, HeadDim: 32, PageSize: 16},   // GQA 4
	{QHeads: 6, KVHeads: 1, HeadDim: 8, PageSize: 4},     // MQA, small pages
	{QHeads: 4, KVHeads: 2, HeadDim: 64, PageSize: 1},    // one-token pages
	{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}, // Llama-3-8B heads
}

// tailLens gives sequence lengths covering tail lengths 1, S-1, S, S+1 and
// 15/16/17, plus an empty sequence.
func tailLens(s int) []int {
	return []int{1, 15, 16, 17, max(s-1, 1), s, s + 1, 3*s + 2, 40*s + 5, 0}
}

func relClose(got float32, want, tol float64) bool {
	return math.Abs(float64(got)-want) <= tol*max(1, math.Abs(want))
}

func testScore(t *testing.T, nb NewBackend, o Options) {
	be := nb(t)
	defer be.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range shapes {
		f := o.fixture(rng, s, tailLens(s.PageSize))
		for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			rows := s.Rows(mode)
			out := make([]float32, len(f.Batch.Pages)*rows)
			if err := be.Score(context.Background(), s, f.Layer, &f.Batch, f.Q, mode, out); err != nil {
				t.Fatalf("%+v %v: %v", s, mode, err)
			}
			for seq := range f.Lens {
				np := f.Batch.NumPages(seq)
				off := f.Batch.ScoreOffset(seq, rows)
				for r := range rows {
					for p := range np {
						ref := f.RefScore
						if o.SummaryFP8 {
							ref = f.RefScoreFP8
						}
						var want float64
						if mode == kernels.PerHead {
							want = ref(seq, p, r)
						} else {
							want = math.Inf(-1)
							for h := r * s.Group(); h < (r+1)*s.Group(); h++ {
								want = max(want, ref(seq, p, h))
							}
						}
						if got := out[off+r*np+p]; !relClose(got, want, 1e-5*o.Tol) {
							t.Fatalf("%+v %v seq %d row %d page %d: score %v, want %v", s, mode, seq, r, p, got, want)
						}
					}
				}
			}
		}
	}
}

func testUpperBound(t *testing.T, nb NewBackend, o Options) {
	be := nb(t)
	defer be.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	s := kernels.Shape{QHeads: 4, KVHeads: 2, HeadDim: 32, PageSize: 16}
	for trial := range 20 {
		f := o.fixture(rng, s, []int{rng.IntN(2000) + 1, rng.IntN(300) + 1})
		out := make([]float32, len(f.Batch.Pages)*s.QHeads)
		if err := be.Score(context.Background(), s, f.Layer, &f.Batch, f.Q, kernels.PerHead, out); err != nil {
			t.Fatal(err)
		}
		for seq := range f.Lens {
			np := f.Batch.NumPages(seq)
			for h := range s.QHeads {
				for p := range np {
					u := float64(out[f.Batch.ScoreOffset(seq, s.QHeads)+h*np+p])
					tm := f.RefTrueMax(seq, p, h)
					// fp32 summation error allowance only.
					if tm > u+1e-4*max(1, math.Abs(u)) {
						t.Fatalf("trial %d seq %d head %d page %d: true max %v above bound %v", trial, seq, h, p, tm, u)
					}
				}
			}
		}
	}
}

func testTopK(t *testing.T, nb NewBackend) {
	be := nb(t)
	defer be.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	type row struct {
		n, k, base int
		levels     int // distinct values (small: many ties)
	}
	rows := []row{{1, 1, 0, 10}, {10, 3, 0, 2}, {100, 7, 5, 3}, {1000, 64, 1, 1}, {5000, 100, 0, 1 << 30}, {17, 17, 0, 4}, {9, 20, 2, 4}, {50, 0, 0, 5}, {65536, 255, 0, 1000}}
	var plan kernels.TopKPlan
	var scores []float32
	outOff := 0
	for _, r := range rows {
		plan.Add(len(scores), r.n, r.base, r.k, outOff)
		for range r.n {
			scores = append(scores, float32(rng.IntN(r.levels))*0.25)
		}
		outOff += min(r.k, r.n)
	}
	out := make([]int32, outOff)
	if err := be.TopK(context.Background(), scores, &plan, out); err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		want := RefTopK(scores[plan.ScoreOff[i]:][:r.n], r.k)
		got := out[plan.OutOff[i]:][:len(want)]
		for j := range want {
			if got[j] != want[j]+int32(r.base) {
				t.Fatalf("row %d (n=%d k=%d): got %v, want %v (+%d)", i, r.n, r.k, got[:min(10, len(got))], want[:min(10, len(want))], r.base)
			}
		}
	}
	// BestFirst: the same set, each row ascending or best first.
	plan.BestFirst = true
	best := make([]int32, outOff)
	if err := be.TopK(context.Background(), scores, &plan, best); err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		row := scores[plan.ScoreOff[i]:][:r.n]
		m := min(r.k, r.n)
		asc, got := out[plan.OutOff[i]:][:m], best[plan.OutOff[i]:][:m]
		if !slices.Equal(slices.Sorted(slices.Values(got)), asc) {
			t.Fatalf("row %d (n=%d k=%d): best first set %v, ascending %v", i, r.n, r.k, got[:min(10, m)], asc[:min(10, m)])
		}
		if !slices.IsSorted(got) && !InBestFirstOrder(row, got, int32(r.base)) {
			t.Fatalf("row %d (n=%d k=%d): %v neither ascending nor best first", i, r.n, r.k, got[:min(10, m)])
		}
	}
}

// InBestFirstOrder reports whether pages (base + an index into scores)
// come best first: score descending, ties to the lower page
// (plan.Compare's order).
func InBestFirstOrder(scores []float32, pages []int32, base int32) bool {
	for j := 1; j < len(pages); j++ {
		a, b := scores[pages[j-1]-base], scores[pages[j]-base]
		if a < b || (a == b && pages[j-1] >= pages[j]) {
			return false
		}
	}
	return true
}

// randomLists picks, per row, a random subset of pages in random order.
func randomLists(rng *rand.Rand, f *Fixture, mode kernels.GQAMode, frac float64) *kernels.Lists {
	rows := f.Shape.Rows(mode)
	l := &kernels.Lists{Mode: mode, Indptr: []int32{0}}
	for seq := range f.Lens {
		np := f.Batch.NumPages(seq)
		for range rows {
			for _, p := range rng.Perm(np) {
				if rng.Float64() < frac || p == np-1 {
					l.Pages = append(l.Pages, int32(p))
				}
			}
			l.Indptr = append(l.Indptr, int32(len(l.Pages)))
		}
	}
	return l
}

func checkAttend(t *testing.T, f *Fixture, l *kernels.Lists, o, lse []float32, tol float64) {
	t.Helper()
	s := f.Shape
	rows := s.Rows(l.Mode)
	for seq := range f.Lens {
		for h := range s.QHeads {
			r := h / s.Group()
			if l.Mode == kernels.PerHead {
				r = h
			}
			i := seq*rows + r
			wo, wl := f.RefAttend(seq, h, l.Pages[l.Indptr[i]:l.Indptr[i+1]])
			gl := lse[seq*s.QHeads+h]
			if math.IsInf(wl, -1) {
				if !math.IsInf(float64(gl), -1) {
					t.Fatalf("%+v seq %d head %d: lse %v, want -Inf", s, seq, h, gl)
				}
			} else if !relClose(gl, wl, tol) {
				t.Fatalf("%+v seq %d head %d: lse %v, want %v", s, seq, h, gl, wl)
			}
			for j := range s.HeadDim {
				got := o[(seq*s.QHeads+h)*s.HeadDim+j]
				if math.IsNaN(float64(got)) || math.Abs(float64(got)-wo[j]) > tol*max(1, math.Abs(wo[j])) {
					t.Fatalf("%+v %v seq %d head %d dim %d: o %v, want %v", s, l.Mode, seq, h, j, got, wo[j])
				}
			}
		}
	}
}

func attend(t *testing.T, be kernels.Backend, f *Fixture, l *kernels.Lists) ([]float32, []float32) {
	t.Helper()
	s := f.Shape
	o := make([]float32, len(f.Q))
	lse := make([]float32, len(f.Lens)*s.QHeads)
	if err := be.Attend(context.Background(), s, f.Layer, &f.Batch, f.Q, l, o, lse); err != nil {
		t.Fatalf("%+v: %v", s, err)
	}
	return o, lse
}

func testAttendSparse(t *testing.T, nb NewBackend, opt Options) {
	be := nb(t)
	defer be.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	for _, s := range shapes {
		f := opt.fixture(rng, s, tailLens(s.PageSize))
		for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			for _, frac := range []float64{0, 0.3, 1} {
				l := randomLists(rng, f, mode, frac)
				o, lse := attend(t, be, f, l)
				checkAttend(t, f, l, o, lse, 2e-5*opt.Tol)
			}
		}
	}
}

// DenseLists lists every page of every sequence in logical order.
func DenseLists(f *Fixture, mode kernels.GQAMode) *kernels.Lists {
	rows := f.Shape.Rows(mode)
	l := &kernels.Lists{Mode: mode, Indptr: []int32{0}}
	for seq := range f.Lens {
		for range rows {
			for p := range f.Batch.NumPages(seq) {
				l.Pages = append(l.Pages, int32(p))
			}
			l.Indptr = append(l.Indptr, int32(len(l.Pages)))
		}
	}
	return l
}

// testDense checks attention over every page against dense float64
// attention over all valid tokens (invariant 2).
func testDense(t *testing.T, nb NewBackend, opt Options) {
	be := nb(t)
	defer be.Close()
	rng := rand.New(rand.NewPCG(9, 10))
	for _, s := range shapes {
		f := opt.fixture(rng, s, []int{4096 + 7, 1, s.PageSize})
		for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			l := DenseLists(f, mode)
			o, lse := attend(t, be, f, l)
			checkAttend(t, f, l, o, lse, 1e-5*opt.Tol)
			// Lists of every page given as All (nothing listed) are the
			// same attention, to the bit.
			oa, lsea := attend(t, be, f, &kernels.Lists{Mode: mode, All: true})
			if !slices.Equal(o, oa) || !slices.Equal(lse, lsea) {
				t.Fatalf("%+v %v: lists of every page by All differ from the listed pages", s, mode)
			}
		}
	}
}

// testShuffle permutes the physical placement of pages and the order of the
// lists: outputs must not change beyond fp32 rounding (invariant 3).
func testShuffle(t *testing.T, nb NewBackend, opt Options) {
	be := nb(t)
	defer be.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	s := kernels.Shape{QHeads: 8, KVHeads: 2, HeadDim: 32, PageSize: 16}
	f := opt.fixture(rng, s, []int{1000, 333})
	l := randomLists(rng, f, kernels.GroupMax, 0.5)
	o1, lse1 := attend(t, be, f, l)
	// Move every page to a new physical slot.
	g := *f
	pool := len(f.Layer.Summary) / (s.KVHeads * 2 * s.HeadDim)
	per := s.KVHeads * s.PageSize * s.HeadDim
	perm := rng.Perm(pool)
	g.Layer = kernels.Layer{K: make([]float32, len(f.Layer.K)), V: make([]float32, len(f.Layer.V)), Summary: make([]float32, len(f.Layer.Summary))}
	if f.Layer.FP8() {
		g.Layer = kernels.Layer{Summary: g.Layer.Summary, K8: make([]uint8, len(f.Layer.K8)), V8: make([]uint8, len(f.Layer.V8)),
			KScale: make([]float32, len(f.Layer.KScale)), VScale: make([]float32, len(f.Layer.VScale))}
		g.ref = kernels.Layer{} // the references of f's placement: unused
	}
	rec := s.KVHeads * 2 * s.HeadDim
	for from, to := range perm {
		if f.Layer.FP8() {
			copy(g.Layer.K8[to*per:][:per], f.Layer.K8[from*per:])
			copy(g.Layer.V8[to*per:][:per], f.Layer.V8[from*per:])
			copy(g.Layer.KScale[to*s.KVHeads:][:s.KVHeads], f.Layer.KScale[from*s.KVHeads:])
			copy(g.Layer.VScale[to*s.KVHeads:][:s.KVHeads], f.Layer.VScale[from*s.KVHeads:])
		} else {
			copy(g.Layer.K[to*per:][:per], f.Layer.K[from*per:])
			copy(g.Layer.V[to*per:][:per], f.Layer.V[from*per:])
		}
		copy(g.Layer.Summary[to*rec:][:rec], f.Layer.Summary[from*rec:])
	}
	g.Batch.Pages = make([]int32, len(f.Batch.Pages))
	for i, p := range f.Batch.Pages {
		g.Batch.Pages[i] = int32(perm[p])
	}
	// Reverse each row's list order too.
	l2 := &kernels.Lists{Mode: l.Mode, Indptr: l.Indptr, Pages: slices.Clone(l.Pages)}
	for i := range len(l.Indptr) - 1 {
		slices.Reverse(l2.Pages[l.Indptr[i]:l.Indptr[i+1]])
	}
	o2, lse2 := attend(t, be, &g, l2)
	for i := range o1 {
		if math.Abs(float64(o1[i]-o2[i])) > 1e-6*opt.Tol*max(1, math.Abs(float64(o1[i]))) {
			t.Fatalf("output %d changed under shuffle: %v vs %v", i, o1[i], o2[i])
		}
	}
	for i := range lse1 {
		if math.Abs(float64(lse1[i]-lse2[i])) > 1e-5*opt.Tol {
			t.Fatalf("lse %d changed under shuffle: %v vs %v", i, lse1[i], lse2[i])
		}
	}
}

func testBadLists(t *testing.T, nb NewBackend) {
	be := nb(t)
	defer be.Close()
	rng := rand.New(rand.NewPCG(13, 14))
	s := kernels.Shape{QHeads: 4, KVHeads: 2, HeadDim: 8, PageSize: 4}
	f := NewFixture(rng, s, []int{20})
	o := make([]float32, len(f.Q))
	lse := make([]float32, s.QHeads)
	cases := map[string][]int32{
		"duplicate":    {0, 2, 0},
		"out of range": {0, 5},
		"negative":     {-1},
	}
	for name, pages := range cases {
		l := &kernels.Lists{Mode: kernels.GroupMax, Indptr: []int32{0, int32(len(pages)), int32(len(pages))}, Pages: pages}
		if err := be.Attend(context.Background(), s, f.Layer, &f.Batch, f.Q, l, o, lse); err == nil {
			t.Errorf("%s pages %v: no error", name, pages)
		}
	}
	bad := f.Batch
	bad.Pages = []int32{0, 1, 2, 3, 1 << 20}
	l := DenseLists(f, kernels.GroupMax)
	if err := be.Attend(context.Background(), s, f.Layer, &bad, f.Q, l, o, lse); err == nil {
		t.Error("physical page outside the pool: no error")
	}
}

func testMerge(t *testing.T, nb NewBackend) {
	be := nb(t)
	defer be.Close()
	const d = 4
	inf := float32(math.Inf(-1))
	o := []float32{1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0}
	lse := []float32{0.5, inf, inf}
	o2 := []float32{0, 0, 0, 0, 5, 6, 7, 8, 0, 0, 0, 0}
	lse2 := []float32{inf, 1.5, inf}
	if err := be.Merge(context.Background(), d, o, lse, o2, lse2); err != nil {
		t.Fatal(err)
	}
	want := []float32{1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0}
	if !slices.Equal(o, want) || lse[0] != 0.5 || lse[1] != 1.5 || !math.IsInf(float64(lse[2]), -1) {
		t.Fatalf("merge with empty states: o=%v lse=%v", o, lse)
	}
	// Two real states: lse = log(e^1 + e^2); o weighted by softmax of lse.
	o = []float32{1, 0, 0, 0}
	lse = []float32{1}
	o2 = []float32{0, 1, 0, 0}
	lse2 = []float32{2}
	if err := be.Merge(context.Background(), d, o, lse, o2, lse2); err != nil {
		t.Fatal(err)
	}
	z := math.Exp(1) + math.Exp(2)
	if !relClose(lse[0], math.Log(z), 1e-6) || !relClose(o[0], math.Exp(1)/z, 1e-6) || !relClose(o[1], math.Exp(2)/z, 1e-6) {
		t.Fatalf("merge: o=%v lse=%v", o, lse)
	}
}

// testSplitMerge splits each row's pages into two halves, attends each and
// merges: the result must equal attention over the whole list.
func testSplitMerge(t *testing.T, nb NewBackend, opt Options) {
	be := nb(t)
	defer be.Close()
	rng := rand.New(rand.NewPCG(15, 16))
	s := kernels.Shape{QHeads: 8, KVHeads: 2, HeadDim: 32, PageSize: 16}
	f := opt.fixture(rng, s, []int{777, 40, 1})
	full := randomLists(rng, f, kernels.GroupMax, 0.6)
	a := &kernels.Lists{Mode: full.Mode, Indptr: []int32{0}}
	b := &kernels.Lists{Mode: full.Mode, Indptr: []int32{0}}
	for i := range len(full.Indptr) - 1 {
		row := full.Pages[full.Indptr[i]:full.Indptr[i+1]]
		half := len(row) / 2
		a.Pages = append(a.Pages, row[:half]...)
		b.Pages = append(b.Pages, row[half:]...)
		a.Indptr = append(a.Indptr, int32(len(a.Pages)))
		b.Indptr = append(b.Indptr, int32(len(b.Pages)))
	}
	oa, la := attend(t, be, f, a)
	ob, lb := attend(t, be, f, b)
	if err := be.Merge(context.Background(), s.HeadDim, oa, la, ob, lb); err != nil {
		t.Fatal(err)
	}
	checkAttend(t, f, full, oa, la, 2e-5*opt.Tol)
}
