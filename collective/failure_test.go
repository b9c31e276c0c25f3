package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/questrt/questrt/collective"
)

const (
	failN = 4
	// failDeadline is the deadline of the cases whose peers must wait for
	// it (a dead link, a hung rank): short, so that the suite is quick.
	failDeadline = 200 * time.Millisecond
	// failSlack bounds how late after failDeadline such a rank may return.
	// It only has to tell "returned once its deadline passed" from "hung"
	// (a call that ignored ctx, or waited on something with no bound of
	// its own, such as an undetached abort to a blocked peer), so it is
	// many times the deadline and cannot be reached by scheduling delays
	// on a loaded machine. A watchdog closes the transports at this bound,
	// so a hang fails the case instead of the whole test binary.
	failSlack = 5 * time.Second
)

// failOp is one collective operation with fixed inputs. run performs it on
// rank r with fresh copies of the inputs and returns the rank's output
// (the selection, or its o and lse after the call) and its input.
type failOp struct {
	name string
	root int // the rank every other depends on (-1: all-to-all)
	run  func(ctx context.Context, g *collective.Group, tag uint64, r int) (out, in any, err error)
}

func failOps() []failOp {
	rng := rand.New(rand.NewPCG(11, 12))
	sc := randomSelectCase(rng, failN)
	const heads, d = 3, 4
	st := randomStates(rng, failN, heads, d, 0)
	state := func(r int) ([]float32, []float32) { return slices.Clone(st.o[r]), slices.Clone(st.lse[r]) }
	pack := func(o, l []float32) []float32 { return append(slices.Clone(o), l...) }
	return []failOp{
		{"select", -1, func(ctx context.Context, g *collective.Group, tag uint64, r int) (any, any, error) {
			out, err := g.SelectExact(ctx, tag, sc.local[r], sc.k, nil)
			return out, [][]int32(nil), err
		}},
		{"reduce", 0, func(ctx context.Context, g *collective.Group, tag uint64, r int) (any, any, error) {
			o, l := state(r)
			in := pack(o, l)
			err := g.Reduce(ctx, tag, 0, d, o, l)
			return pack(o, l), in, err
		}},
		{"allreduce", 0, func(ctx context.Context, g *collective.Group, tag uint64, r int) (any, any, error) {
			o, l := state(r)
			in := pack(o, l)
			err := g.AllReduce(ctx, tag, d, o, l)
			return pack(o, l), in, err
		}},
	}
}

func sameOutput(a, b any) bool {
	if fa, ok := a.([]float32); ok {
		fb, ok := b.([]float32)
		return ok && bitsEqual(fa, fb)
	}
	return reflect.DeepEqual(a, b)
}

type failCase struct {
	name  string
	fault func(tr collective.Transport) collective.Transport // wraps the faulty rank
	// closeAt closes the faulty rank's transport: <0 before the call, >0
	// after that long, 0 never.
	closeAt time.Duration
	prompt  bool // peers must fail promptly, not at the deadline
	// mustFail returns the ranks that must fail when rank f is faulty in
	// op, or skip=true when the fault does not apply to op at f.
	mustFail func(op failOp, f int) (ranks []int, skip bool)
}

func all(int) []int { return []int{0, 1, 2, 3} }

func except(xs ...int) []int {
	var out []int
	for r := range failN {
		if !slices.Contains(xs, r) {
			out = append(out, r)
		}
	}
	return out
}

func faulty(cfg *collective.Faulty) func(collective.Transport) collective.Transport {
	return func(tr collective.Transport) collective.Transport {
		f := &collective.Faulty{Transport: tr, FailSend: cfg.FailSend, FailRecv: cfg.FailRecv,
			Sticky: cfg.Sticky, Delay: cfg.Delay, BlockFrom: cfg.BlockFrom}
		return f
	}
}

func failCases() []failCase {
	next := func(f int) int { return (f + 1) % failN }
	return []failCase{
		{"closed before", nil, -1, true, func(op failOp, f int) ([]int, bool) {
			if op.root >= 0 && f != op.root && op.name == "reduce" {
				return []int{op.root, f}, false
			}
			return all(f), false
		}},
		// The faulty rank's first call sits in a delay far longer than any
		// scheduling delay until the close 10ms in, so the close always
		// lands inside the operation (before the rank's first message).
		{"closed during", faulty(&collective.Faulty{Delay: time.Hour}), 10 * time.Millisecond, true,
			func(op failOp, f int) ([]int, bool) {
				switch {
				case op.name == "reduce" && f == op.root:
					return []int{f}, false // the others' states were already sent
				case op.name == "reduce":
					return []int{op.root, f}, false
				}
				return all(f), false
			}},
		{"fail 1st send", faulty(&collective.Faulty{FailSend: 1}), 0, true, func(op failOp, f int) ([]int, bool) {
			switch {
			case op.name == "reduce" && f == op.root:
				return nil, true // the root of Reduce only receives
			case op.name == "reduce":
				return []int{op.root, f}, false
			}
			return all(f), false
		}},
		{"fail 2nd send", faulty(&collective.Faulty{FailSend: 2}), 0, true, func(op failOp, f int) ([]int, bool) {
			// The first peer got f's message and may complete; the rest
			// are told by f's abort.
			if op.name == "select" || (op.name == "allreduce" && f == op.root) {
				return except(next(f)), false
			}
			return nil, true
		}},
		{"fail 1st recv", faulty(&collective.Faulty{FailRecv: 1}), 0, true, func(op failOp, f int) ([]int, bool) {
			switch {
			case op.name == "reduce" && f != op.root:
				return nil, true // non-roots of Reduce only send
			case op.name == "allreduce" && f == op.root:
				return all(f), false // the root aborts the broadcast
			}
			return []int{f}, false // f had sent everything already
		}},
		{"dead link", faulty(&collective.Faulty{FailSend: 1, Sticky: true}), 0, false, func(op failOp, f int) ([]int, bool) {
			// f cannot even send its abort: peers wait for their deadline.
			switch {
			case op.name == "reduce" && f == op.root:
				return nil, true
			case op.name == "reduce":
				return []int{op.root, f}, false
			}
			return all(f), false
		}},
		{"blocks", faulty(&collective.Faulty{BlockFrom: 1}), 0, false, func(op failOp, f int) ([]int, bool) {
			if op.name == "reduce" {
				if f == op.root {
					return []int{f}, false
				}
				return []int{op.root, f}, false
			}
			return all(f), false
		}},
		{"blocks mid-operation", faulty(&collective.Faulty{BlockFrom: 2}), 0, false, func(op failOp, f int) ([]int, bool) {
			switch {
			case op.name == "select":
				return except(next(f)), false
			case op.name == "allreduce" && f != op.root:
				return []int{f}, false // sent to the root, blocks receiving
			case op.name == "allreduce":
				return except(next(f)), false // root broadcast once, then blocks
			case f == op.root:
				return []int{f}, false // reduce root blocks on its 2nd recv
			}
			return nil, true // a reduce non-root makes one call
		}},
	}
}

func TestFailures(t *testing.T) {
	ops := failOps()
	// Healthy outputs per op and rank.
	want := map[string][]any{}
	for _, op := range ops {
		gs, done := newGroups(failN, nil)
		res := runRanks(failN, func(r int) (any, error) {
			out, _, err := op.run(bg(), gs[r], 1, r)
			return out, err
		})
		done()
		for r, o := range res {
			if o.err != nil {
				t.Fatalf("healthy %s rank %d: %v", op.name, r, o.err)
			}
			want[op.name] = append(want[op.name], o.val)
		}
	}
	for _, fc := range failCases() {
		for _, op := range ops {
			for _, f := range []int{0, 2} {
				mustFail, skip := fc.mustFail(op, f)
				if skip {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/rank%d", fc.name, op.name, f), func(t *testing.T) {
					runFailCase(t, fc, op, f, mustFail, want[op.name])
				})
			}
		}
	}
	goleak.VerifyNone(t)
}

func runFailCase(t *testing.T, fc failCase, op failOp, f int, mustFail []int, want []any) {
	trs := collective.NewInprocGroup(failN)
	if fc.fault != nil {
		trs[f] = fc.fault(trs[f])
	}
	gs := make([]*collective.Group, failN)
	for r := range failN {
		gs[r] = collective.NewGroup(trs[r])
	}
	defer func() {
		for _, tr := range trs {
			tr.Close()
		}
	}()
	if fc.closeAt < 0 {
		trs[f].Close()
	} else if fc.closeAt > 0 {
		timer := time.AfterFunc(fc.closeAt, func() { trs[f].Close() })
		defer timer.Stop()
	}
	// A failure that peers are told about (abort, closed peer) must end
	// their call well before the deadline: such cases get a deadline no
	// loaded machine reaches and must finish in under half of it
	// (promptBound), which proves it was not the deadline that ended them.
	// The others wait for a short deadline and must return once it passes.
	deadline, bound := failDeadline, failDeadline+failSlack
	if fc.prompt {
		deadline, bound = promptDeadline, promptBound
	}
	ctx, cancel := context.WithTimeout(bg(), deadline)
	defer cancel()
	watchdog := time.AfterFunc(bound, func() {
		for _, tr := range trs {
			tr.Close()
		}
	})
	defer watchdog.Stop()
	type res struct{ out, in any }
	outs := runRanks(failN, func(r int) (res, error) {
		out, in, err := op.run(ctx, gs[r], 2, r)
		return res{out, in}, err
	})
	if !watchdog.Stop() {
		t.Errorf("ranks still running after %v: the watchdog closed the transports", bound)
	}
	for r, o := range outs {
		if slices.Contains(mustFail, r) && o.err == nil {
			t.Errorf("rank %d succeeded, want an error", r)
		}
		if o.err == nil {
			if !sameOutput(o.val.out, want[r]) {
				t.Errorf("rank %d succeeded with a wrong result %v, want %v", r, o.val.out, want[r])
			}
		} else if !sameOutput(o.val.out, o.val.in) {
			t.Errorf("rank %d failed (%v) but changed its output: %v", r, o.err, o.val.out)
		}
		if o.elapsed >= bound {
			t.Errorf("rank %d returned after %v (%v), want < %v (deadline %v)", r, o.elapsed, o.err, bound, deadline)
		}
		if r != f && o.err != nil {
			var re *collective.RankError
			if !errors.As(o.err, &re) && !errors.Is(o.err, context.DeadlineExceeded) {
				t.Errorf("rank %d: %v is neither a RankError nor a deadline", r, o.err)
			}
			if fc.prompt && !errors.Is(o.err, collective.ErrAborted) && !errors.Is(o.err, collective.ErrPeerClosed) {
				t.Errorf("rank %d: %v, want ErrAborted or ErrPeerClosed", r, o.err)
			}
		}
	}
	// A fresh group works afterwards.
	gs2, done := newGroups(failN, nil)
	defer done()
	for r, o := range runRanks(failN, func(r int) (any, error) {
		out, _, err := op.run(bg(), gs2[r], 3, r)
		return out, err
	}) {
		if o.err != nil || !sameOutput(o.val, want[r]) {
			t.Errorf("fresh group rank %d: %v, %v", r, o.val, o.err)
		}
	}
}
