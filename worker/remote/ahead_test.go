package remote

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// owed returns the number of calls sent ahead on cs whose answers no
// one read yet.
func owed(cs *callStream) int {
	cs.lock <- struct{}{}
	defer func() { <-cs.lock }()
	return len(cs.owed)
}

// TestBeginAhead runs decode steps through an engine as a node's
// coordinator has it (CP 2: rank 0 on this node through its local
// connection, rank 1 on another node over gRPC), whose BeginStep to the
// other node goes ahead of the first layer on the kept Calls stream,
// next to an in-process engine of the same config (every output equal).
// The other node refuses a step (its rank has no free page for the new
// token's copy-on-write tail): the first Layer reports the refusal
// (decode.ErrBeginRefused and pagestore.ErrPoolExhausted, the in-process
// engine's Begin refusal in its message, not ErrStepFailed), no length
// changed in either engine, and the next good step runs, equal in both.
func TestBeginAhead(t *testing.T) {
	nodes := startNodes(t, 2, DefaultServerConfig())
	c := engineConfig(2, 1, plan.Exact)
	c.CapacityPages = 2
	ref, err := engine.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ref.Close() })
	rem, clients := openRemote(t, c, []NodeRanks{
		{Conn: nodes[0].srv.LocalConn(nodes[0].conn), Ranks: []worker.Rank{{CP: 0}}},
		{Conn: nodes[1].conn, Ranks: []worker.Rank{{CP: 1}}},
	}, "ahead")
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(24, 1))
	w := &twin{t: t, c: c, ref: ref, rem: rem, rng: rng, identical: true}
	a := w.create(plan.Striped)
	w.fill(a, 12) // pages 0 and 2 on rank 0 (full), page 1 on rank 1

	// step runs one token of id through every layer on e and returns
	// the outputs, or the first error (Begin's, or the first layer's).
	step := func(e *engine.Engine, id engine.SeqID, q, kv [][]float32, ahead bool) ([][]float32, error) {
		t.Helper()
		st, err := e.Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: id, New: true}}})
		if err != nil {
			return nil, err
		}
		defer func() {
			if err := st.End(ctx); err != nil {
				t.Errorf("end: %v", err)
			}
		}()
		if got := owed(clients[1].calls); e == rem && got != map[bool]int{true: 1}[ahead] {
			t.Fatalf("after Begin, %d answers owed on the other node's stream; want %d", got, map[bool]int{true: 1}[ahead])
		}
		var out [][]float32
		for l := range c.Layers {
			var res decode.Result
			if err := st.Layer(ctx, l, decode.Host(q[l]), decode.Host(kv[l]), decode.Host(kv[l]), &res); err != nil {
				if l > 0 {
					t.Fatalf("layer %d: %v", l, err)
				}
				return nil, err
			}
			out = append(out, append([]float32(nil), res.O.Data...))
		}
		return out, nil
	}
	token := func() (q, kv [][]float32) {
		for range c.Layers {
			q = append(q, randVec(rng, c.QRow()))
			kv = append(kv, randVec(rng, c.KVRow()))
		}
		return q, kv
	}
	both := func(id engine.SeqID, ahead bool) {
		t.Helper()
		q, kv := token()
		want, err := step(ref, id, q, kv, false)
		if err != nil {
			t.Fatalf("in process: %v", err)
		}
		got, err := step(rem, id, q, kv, ahead)
		if err != nil {
			t.Fatalf("through the other node: %v", err)
		}
		for l := range want {
			w.same("o", want[l], got[l])
		}
	}
	// The first step opens the Calls stream (a round trip); the next
	// ones send BeginStep ahead.
	both(a, false) // token 12: page 3 on rank 1, which is full now
	w.sameLen(a)
	b := w.fork(a) // shares the tail page 3
	// b's token goes into page 3: rank 1 must copy it and has no page.
	q, kv := token()
	_, want := step(ref, b, q, kv, false)
	if !errors.Is(want, pagestore.ErrPoolExhausted) {
		t.Fatalf("in process: %v, want the pool exhausted", want)
	}
	_, got := step(rem, b, q, kv, true)
	switch {
	case !errors.Is(got, decode.ErrBeginRefused) || errors.Is(got, decode.ErrStepFailed):
		t.Fatalf("through the other node: %v, want decode.ErrBeginRefused without ErrStepFailed", got)
	case !errors.Is(got, pagestore.ErrPoolExhausted):
		t.Fatalf("through the other node: %v, want the pool exhausted", got)
	}
	// The worker's words, as in process (after "begin step at layer 0: ").
	_, why, _ := strings.Cut(want.Error(), "begin step at layer 0: ")
	if why == "" || !strings.Contains(got.Error(), why) {
		t.Errorf("through the other node: %q\ndoes not say what in process said: %q", got, why)
	}
	t.Logf("in process: %v\nthrough the other node: %v", want, got)
	w.sameLen(a, b)
	// The next good step: b released, a's tail is its own again.
	w.release(b)
	both(a, true)
	both(a, true)
	w.sameLen(a)
}
