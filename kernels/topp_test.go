package kernels_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/questrt/questrt/kernels"
)

// refTopP is the naive float64 top-p: probabilities normalised over all
// tokens (summed in input order), tokens ranked by descending logit then
// ascending position, the shortest prefix whose probability reaches p.
// It returns the kept positions' order indices and the masses of the
// prefix and of the prefix without its last token.
func refTopP(toks []kernels.TopPToken, p float64) (order []int, n int, mass, before float64) {
	order = make([]int, len(toks))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		x, y := toks[order[a]], toks[order[b]]
		if x.Logit != y.Logit {
			return x.Logit > y.Logit
		}
		return x.Pos < y.Pos
	})
	m := math.Inf(-1)
	for _, t := range toks {
		m = math.Max(m, float64(t.Logit))
	}
	var z float64
	for _, t := range toks {
		z += math.Exp(float64(t.Logit) - m)
	}
	for _, i := range order {
		before = mass
		mass += math.Exp(float64(toks[i].Logit)-m) / z
		n++
		if mass >= p {
			break
		}
	}
	return order, n, mass, before
}

// TestTopPSelectReference: the cut keeps exactly the shortest prefix in
// (logit desc, position asc) order whose float64 mass reaches p, ties
// included, on random logits with many equal values.
func TestTopPSelectReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 32))
	for c := range 3000 {
		n := 1 + rng.IntN(200)
		toks := make([]kernels.TopPToken, n)
		spread := []float64{0.5, 3, 12}[c%3]
		for i := range toks {
			lg := float32(rng.NormFloat64() * spread)
			if c%2 == 0 {
				lg = float32(math.Round(float64(lg)*2) / 2) // ties
			}
			toks[i] = kernels.TopPToken{Logit: lg, Pos: int32(rng.IntN(1 << 20))}
		}
		// Distinct positions (a sequence's positions are).
		seen := map[int32]bool{}
		for i := range toks {
			for seen[toks[i].Pos] {
				toks[i].Pos++
			}
			seen[toks[i].Pos] = true
		}
		p := []float64{0.5, 0.9, 0.95, 0.99, 1, rng.Float64()}[c%6]
		if p == 0 {
			p = 0.5
		}
		order, want, mass, before := refTopP(toks, p)
		orig := append([]kernels.TopPToken(nil), toks...)
		cut, got := kernels.TopPSelect(toks, p)
		if got != want {
			// Only a prefix mass within rounding of p may tip over.
			if math.Abs(mass-p) > 1e-12 && math.Abs(before-p) > 1e-12 {
				t.Fatalf("case %d (n %d, p %v): kept %d, reference %d (mass %v, without the last %v)", c, n, p, got, want, mass, before)
			}
			continue
		}
		if mass < p-1e-12 || before >= p+1e-12 {
			t.Fatalf("case %d: reference prefix of %d has mass %v (without the last %v) for p %v", c, want, mass, before, p)
		}
		for rank, i := range order {
			if k := cut.Keeps(orig[i].Logit, orig[i].Pos); k != (rank < want) {
				t.Fatalf("case %d (p %v): token %+v at rank %d of %d kept %v by cut %+v", c, p, orig[i], rank, want, k, cut)
			}
		}
	}
	if _, n := kernels.TopPSelect(nil, 0.9); n != 0 {
		t.Errorf("no tokens: kept %d", n)
	}
	if c := kernels.TopPKeepAll; !c.Keeps(float32(math.Inf(-1)), math.MaxInt32) || !c.Keeps(-3e38, 0) {
		t.Error("TopPKeepAll drops a token")
	}
}

// topPCase is a random pool and a batch with random page lists.
type topPCase struct {
	s     kernels.Shape
	l     kernels.Layer
	b     kernels.Batch
	lists kernels.Lists
	glob  []int32 // global page of each list entry (here: the logical page)
	q     []float32
}

func newTopPCase(rng *rand.Rand, mode kernels.GQAMode) *topPCase {
	s := kernels.Shape{QHeads: 8, KVHeads: 2, HeadDim: 16, PageSize: 4}
	c := &topPCase{s: s}
	seqs := 1 + rng.IntN(3)
	pool := 40
	c.l.K = make([]float32, pool*s.KVHeads*s.PageSize*s.HeadDim)
	c.l.V = make([]float32, len(c.l.K))
	c.l.Summary = make([]float32, pool*s.KVHeads*2*s.HeadDim)
	for i := range c.l.K {
		c.l.K[i] = float32(rng.NormFloat64())
		c.l.V[i] = float32(rng.NormFloat64())
	}
	perm := rng.Perm(pool)
	c.b.Indptr = []int32{0}
	rows := s.Rows(mode)
	c.lists = kernels.Lists{Mode: mode, Indptr: []int32{0}}
	for i := range seqs {
		np := 1 + rng.IntN(10)
		c.b.Pages = append(c.b.Pages, intsTo32(perm[:np])...)
		perm = perm[np:]
		c.b.Indptr = append(c.b.Indptr, int32(len(c.b.Pages)))
		c.b.LastLen = append(c.b.LastLen, int32(1+rng.IntN(s.PageSize)))
		_ = i
		for range rows {
			for _, lp := range rng.Perm(np)[:1+rng.IntN(np)] {
				c.lists.Pages = append(c.lists.Pages, int32(lp))
				c.glob = append(c.glob, int32(lp))
			}
			c.lists.Indptr = append(c.lists.Indptr, int32(len(c.lists.Pages)))
		}
	}
	c.q = make([]float32, seqs*s.QHeads*s.HeadDim)
	for i := range c.q {
		c.q[i] = float32(rng.NormFloat64() * 1.5)
	}
	return c
}

func intsTo32(x []int) []int32 {
	out := make([]int32, len(x))
	for i, v := range x {
		out[i] = int32(v)
	}
	return out
}

// TestAttendTopPReference: TopPLogits equals the float64 logits, and
// AttendTopP equals float64 attention over the union of the row's query
// heads' kept sets (each chosen by the naive reference), normalised over
// it; each head keeps at least p of its mass; p = 1 equals Attend bit
// for bit.
func TestAttendTopPReference(t *testing.T) {
	ctx := context.Background()
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2, AttendChunk: 2})
	defer cpu.Close()
	rng := rand.New(rand.NewPCG(3, 32))
	for c := range 120 {
		mode := []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[c%2]
		p := []float64{0.5, 0.9, 0.99, 1}[c%4]
		tc := newTopPCase(rng, mode)
		s := tc.s
		d, sz := s.HeadDim, s.PageSize
		heads := s.Group()
		if mode == kernels.PerHead {
			heads = 1
		}
		lg := make([]float32, len(tc.lists.Pages)*heads*sz)
		if err := cpu.TopPLogits(ctx, s, tc.l, &tc.b, tc.q, &tc.lists, lg); err != nil {
			t.Fatal(err)
		}
		rows := s.Rows(mode)
		nseq := tc.b.Len()
		cuts := make([]kernels.TopPCut, nseq*s.QHeads)
		// keptRef[row] is the set of (list entry, slot) read by the row.
		type slot struct{ i, j int }
		keptRef := make([]map[slot]bool, nseq*rows)
		for row := range nseq * rows {
			seq, r := row/rows, row%rows
			kvh, h0 := r, r*heads
			if mode == kernels.PerHead {
				kvh, h0 = r/s.Group(), r
			}
			keptRef[row] = map[slot]bool{}
			np := tc.b.NumPages(seq)
			for h := range heads {
				qh := tc.q[(seq*s.QHeads+h0+h)*d:][:d]
				var toks []kernels.TopPToken
				var where []slot
				for i := tc.lists.Indptr[row]; i < tc.lists.Indptr[row+1]; i++ {
					lp := int(tc.lists.Pages[i])
					nt := sz
					if lp == np-1 {
						nt = int(tc.b.LastLen[seq])
					}
					phys := int(tc.b.Pages[int(tc.b.Indptr[seq])+lp])
					for j := range sz {
						got := lg[(int(i)*heads+h)*sz+j]
						if j >= nt {
							if !math.IsInf(float64(got), -1) {
								t.Fatalf("case %d: padding slot %d logit %v", c, j, got)
							}
							continue
						}
						k := tc.l.K[((phys*s.KVHeads+kvh)*sz+j)*d:][:d]
						var want float64
						for x := range d {
							want += float64(qh[x]) * float64(k[x])
						}
						want /= math.Sqrt(float64(d))
						if math.Abs(float64(got)-want) > 1e-5*(1+math.Abs(want)) {
							t.Fatalf("case %d: logit %v, float64 %v", c, got, want)
						}
						toks = append(toks, kernels.TopPToken{Logit: got, Pos: tc.glob[i]*int32(sz) + int32(j)})
						where = append(where, slot{int(i), j})
					}
				}
				order, n, _, _ := refTopP(toks, p)
				for _, o := range order[:n] {
					keptRef[row][where[o]] = true
				}
				cuts[seq*s.QHeads+h0+h], _ = kernels.TopPSelect(append([]kernels.TopPToken(nil), toks...), p)
			}
		}
		o := make([]float32, nseq*s.QHeads*d)
		lse := make([]float32, nseq*s.QHeads)
		keep := &kernels.TopPKeep{Global: tc.glob, Cuts: cuts}
		if err := cpu.AttendTopP(ctx, s, tc.l, &tc.b, tc.q, &tc.lists, keep, o, lse); err != nil {
			t.Fatal(err)
		}
		if p == 1 {
			o2 := make([]float32, len(o))
			lse2 := make([]float32, len(lse))
			if err := cpu.Attend(ctx, s, tc.l, &tc.b, tc.q, &tc.lists, o2, lse2); err != nil {
				t.Fatal(err)
			}
			for i := range o {
				if math.Float32bits(o[i]) != math.Float32bits(o2[i]) {
					t.Fatalf("case %d: p = 1 differs from Attend at %d: %v vs %v", c, i, o[i], o2[i])
				}
			}
		}
		// Float64 attention over the kept union, and each head's mass.
		for row := range nseq * rows {
			seq, r := row/rows, row%rows
			kvh, h0 := r, r*heads
			if mode == kernels.PerHead {
				kvh, h0 = r/s.Group(), r
			}
			for h := range heads {
				var ws, ps []float64
				var vs [][]float32
				var all []float64
				for i := tc.lists.Indptr[row]; i < tc.lists.Indptr[row+1]; i++ {
					phys := int(tc.b.Pages[int(tc.b.Indptr[seq])+int(tc.lists.Pages[i])])
					for j := range sz {
						x := float64(lg[(int(i)*heads+h)*sz+j])
						if math.IsInf(x, -1) {
							continue
						}
						all = append(all, x)
						if keptRef[row][slot{int(i), j}] {
							ws = append(ws, x)
							vs = append(vs, tc.l.V[((phys*s.KVHeads+kvh)*sz+j)*d:][:d])
						}
					}
				}
				m := math.Inf(-1)
				for _, x := range all {
					m = math.Max(m, x)
				}
				var z, zk float64
				for _, x := range all {
					z += math.Exp(x - m)
				}
				for _, x := range ws {
					e := math.Exp(x - m)
					zk += e
					ps = append(ps, e)
				}
				if zk/z < p-1e-9 {
					t.Fatalf("case %d row %d head %d: kept mass %v < p %v", c, row, h, zk/z, p)
				}
				wantLSE := m + math.Log(zk)
				gotLSE := float64(lse[seq*s.QHeads+h0+h])
				if math.Abs(gotLSE-wantLSE) > 1e-5*(1+math.Abs(wantLSE)) {
					t.Fatalf("case %d row %d head %d: lse %v, float64 %v", c, row, h, gotLSE, wantLSE)
				}
				for x := range d {
					var want float64
					for k, e := range ps {
						want += e / zk * float64(vs[k][x])
					}
					got := float64(o[(seq*s.QHeads+h0+h)*d+x])
					if math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
						t.Fatalf("case %d row %d head %d dim %d: o %v, float64 %v (kept %d of %d)", c, row, h, x, got, want, len(ws), len(all))
					}
				}
			}
		}
	}
}

// TestAttendTopPBadInput: mismatched keep arrays and All lists are
// refused.
func TestAttendTopPBadInput(t *testing.T) {
	ctx := context.Background()
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	tc := newTopPCase(rand.New(rand.NewPCG(1, 1)), kernels.GroupMax)
	o := make([]float32, tc.b.Len()*tc.s.QHeads*tc.s.HeadDim)
	lse := make([]float32, tc.b.Len()*tc.s.QHeads)
	short := &kernels.TopPKeep{Global: tc.glob[1:], Cuts: make([]kernels.TopPCut, tc.b.Len()*tc.s.QHeads)}
	if err := cpu.AttendTopP(ctx, tc.s, tc.l, &tc.b, tc.q, &tc.lists, short, o, lse); err == nil {
		t.Error("short Global accepted")
	}
	all := kernels.Lists{Mode: kernels.GroupMax, All: true}
	if err := cpu.TopPLogits(ctx, tc.s, tc.l, &tc.b, tc.q, &all, nil); err == nil {
		t.Error("All lists accepted by TopPLogits")
	}
}
