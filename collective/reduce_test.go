package collective_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
)

var negInf = float32(math.Inf(-1))

// states is one partial state per rank: o [heads][d], lse [heads].
type states struct {
	d      int
	o, lse [][]float32
}

// randomStates draws states where each head is empty (-Inf) with
// probability pEmpty; an empty head's o holds garbage (NaN included), which
// the merge must ignore.
func randomStates(rng *rand.Rand, n, heads, d int, pEmpty float64) states {
	s := states{d: d, o: make([][]float32, n), lse: make([][]float32, n)}
	for r := range n {
		s.o[r] = make([]float32, heads*d)
		s.lse[r] = make([]float32, heads)
		for h := range heads {
			if rng.Float64() < pEmpty {
				s.lse[r][h] = negInf
				for j := range d {
					s.o[r][h*d+j] = float32(math.NaN())
				}
				continue
			}
			s.lse[r][h] = float32(rng.Float64()*20 - 10)
			for j := range d {
				s.o[r][h*d+j] = float32(rng.Float64()*2 - 1)
			}
		}
	}
	return s
}

func (s states) clone() states {
	c := states{d: s.d}
	for r := range s.o {
		c.o = append(c.o, slices.Clone(s.o[r]))
		c.lse = append(c.lse, slices.Clone(s.lse[r]))
	}
	return c
}

// reference merges all ranks' states in float64: softmax weights
// exp(lse_r - max) over non-empty states.
func (s states) reference() (o []float64, lse []float64) {
	heads := len(s.lse[0])
	o = make([]float64, heads*s.d)
	lse = make([]float64, heads)
	for h := range heads {
		m := math.Inf(-1)
		for r := range s.lse {
			m = max(m, float64(s.lse[r][h]))
		}
		if math.IsInf(m, -1) {
			lse[h] = m
			continue
		}
		sum := 0.0
		for r := range s.lse {
			if l := float64(s.lse[r][h]); !math.IsInf(l, -1) {
				w := math.Exp(l - m)
				sum += w
				for j := range s.d {
					o[h*s.d+j] += w * float64(s.o[r][h*s.d+j])
				}
			}
		}
		for j := range s.d {
			o[h*s.d+j] /= sum
		}
		lse[h] = m + math.Log(sum)
	}
	return o, lse
}

func checkMerged(t *testing.T, what string, s states, o, lse []float32) {
	t.Helper()
	ro, rl := s.reference()
	for h := range rl {
		if math.IsInf(rl[h], -1) {
			if !math.IsInf(float64(lse[h]), -1) {
				t.Fatalf("%s: head %d lse = %v, want -Inf", what, h, lse[h])
			}
			for j := range s.d {
				if o[h*s.d+j] != 0 {
					t.Fatalf("%s: empty head %d o[%d] = %v, want 0", what, h, j, o[h*s.d+j])
				}
			}
			continue
		}
		if d := math.Abs(float64(lse[h]) - rl[h]); d > 1e-5*max(1, math.Abs(rl[h])) {
			t.Fatalf("%s: head %d lse = %v, want %v", what, h, lse[h], rl[h])
		}
		for j := range s.d {
			got, want := float64(o[h*s.d+j]), ro[h*s.d+j]
			if math.IsNaN(got) || math.Abs(got-want) > 1e-5*max(1, math.Abs(want)) {
				t.Fatalf("%s: head %d o[%d] = %v, want %v", what, h, j, got, want)
			}
		}
	}
}

func TestReduceMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		n, heads, d := 1+trial%8, 1+rng.IntN(6), 1+rng.IntN(9)
		pEmpty := []float64{0, 0.3, 0.8, 1}[trial%4]
		s := randomStates(rng, n, heads, d, pEmpty)
		in := s.clone()
		root := rng.IntN(n)
		gs, done := newGroups(n, nil)
		res := runRanks(n, func(r int) (struct{}, error) {
			return struct{}{}, gs[r].Reduce(bg(), uint64(trial), root, d, s.o[r], s.lse[r])
		})
		done()
		for r, o := range res {
			if o.err != nil {
				t.Fatalf("trial %d rank %d: %v", trial, r, o.err)
			}
			if r != root && (!slices.Equal(s.lse[r], in.lse[r]) || !bitsEqual(s.o[r], in.o[r])) {
				t.Fatalf("trial %d: Reduce changed non-root rank %d's state", trial, r)
			}
		}
		checkMerged(t, "reduce", in, s.o[root], s.lse[root])
	}
}

func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func TestReduceRankOrder(t *testing.T) {
	// The root's result does not depend on which rank is root or on
	// arrival order: it is the rank-order fold, bit for bit.
	rng := rand.New(rand.NewPCG(5, 6))
	const n, heads, d = 5, 4, 8
	s := randomStates(rng, n, heads, d, 0.2)
	var first []float32
	for root := range n {
		c := s.clone()
		gs, done := newGroups(n, func(r int, tr collective.Transport) collective.Transport {
			// Later ranks send first.
			return &collective.Faulty{Transport: tr, Delay: time.Duration(n-r) * time.Millisecond}
		})
		res := runRanks(n, func(r int) (struct{}, error) {
			return struct{}{}, gs[r].Reduce(bg(), 1, root, d, c.o[r], c.lse[r])
		})
		done()
		for _, o := range res {
			if o.err != nil {
				t.Fatal(o.err)
			}
		}
		got := append(slices.Clone(c.o[root]), c.lse[root]...)
		if first == nil {
			first = got
		} else if !bitsEqual(got, first) {
			t.Fatalf("root %d: result differs from root 0's", root)
		}
	}
}

func TestAllReduceBitIdentical(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 100 {
		n, heads, d := 1+trial%8, 1+rng.IntN(6), 1+rng.IntN(9)
		s := randomStates(rng, n, heads, d, []float64{0, 0.3, 1}[trial%3])
		in := s.clone()
		ref := s.clone()
		gs, done := newGroups(n, nil)
		res := runRanks(n, func(r int) (struct{}, error) {
			return struct{}{}, gs[r].AllReduce(bg(), 2*uint64(trial), d, s.o[r], s.lse[r])
		})
		for _, o := range res {
			if o.err != nil {
				t.Fatal(o.err)
			}
		}
		res = runRanks(n, func(r int) (struct{}, error) {
			return struct{}{}, gs[r].Reduce(bg(), 2*uint64(trial)+1, 0, d, ref.o[r], ref.lse[r])
		})
		done()
		for _, o := range res {
			if o.err != nil {
				t.Fatal(o.err)
			}
		}
		checkMerged(t, "allreduce", in, s.o[0], s.lse[0])
		for r := range n {
			if !bitsEqual(s.o[r], ref.o[0]) || !bitsEqual(s.lse[r], ref.lse[0]) {
				t.Fatalf("trial %d: rank %d's AllReduce result differs from Reduce's at root 0", trial, r)
			}
		}
	}
}

func TestReduceAllEmpty(t *testing.T) {
	const n, heads, d = 4, 3, 5
	for _, op := range []string{"reduce", "allreduce"} {
		s := randomStates(rand.New(rand.NewPCG(1, 1)), n, heads, d, 1)
		gs, done := newGroups(n, nil)
		res := runRanks(n, func(r int) (struct{}, error) {
			if op == "reduce" {
				return struct{}{}, gs[r].Reduce(bg(), 1, 0, d, s.o[r], s.lse[r])
			}
			return struct{}{}, gs[r].AllReduce(bg(), 1, d, s.o[r], s.lse[r])
		})
		done()
		for r, o := range res {
			if o.err != nil {
				t.Fatal(o.err)
			}
			if op == "reduce" && r != 0 {
				continue
			}
			for h := range heads {
				if !math.IsInf(float64(s.lse[r][h]), -1) {
					t.Errorf("%s rank %d: lse[%d] = %v, want -Inf", op, r, h, s.lse[r][h])
				}
			}
			for j, x := range s.o[r] {
				if x != 0 {
					t.Fatalf("%s rank %d: o[%d] = %v, want 0", op, r, j, x)
				}
			}
		}
	}
}

func TestReduceEmptyIsIdentity(t *testing.T) {
	// One rank holds a state, the others are empty: the result is that
	// state, bit for bit.
	rng := rand.New(rand.NewPCG(9, 9))
	const n, heads, d = 6, 4, 16
	for holder := range n {
		s := randomStates(rng, n, heads, d, 1)
		full := randomStates(rng, 1, heads, d, 0)
		copy(s.o[holder], full.o[0])
		copy(s.lse[holder], full.lse[0])
		gs, done := newGroups(n, nil)
		res := runRanks(n, func(r int) (struct{}, error) {
			return struct{}{}, gs[r].AllReduce(bg(), 1, d, s.o[r], s.lse[r])
		})
		done()
		for r, o := range res {
			if o.err != nil {
				t.Fatal(o.err)
			}
			if !bitsEqual(s.o[r], full.o[0]) || !bitsEqual(s.lse[r], full.lse[0]) {
				t.Fatalf("holder %d: rank %d's result is not the holder's state", holder, r)
			}
		}
	}
}

func TestReduceErrors(t *testing.T) {
	const n, heads, d = 3, 2, 4
	ok := func() ([]float32, []float32) { return make([]float32, heads*d), make([]float32, heads) }
	tests := []struct {
		name  string
		state func(r int) (int, []float32, []float32)
		root  int
		want  error // of every rank that errors (nil: any)
	}{
		{"nan lse at a non-root", func(r int) (int, []float32, []float32) {
			o, l := ok()
			if r == 1 {
				l[1] = float32(math.NaN())
			}
			return d, o, l
		}, 0, nil},
		{"+inf lse at the root", func(r int) (int, []float32, []float32) {
			o, l := ok()
			if r == 0 {
				l[0] = float32(math.Inf(1))
			}
			return d, o, l
		}, 0, nil},
		{"shape differs", func(r int) (int, []float32, []float32) {
			if r == 2 {
				return d, make([]float32, (heads+1)*d), make([]float32, heads+1)
			}
			o, l := ok()
			return d, o, l
		}, 1, collective.ErrBadMessage},
		{"o and lse disagree", func(r int) (int, []float32, []float32) {
			o, l := ok()
			if r == 2 {
				return d, o[:d], l
			}
			return d, o, l
		}, 0, nil},
		{"bad root", func(r int) (int, []float32, []float32) { o, l := ok(); return d, o, l }, 5, collective.ErrBadRank},
	}
	for _, tc := range tests {
		for _, all := range []bool{false, true} {
			name := tc.name + map[bool]string{false: "/reduce", true: "/allreduce"}[all]
			if all && tc.root != 0 && tc.root < n {
				continue
			}
			t.Run(name, func(t *testing.T) {
				gs, done := newGroups(n, nil)
				defer done()
				ctx, cancel := context.WithTimeout(bg(), promptDeadline)
				defer cancel()
				res := runRanks(n, func(r int) ([]float32, error) {
					d, o, l := tc.state(r)
					if all && tc.root < n {
						return l, gs[r].AllReduce(ctx, 7, d, o, l)
					}
					return l, gs[r].Reduce(ctx, 7, tc.root, d, o, l)
				})
				root := min(tc.root, n-1)
				if all {
					root = 0
				}
				for r, o := range res {
					// Every rank that waits for a message fails (the root,
					// and with allreduce everyone); a non-root of Reduce with
					// good input may have succeeded.
					mustFail := r == root || all || tc.root >= n
					if mustFail && o.err == nil {
						t.Errorf("rank %d succeeded", r)
					}
					if o.err != nil && tc.want != nil && !errors.Is(o.err, tc.want) && !errors.Is(o.err, collective.ErrAborted) {
						t.Errorf("rank %d: %v, want %v", r, o.err, tc.want)
					}
					if o.elapsed >= promptBound {
						t.Errorf("rank %d took %v, want < %v: bad input must fail the others before the %v deadline", r, o.elapsed, promptBound, promptDeadline)
					}
					if r == root && o.err != nil && slices.ContainsFunc(o.val, func(x float32) bool { return x != 0 && !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }) {
						t.Errorf("root's lse changed on failure: %v", o.val)
					}
				}
			})
		}
	}
}
