package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestLocalEqualsSingleShard drives two CP ranks through the Worker
// interface only (create, check, append, begin, layer with new tokens,
// end, rollback) and compares every layer's merged output with a single
// shard holding every page: the ranks on two workers or on one, exact
// and replicated selection, a step over both layers (dense then sparse),
// rollbacks that cut a page (the mirrors take the owner's rescanned
// summaries), a fork with copy-on-write tails and a release.
func TestLocalEqualsSingleShard(t *testing.T) {
	for _, mode := range []Mode{Exact, Replicated} {
		for _, split := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v_split%v", mode, split), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, uint64(mode)))
				g := newGrid(t, testConfig(mode), split)
				g.create(1, plan.Striped)
				g.create(2, plan.Contiguous)
				g.appendAll(rng, 1, 300)
				g.appendAll(rng, 2, 17)
				ids, budgets := []uint64{1, 2}, []int{64, 0}
				g.stepAndCompare(rng, ids, budgets, 0, 2, true)
				g.stepAndCompare(rng, ids, budgets, 1, 1, false)
				g.rollback(1, 20) // 281 tokens: page 17 is cut
				g.rollback(2, 2)
				g.stepAndCompare(rng, ids, budgets, 0, 2, true)
				g.appendAll(rng, 1, 40)
				g.stepAndCompare(rng, ids, []int{32, 16}, 1, 1, false)
				g.fork(1, 3) // copy-on-write tails on both ranks
				g.stepAndCompare(rng, []uint64{3, 1}, []int{48, 48}, 0, 2, true)
				g.rollback(3, 7)
				g.stepAndCompare(rng, []uint64{1, 3, 2}, []int{48, 48, 16}, 1, 1, false)
				g.release(1)
				g.stepAndCompare(rng, []uint64{3, 2}, []int{64, 0}, 0, 2, true)
			})
		}
	}
}

// snapshot is what a refused message must leave unchanged: every rank's
// layer lengths and used pages.
func (g *grid) snapshot(ids ...uint64) []int {
	var out []int
	for _, w := range g.workers {
		l := w.(*Local)
		for _, r := range l.Ranks() {
			out = append(out, l.Shard(r).Store().Stats().UsedPages)
			for _, id := range ids {
				sid, err := l.StoreSeq(id, r)
				g.must(err)
				for layer := range g.cfg.Layers {
					n, err := l.Shard(r).Store().LayerLen(sid, layer)
					g.must(err)
					out = append(out, n)
				}
			}
		}
	}
	return out
}

// TestBadMessages: messages with an unknown sequence, wrong shapes or
// lengths, a layer out of range, a step out of order or a rank the worker
// does not host are refused with the matching error and change no
// sequence; a refused Layer fails its step, which ends cleanly (no mail
// left behind), and the next step runs as if nothing happened.
func TestBadMessages(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	cfg := testConfig(Exact)
	g := newGrid(t, cfg, true)
	g.create(1, plan.Striped)
	g.appendAll(rng, 1, 100)
	ctx := context.Background()
	a, b := g.workers[0], g.workers[1] // cp 0, cp 1
	tok := cfg.KVHeads * cfg.HeadDim
	kv := randVec(rng, 4*tok)
	nan := randVec(rng, tok)
	nan[3] = float32(math.NaN())
	qd := cfg.QHeads * cfg.HeadDim
	q := randVec(rng, qd)
	before := g.snapshot(1)
	seqs := []StepSeq{{Seq: 1, Len: 100}}
	// begin opens step s on both workers.
	begin := func(s uint64) {
		t.Helper()
		for _, w := range g.workers {
			g.must(w.BeginStep(ctx, BeginRequest{Step: s, Layer: 1, Seqs: seqs}))
		}
	}
	end := func(s uint64) {
		t.Helper()
		for _, w := range g.workers {
			g.must(w.EndStep(ctx, EndRequest{Step: s, Failed: true, Layers: []int{1}}))
		}
	}
	rank0 := func(mod func(*RankInput)) LayerRequest {
		in := RankInput{Rank: Rank{CP: 0}, Q: q}
		if mod != nil {
			mod(&in)
		}
		return LayerRequest{Step: 5, Layer: 1, Ranks: []RankInput{in}}
	}
	layerA := func(m LayerRequest) error { return a.Layer(ctx, m, &LayerReply{}) }
	cases := []struct {
		name string
		want error
		do   func() error
	}{
		{"create existing", ErrBadMessage, func() error {
			return a.Create(ctx, CreateRequest{Seq: 1, Layout: plan.Layout{CP: 2, TP: 1}})
		}},
		{"create wrong layout", ErrBadMessage, func() error {
			return a.Create(ctx, CreateRequest{Seq: 9, Layout: plan.Layout{CP: 3, TP: 1}})
		}},
		{"append unknown seq", ErrUnknownSequence, func() error {
			return a.Append(ctx, AppendRequest{Seq: 9, Rank: Rank{}, Start: 0, Tokens: 1, K: kv[:tok], V: kv[:tok]})
		}},
		{"append rank not hosted", ErrNotHosted, func() error {
			return a.Append(ctx, AppendRequest{Seq: 1, Rank: Rank{CP: 1}, Start: 100, Tokens: 1})
		}},
		{"append rank outside the grid", ErrNotHosted, func() error {
			return a.Append(ctx, AppendRequest{Seq: 1, Rank: Rank{TP: 1}, Start: 100, Tokens: 1})
		}},
		{"append wrong shape", ErrBadMessage, func() error {
			// Position 100 is on page 6, rank 0's: one token wants one k.
			return a.Append(ctx, AppendRequest{Seq: 1, Rank: Rank{}, Start: 100, Tokens: 1, K: kv[:2*tok], V: kv[:2*tok]})
		}},
		{"append layer out of range", ErrBadMessage, func() error {
			return a.Append(ctx, AppendRequest{Seq: 1, Rank: Rank{}, Layer: 2, Start: 100, Tokens: 1, K: kv[:tok], V: kv[:tok]})
		}},
		{"append wrong start", ErrBadMessage, func() error {
			return a.Append(ctx, AppendRequest{Seq: 1, Rank: Rank{}, Start: 96, Tokens: 1, K: kv[:tok], V: kv[:tok]})
		}},
		{"append NaN", ErrBadMessage, func() error {
			return a.Append(ctx, AppendRequest{Seq: 1, Rank: Rank{}, Start: 100, Tokens: 1, K: nan, V: kv[:tok]})
		}},
		{"append mirror keys without mirrors", ErrBadMessage, func() error {
			return a.Append(ctx, AppendRequest{Seq: 1, Rank: Rank{}, Start: 100, Tokens: 1, K: kv[:tok], V: kv[:tok], MirrorK: kv[:tok]})
		}},
		{"check unknown seq", ErrUnknownSequence, func() error {
			return a.Check(ctx, CheckRequest{Seq: 9, Len: 100, Drop: 1})
		}},
		{"check drop past the start", ErrBadMessage, func() error {
			return a.Check(ctx, CheckRequest{Seq: 1, Len: 100, Drop: 101})
		}},
		{"check wrong length", ErrBadMessage, func() error {
			return b.Check(ctx, CheckRequest{Seq: 1, Len: 90, Drop: 1})
		}},
		{"rollback nothing", ErrBadMessage, func() error {
			_, err := b.Rollback(ctx, RollbackRequest{Seq: 1, Rank: Rank{CP: 1}, Len: 100, Drop: 0})
			return err
		}},
		{"rollback rank not hosted", ErrNotHosted, func() error {
			_, err := b.Rollback(ctx, RollbackRequest{Seq: 1, Rank: Rank{CP: 0}, Len: 100, Drop: 5})
			return err
		}},
		{"fork unknown parent", ErrUnknownSequence, func() error { return a.Fork(ctx, ForkRequest{Parent: 9, Child: 10}) }},
		{"release unknown", ErrUnknownSequence, func() error { return a.Release(ctx, ReleaseRequest{Seq: 9}) }},
		{"begin unknown seq", ErrUnknownSequence, func() error {
			return a.BeginStep(ctx, BeginRequest{Step: 1, Seqs: []StepSeq{{Seq: 9, Len: 1}}})
		}},
		{"begin budget below a page", ErrBadMessage, func() error {
			return a.BeginStep(ctx, BeginRequest{Step: 1, Seqs: []StepSeq{{Seq: 1, Len: 100, Budget: 3}}})
		}},
		{"begin wrong length", ErrBadMessage, func() error {
			return a.BeginStep(ctx, BeginRequest{Step: 1, Seqs: []StepSeq{{Seq: 1, Len: 99}}})
		}},
		{"begin layer out of range", ErrBadMessage, func() error {
			return a.BeginStep(ctx, BeginRequest{Step: 1, Layer: -1, Seqs: seqs})
		}},
		{"begin duplicate", ErrBadMessage, func() error {
			return a.BeginStep(ctx, BeginRequest{Step: 1, Seqs: []StepSeq{{Seq: 1, Len: 100}, {Seq: 1, Len: 100}}})
		}},
		{"layer without a step", ErrStep, func() error { return layerA(rank0(nil)) }},
		{"end without a step", ErrStep, func() error { return a.EndStep(ctx, EndRequest{Step: 5}) }},
		{"begin twice", ErrStepOpen, func() error {
			begin(5)
			return a.BeginStep(ctx, BeginRequest{Step: 6, Layer: 1, Seqs: seqs})
		}},
		{"append during the step", ErrStepOpen, func() error {
			return a.Append(ctx, AppendRequest{Seq: 1, Rank: Rank{}, Start: 100, Tokens: 1, K: kv[:tok], V: kv[:tok]})
		}},
		{"release during the step", ErrStepOpen, func() error { return a.Release(ctx, ReleaseRequest{Seq: 1}) }},
		{"layer step id mismatch", ErrStep, func() error {
			m := rank0(nil)
			m.Step = 6
			return layerA(m)
		}},
		{"layer out of range", ErrBadMessage, func() error {
			m := rank0(nil)
			m.Layer = 2
			return layerA(m)
		}},
		{"layer before the step's first", ErrStep, func() error {
			m := rank0(nil)
			m.Layer = 0
			return layerA(m)
		}},
		// The rest take (step 5, layer 1): the step fails.
		{"layer rank not hosted", ErrNotHosted, func() error {
			return layerA(rank0(func(in *RankInput) { in.Rank = Rank{CP: 1} }))
		}},
		{"layer after a failure", ErrStep, func() error {
			defer end(5)
			return layerA(rank0(nil))
		}},
		{"begin an old step id", ErrStep, func() error {
			return a.BeginStep(ctx, BeginRequest{Step: 5, Layer: 1, Seqs: seqs})
		}},
		{"layer wrong query shape", ErrBadMessage, func() error {
			begin(6)
			defer end(6)
			m := rank0(func(in *RankInput) { in.Q = q[:qd-1] })
			m.Step = 6
			return layerA(m)
		}},
		{"layer unexpected new token", ErrBadMessage, func() error {
			begin(7)
			defer end(7)
			m := rank0(func(in *RankInput) { in.K, in.V = kv[:tok], kv[:tok] })
			m.Step = 7
			return layerA(m)
		}},
	}
	for _, c := range cases {
		err := c.do()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		}
		if after := g.snapshot(1); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("%s: state %v, was %v", c.name, after, before)
		}
	}
	if err := a.Check(ctx, CheckRequest{Seq: 1, Layer: 0, Len: 100, Append: 10 * cfg.Capacity * cfg.PageSize}); !errors.Is(err, pagestore.ErrPoolExhausted) {
		t.Errorf("check an append over the pool: %v", err)
	}
	g.step = 7
	g.stepAndCompare(rng, []uint64{1}, []int{32}, 1, 1, false)
	g.stepAndCompare(rng, []uint64{1}, []int{32}, 0, 2, true)
	for r, tr := range g.trs {
		if n := tr.(interface{ Pending() int }).Pending(); n != 0 {
			t.Errorf("rank %d: %d messages left buffered after the refused steps", r, n)
		}
	}
}

// TestHostBytesCountsPinnedTier: a device-resident rank that offloads
// pins a host tier of every page, which HostBytes (and so the memory
// checks of NewLocal and the worker server) must count (found by review).
func TestHostBytesCountsPinnedTier(t *testing.T) {
	c := DefaultConfig()
	c.DeviceResident = true
	plain, err := c.HostBytes(1)
	if err != nil {
		t.Fatal(err)
	}
	c.DeviceBudgetPages = c.Capacity / 4
	off, err := c.HostBytes(2)
	if err != nil {
		t.Fatal(err)
	}
	st := c.Store()
	tier := int64(st.Capacity) * int64(st.PayloadBytes())
	if off != 2*(plain+tier) {
		t.Fatalf("HostBytes(2) with offload = %d, want 2 x (%d metadata + %d pinned tier)", off, plain, tier)
	}
}
