package kernels

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

// subFixture is a pool of pages with keys, page boxes and c sub-boxes
// each, all built here from the keys (not by the store).
type subFixture struct {
	s     Shape
	c     int
	keys  [][]float32 // physical page -> [KVHeads][PageSize][HeadDim]
	valid []int       // physical page -> valid slots
	l     Layer
	b     Batch
	q     []float32
}

func newSubFixture(rng *rand.Rand, s Shape, c, pages int, needles bool) *subFixture {
	f := &subFixture{s: s, c: c}
	d, rec := s.HeadDim, 2*s.HeadDim
	perm := rng.Perm(pages)
	f.keys = make([][]float32, pages)
	f.valid = make([]int, pages)
	f.l = Layer{SubBoxes: c, Summary: make([]float32, pages*s.KVHeads*rec), Sub: make([]float32, pages*s.KVHeads*c*rec)}
	last := 1 + rng.IntN(s.PageSize)
	for lp, phys := range perm {
		f.valid[phys] = s.PageSize
		if lp == pages-1 {
			f.valid[phys] = last
		}
		k := make([]float32, s.KVHeads*s.PageSize*d)
		for i := range k {
			k[i] = float32(rng.NormFloat64())
		}
		if needles && rng.IntN(3) == 0 {
			tok := rng.IntN(f.valid[phys])
			for kvh := range s.KVHeads {
				for j := range d {
					k[(kvh*s.PageSize+tok)*d+j] *= 8
				}
			}
		}
		f.keys[phys] = k
		for kvh := range s.KVHeads {
			box := f.l.Summary[(phys*s.KVHeads+kvh)*rec:][:rec]
			boxEmpty(box, d)
			for b := range c {
				sub := f.l.Sub[((phys*s.KVHeads+kvh)*c+b)*rec:][:rec]
				boxEmpty(sub, d)
				w := s.PageSize / c
				for tok := b * w; tok < min((b+1)*w, f.valid[phys]); tok++ {
					key := k[(kvh*s.PageSize+tok)*d:][:d]
					boxWiden(sub, key)
					boxWiden(box, key)
				}
			}
		}
		f.b.Pages = append(f.b.Pages, int32(phys))
	}
	f.b.Indptr = []int32{0, int32(pages)}
	f.b.LastLen = []int32{int32(last)}
	f.q = make([]float32, s.QHeads*d)
	for i := range f.q {
		f.q[i] = float32(rng.NormFloat64())
	}
	return f
}

func boxEmpty(r []float32, d int) {
	for j := range d {
		r[j], r[d+j] = float32(math.Inf(1)), float32(math.Inf(-1))
	}
}

func boxWiden(r, k []float32) {
	d := len(k)
	for j, x := range k {
		r[j], r[d+j] = min(r[j], x), max(r[d+j], x)
	}
}

func subScores(t *testing.T, be *CPU, f *subFixture, l Layer, mode GQAMode) []float32 {
	t.Helper()
	out := make([]float32, len(f.b.Pages)*f.s.Rows(mode))
	if err := be.Score(context.Background(), f.s, l, &f.b, f.q, mode, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSubBoxScore checks the multi-box page bound against a float64
// reference: for every page, query head and sub-box, every valid key's
// exact q.k is at most the sub-box's float64 bound (invariant 1 for
// every sub-box), the kernel's float32 page bound is the float64 maximum
// over the non-empty sub-boxes within rounding, never above the single
// box's float32 bound, and group_max rows are the max of their heads'.
func TestSubBoxScore(t *testing.T) {
	be := NewCPU(CPUConfig{Workers: 1, ScoreChunk: 16})
	defer be.Close()
	rng := rand.New(rand.NewPCG(32, 3))
	var tighter, total int
	for iter := range 24 {
		c := []int{2, 4, 8}[iter%3]
		s := Shape{QHeads: 8, KVHeads: 2, HeadDim: 16, PageSize: 16}
		f := newSubFixture(rng, s, c, 1+rng.IntN(60), iter%2 == 0)
		per := subScores(t, be, f, f.l, PerHead)
		grp := subScores(t, be, f, f.l, GroupMax)
		one := f.l
		one.SubBoxes, one.Sub = 0, nil
		flat := subScores(t, be, f, one, PerHead)
		d, g, rec, np := s.HeadDim, s.Group(), 2*s.HeadDim, len(f.b.Pages)
		for lp, phys := range f.b.Pages {
			for kvh := range s.KVHeads {
				best := float32(math.Inf(-1))
				for h := range g {
					qh := f.q[(kvh*g+h)*d:][:d]
					got := per[(kvh*g+h)*np+lp]
					best = max(best, got)
					ref := math.Inf(-1)
					for b := range c {
						sub := f.l.Sub[((int(phys)*s.KVHeads+kvh)*c+b)*rec:][:rec]
						if sub[0] > sub[d] {
							continue
						}
						u := naiveU(qh, sub[:d], sub[d:])
						ref = max(ref, u)
						w := s.PageSize / c
						for tok := b * w; tok < min((b+1)*w, f.valid[phys]); tok++ {
							k := f.keys[phys][(kvh*s.PageSize+tok)*d:][:d]
							var dp float64
							for j, x := range qh {
								dp += float64(x) * float64(k[j])
							}
							if dp > u+1e-12*math.Abs(u) {
								t.Fatalf("iter %d page %d head %d sub-box %d token %d: q.k %v above the sub-box bound %v", iter, lp, h, b, tok, dp, u)
							}
						}
					}
					if math.Abs(float64(got)-ref) > 1e-5*(1+math.Abs(ref)) {
						t.Fatalf("iter %d c %d page %d head %d: float32 bound %v, float64 reference %v", iter, c, lp, h, got, ref)
					}
					if fl := flat[(kvh*g+h)*np+lp]; got > fl {
						t.Fatalf("iter %d c %d page %d head %d: multi-box bound %v above the single box's %v", iter, c, lp, h, got, fl)
					} else if got < fl {
						tighter++
					}
					total++
				}
				if grp[kvh*np+lp] != best {
					t.Fatalf("iter %d page %d KV head %d: group_max %v, max of the heads' %v", iter, lp, kvh, grp[kvh*np+lp], best)
				}
			}
		}
	}
	if tighter == 0 {
		t.Fatalf("no bound of %d got tighter with sub-boxes", total)
	}
	t.Logf("%d of %d bounds tighter than the single box's", tighter, total)
}

// TestSubBoxOneEqualsQuest: one box per page (SubBoxes 0 or 1) reads
// Summary alone, and c sub-boxes that all equal the page box give the
// single box's scores bit for bit, in both GQA modes.
func TestSubBoxOneEqualsQuest(t *testing.T) {
	be := NewCPU(CPUConfig{Workers: 2, ScoreChunk: 8})
	defer be.Close()
	rng := rand.New(rand.NewPCG(32, 4))
	for iter := range 8 {
		s := Shape{QHeads: 8, KVHeads: 2, HeadDim: 16, PageSize: 16}
		f := newSubFixture(rng, s, 4, 1+rng.IntN(60), false)
		for _, mode := range []GQAMode{GroupMax, PerHead} {
			plain := f.l
			plain.SubBoxes, plain.Sub = 0, nil
			want := subScores(t, be, f, plain, mode)
			one := f.l
			one.SubBoxes = 1 // Sub ignored
			same := f.l
			same.Sub = make([]float32, len(f.l.Sub))
			rec := 2 * s.HeadDim
			for ph := range len(f.l.Summary) / rec {
				for b := range 4 {
					copy(same.Sub[(ph*4+b)*rec:][:rec], f.l.Summary[ph*rec:][:rec])
				}
			}
			for name, l := range map[string]Layer{"c1": one, "equal sub-boxes": same} {
				got := subScores(t, be, f, l, mode)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("iter %d %v %s: score %d is %v, plain Quest %v", iter, mode, name, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestSubBoxFP8Bound: emulated fp8 summaries (outward rounding per
// sub-box record) keep every key's exact score under the page bound.
func TestSubBoxFP8Bound(t *testing.T) {
	be := NewCPU(CPUConfig{Workers: 1, SummaryDType: plan.SummaryFP8})
	defer be.Close()
	rng := rand.New(rand.NewPCG(32, 5))
	for iter := range 8 {
		s := Shape{QHeads: 4, KVHeads: 2, HeadDim: 16, PageSize: 16}
		f := newSubFixture(rng, s, 4, 1+rng.IntN(40), true)
		per := subScores(t, be, f, f.l, PerHead)
		d, g, np := s.HeadDim, s.Group(), len(f.b.Pages)
		for lp, phys := range f.b.Pages {
			for kvh := range s.KVHeads {
				for h := range g {
					qh := f.q[(kvh*g+h)*d:][:d]
					for tok := range f.valid[phys] {
						k := f.keys[phys][(kvh*s.PageSize+tok)*d:][:d]
						var dp float64
						for j, x := range qh {
							dp += float64(x) * float64(k[j])
						}
						if u := float64(per[(kvh*g+h)*np+lp]); dp > u+1e-5*(1+math.Abs(u)) {
							t.Fatalf("iter %d page %d head %d token %d: q.k %v above the fp8 multi-box bound %v", iter, lp, h, tok, dp, u)
						}
					}
				}
			}
		}
	}
}

// TestSubBoxBadPool: a sub-box pool that does not match the summary pool
// is refused before anything is written.
func TestSubBoxBadPool(t *testing.T) {
	be := NewCPU(CPUConfig{Workers: 1})
	defer be.Close()
	s := Shape{QHeads: 4, KVHeads: 2, HeadDim: 8, PageSize: 8}
	f := newSubFixture(rand.New(rand.NewPCG(1, 1)), s, 2, 5, false)
	l := f.l
	l.Sub = l.Sub[:len(l.Sub)-1]
	out := make([]float32, len(f.b.Pages)*s.KVHeads)
	for i := range out {
		out[i] = 42
	}
	err := be.Score(context.Background(), s, l, &f.b, f.q, GroupMax, out)
	if err == nil {
		t.Fatal("short sub-box pool accepted")
	}
	for i, x := range out {
		if x != 42 {
			t.Fatalf("output %d written (%v) by a refused call", i, x)
		}
	}
}
