package collective_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
)

// TestStepsOutOfOrder runs many steps of selection and merge back to back
// with no barrier between ranks; rank 1's transport is slow, so the other
// ranks are already sending step t+1 (and later) while rank 1 still
// receives step t. Every rank must get every step's right result.
func TestStepsOutOfOrder(t *testing.T) {
	const n, steps, heads, d = 4, 30, 2, 3
	rng := rand.New(rand.NewPCG(21, 22))
	cases := make([]selectCase, steps)
	sts := make([]states, steps)
	for s := range steps {
		for {
			cases[s] = randomSelectCase(rng, n)
			if len(cases[s].k) == 3 {
				break
			}
		}
		sts[s] = randomStates(rng, n, heads, d, 0.2)
	}
	gs, done := newGroups(n, func(r int, tr collective.Transport) collective.Transport {
		if r == 1 {
			return &collective.Faulty{Transport: tr, Delay: 200 * time.Microsecond}
		}
		return tr
	})
	defer done()
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	type stepOut struct {
		sel    [][]int32
		o, lse []float32
	}
	res := runRanks(n, func(r int) ([]stepOut, error) {
		var out []stepOut
		for s := range steps {
			sel, err := gs[r].SelectExact(ctx, collective.MakeTag(uint64(s), 0, collective.OpSelect), cases[s].local[r], cases[s].k, nil)
			if err != nil {
				return nil, err
			}
			o, l := slices.Clone(sts[s].o[r]), slices.Clone(sts[s].lse[r])
			if err := gs[r].AllReduce(ctx, collective.MakeTag(uint64(s), 0, collective.OpAllReduce), d, o, l); err != nil {
				return nil, err
			}
			out = append(out, stepOut{sel, o, l})
		}
		return out, nil
	})
	for r, o := range res {
		if o.err != nil {
			t.Fatalf("rank %d: %v", r, o.err)
		}
		for s, so := range o.val {
			for row := range cases[s].k {
				if want := cases[s].bruteForce(row); !slices.Equal(so.sel[row], want) && len(want)+len(so.sel[row]) > 0 {
					t.Fatalf("rank %d step %d row %d: %v, want %v", r, s, row, so.sel[row], want)
				}
			}
			checkMerged(t, "allreduce", sts[s], so.o, so.lse)
			if !bitsEqual(so.o, res[0].val[s].o) {
				t.Fatalf("rank %d step %d: merged state differs from rank 0's", r, s)
			}
		}
	}
}

// TestAbort: a rank that fails outside an operation aborts the next one;
// its peers fail promptly with ErrAborted naming it.
func TestAbort(t *testing.T) {
	const n, heads, d = 3, 2, 2
	gs, done := newGroups(n, nil)
	defer done()
	ctx, cancel := context.WithTimeout(bg(), promptDeadline)
	defer cancel()
	st := randomStates(rand.New(rand.NewPCG(1, 2)), n, heads, d, 0)
	res := runRanks(n, func(r int) (struct{}, error) {
		if r == 2 {
			return struct{}{}, collective.Abort(ctx, gs[r].Transport(), 5, errors.New("attention failed"))
		}
		return struct{}{}, gs[r].AllReduce(ctx, 5, d, st.o[r], st.lse[r])
	})
	if res[2].err != nil {
		t.Fatalf("abort: %v", res[2].err)
	}
	for r := range 2 {
		var re *collective.RankError
		if !errors.Is(res[r].err, collective.ErrAborted) || !errors.As(res[r].err, &re) {
			t.Fatalf("rank %d: %v, want ErrAborted in a RankError", r, res[r].err)
		}
		if res[r].elapsed >= promptBound {
			t.Errorf("rank %d took %v, want < %v: the abort must end it before the %v deadline", r, res[r].elapsed, promptBound, promptDeadline)
		}
	}
	// The root names rank 2; rank 1 learns it from the root's abort.
	var re *collective.RankError
	errors.As(res[0].err, &re)
	if re.Rank != 2 {
		t.Errorf("root's error names rank %d, want 2: %v", re.Rank, res[0].err)
	}
}

func TestAllGather(t *testing.T) {
	const n = 5
	gs, done := newGroups(n, nil)
	defer done()
	for step := range 3 {
		res := runRanks(n, func(r int) ([][]byte, error) {
			msg := make([]byte, r+step) // rank 0 sends an empty message at step 0
			for i := range msg {
				msg[i] = byte(r)
			}
			return gs[r].AllGather(bg(), uint64(step), msg)
		})
		for r, o := range res {
			if o.err != nil {
				t.Fatal(o.err)
			}
			for p, m := range o.val {
				if len(m) != p+step || slices.ContainsFunc(m, func(b byte) bool { return b != byte(p) }) {
					t.Errorf("step %d rank %d: message of rank %d = %v", step, r, p, m)
				}
			}
		}
	}
	// Ops on one tag must match: a gather frame is not a select frame.
	ctx, cancel := context.WithTimeout(bg(), promptDeadline)
	defer cancel()
	g2, done2 := newGroups(2, nil)
	defer done2()
	res := runRanks(2, func(r int) (any, error) {
		if r == 0 {
			return g2[0].AllGather(ctx, 9, []byte("x"))
		}
		return g2[1].SelectExact(ctx, 9, nil, nil, nil)
	})
	for r, o := range res {
		if !errors.Is(o.err, collective.ErrBadMessage) {
			t.Errorf("rank %d with mismatched ops: %v, want ErrBadMessage", r, o.err)
		}
	}
}
