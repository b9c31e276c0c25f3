package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair is an engine and a single-shard reference fed the same data.
type pair struct {
	t   *testing.T
	e   *Engine
	ref *shard.Shard
	be  kernels.Backend
	ids map[SeqID]pagestore.SeqID
}

func newPair(t *testing.T, cfg Config) *pair {
	t.Helper()
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2, AttendChunk: 4, ScoreChunk: 8})
	t.Cleanup(func() { be.Close() })
	if cfg.Backend == nil && cfg.Backends == nil {
		cfg.Backend = be
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ref, err := shard.New(shard.Config{
		Store: pagestore.Config{
			Geometry: plan.Geometry{QHeads: cfg.QHeads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, PageSize: cfg.PageSize, DType: plan.Float32},
			Layers:   cfg.Layers,
			Capacity: cfg.CapacityPages * cfg.CP,
		},

		Policy: cfg.Policy,
	}, be)
	if err != nil {
		t.Fatal(err)
	}
	return &pair{t: t, e: e, ref: ref, be: be, ids: map[SeqID]pagestore.SeqID{}}
}

func (p *pair) create(pl plan.Placement) SeqID {
	id, err := p.e.Create(pl)
	if err != nil {
		p.t.Fatal(err)
	}
	p.ids[id] = p.ref.Store().Create()
	return id
}

func (p *pair) append(rng *rand.Rand, id SeqID, n int) {
	c := p.e.Config()
	for l := range c.Layers {
		k := randVec(rng, n*c.KVHeads*c.HeadDim)
		v := randVec(rng, n*c.KVHeads*c.HeadDim)
		if err := p.e.Append(id, l, k, v); err != nil {
			p.t.Fatal(err)
		}
		if err := p.ref.Append(p.ids[id], l, k, v); err != nil {
			p.t.Fatal(err)
		}
	}
}

// newEngine builds an engine for a test and closes it when the test ends.
func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// compare runs one step on both with diagnostics and checks invariant 8:
// the same selected pages per head and outputs within fp32 tolerance.
func (p *pair) compare(rng *rand.Rand, layer int, seqs []SeqID, budgets []int, exactSel bool) {
	p.t.Helper()
	c := p.e.Config()
	var reqs []Request
	var refReqs []shard.SeqStep
	for i, id := range seqs {
		q := randVec(rng, c.QHeads*c.HeadDim)
		for j := range q {
			q[j] *= 2
		}
		reqs = append(reqs, Request{Seq: id, Q: q, BudgetTokens: budgets[i]})
		refReqs = append(refReqs, shard.SeqStep{Seq: p.ids[id], Q: q, BudgetTokens: budgets[i]})
	}
	var got Result
	if err := p.e.Step(context.Background(), layer, reqs, StepOptions{Diagnostics: true}, &got); err != nil {
		p.t.Fatal(err)
	}
	var want shard.StepResult
	if err := p.ref.Step(context.Background(), layer, refReqs, shard.StepOptions{Diagnostics: true}, &want); err != nil {
		p.t.Fatal(err)
	}
	for i := range seqs {
		if got.Plans[i] != want.Plans[i] {
			p.t.Fatalf("seq %d: plan %+v, single shard %+v", i, got.Plans[i], want.Plans[i])
		}
		for h := range c.QHeads {
			gs, ws := got.Diag[i].Selected[h], want.Diag[i].Selected[h]
			if exactSel && !slices.Equal(gs, ws) {
				p.t.Fatalf("seq %d head %d: selected %v, single shard %v", i, h, gs, ws)
			}
			if got.Diag[i].Scores != nil && want.Diag[i].Scores != nil && !slices.Equal(got.Diag[i].Scores[h], want.Diag[i].Scores[h]) {
				p.t.Fatalf("seq %d head %d: scores differ from the single shard", i, h)
			}
		}
	}
	if !exactSel {
		return
	}
	for j := range want.O {
		if math.Abs(float64(got.O[j]-want.O[j])) > 2e-5*max(1, math.Abs(float64(want.O[j]))) {
			p.t.Fatalf("output %d: %v, single shard %v", j, got.O[j], want.O[j])
		}
	}
	for j := range want.LSE {
		if math.Abs(float64(got.LSE[j]-want.LSE[j])) > 2e-5*max(1, math.Abs(float64(want.LSE[j]))) {
			p.t.Fatalf("lse %d: %v, single shard %v", j, got.LSE[j], want.LSE[j])
		}
	}
	for i := range seqs {
		if math.Abs(got.Diag[i].MassRecall-want.Diag[i].MassRecall) > 1e-4 || math.Abs(got.Diag[i].RelL2-want.Diag[i].RelL2) > 1e-4 {
			p.t.Fatalf("seq %d diagnostics: mass %v / %v, rel L2 %v / %v", i, got.Diag[i].MassRecall, want.Diag[i].MassRecall, got.Diag[i].RelL2, want.Diag[i].RelL2)
		}
		gh, wh := got.Diag[i].HeadMassRecall, want.Diag[i].HeadMassRecall
		if len(gh) != len(wh) || len(wh) != len(got.Diag[i].Selected) {
			p.t.Fatalf("seq %d: %d / %d per-head mass recalls for %d heads", i, len(gh), len(wh), len(got.Diag[i].Selected))
		}
		var mean float64
		for h := range wh {
			mean += gh[h] / float64(len(gh))
			if math.Abs(gh[h]-wh[h]) > 1e-4 || got.Diag[i].HeadRecall[h] != want.Diag[i].HeadRecall[h] {
				p.t.Fatalf("seq %d head %d: mass %v / %v, recall %v / %v", i, h, gh[h], wh[h], got.Diag[i].HeadRecall[h], want.Diag[i].HeadRecall[h])
			}
		}
		if math.Abs(mean-got.Diag[i].MassRecall) > 1e-9 {
			p.t.Fatalf("seq %d: per-head mass recalls average %v, MassRecall %v", i, mean, got.Diag[i].MassRecall)
		}
	}
}

// TestDistributedEqualsSingleShard is invariant 8 as a property over random
// layouts: cp in 1..8, tp dividing the KV heads, both placements, both GQA
// modes, exact and replicated selection, tail lengths 1/15/16/17 and random
// lengths and budgets (some covering the whole sequence).
func TestDistributedEqualsSingleShard(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	trials := 24
	if testing.Short() {
		trials = 8
	}
	for trial := range trials {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 8, 4, 16, 16
		cfg.CP = 1 + rng.IntN(8)
		cfg.TP = []int{1, 2, 4}[rng.IntN(3)]
		cfg.CapacityPages = 200
		cfg.BlockPages = 1 + rng.IntN(4)
		cfg.Selection = []Selection{Exact, Replicated}[rng.IntN(2)]
		cfg.Policy.PageSize = 16
		cfg.Policy.DenseLayers = 1
		cfg.Policy.SinkPages = rng.IntN(2)
		cfg.Policy.GQA = []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[rng.IntN(2)]
		name := fmt.Sprintf("trial%d_cp%d_tp%d_%v_%v_block%d_sink%d", trial, cfg.CP, cfg.TP, cfg.Selection, cfg.Policy.GQA, cfg.BlockPages, cfg.Policy.SinkPages)
		t.Run(name, func(t *testing.T) {
			p := newPair(t, cfg)
			lens := []int{1, 15, 16, 17, 1 + rng.IntN(700), 200 + rng.IntN(500)}
			var seqs []SeqID
			var budgets []int
			for _, n := range lens {
				id := p.create([]plan.Placement{plan.Striped, plan.Contiguous}[rng.IntN(2)])
				p.append(rng, id, n)
				seqs = append(seqs, id)
				budgets = append(budgets, []int{16, 32, 64, 160, 4096}[rng.IntN(5)])
			}
			for layer := range cfg.Layers {
				p.compare(rng, layer, seqs, budgets, true)
			}
		})
	}
}

// TestUnionSelection: union keeps each rank's local top ceil(K'/N), reads
// at most N*ceil(K'/N) ranked pages, and equals exact with one rank.
func TestUnionSelection(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, cp := range []int{1, 3} {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim = 1, 4, 2, 16
		cfg.CP, cfg.CapacityPages, cfg.Selection = cp, 100, Union
		cfg.Policy.DenseLayers = 0
		p := newPair(t, cfg)
		id := p.create(plan.Striped)
		p.append(rng, id, 900)
		p.compare(rng, 0, []SeqID{id}, []int{160}, cp == 1)
		var res Result
		q := randVec(rng, 4*16)
		if err := p.e.Step(context.Background(), 0, []Request{{Seq: id, Q: q, BudgetTokens: 160}}, StepOptions{Diagnostics: true}, &res); err != nil {
			t.Fatal(err)
		}
		pl := res.Plans[0]
		limit := pl.Sink + pl.Local + cp*plan.UnionQuota(pl.Rank, cp)
		for h, sel := range res.Diag[0].Selected {
			if len(sel) > limit || len(sel) < pl.Local+pl.Rank {
				t.Fatalf("cp %d head %d: %d pages read, want between %d and %d", cp, h, len(sel), pl.Local+pl.Rank, limit)
			}
		}
	}
}

// TestEdgeLayouts: a rank with no pages at all (sequence shorter than the
// CP degree), ranks with no selected pages (tiny budget), and a budget
// larger than the sequence (dense equivalence across shards).
func TestEdgeLayouts(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim = 1, 4, 2, 16
	cfg.CP, cfg.TP, cfg.CapacityPages = 6, 2, 64
	cfg.Policy.DenseLayers = 0
	p := newPair(t, cfg)
	short := p.create(plan.Striped) // 2 pages over 6 ranks
	p.append(rng, short, 20)
	long := p.create(plan.Contiguous) // 64 block: everything on rank 0
	p.append(rng, long, 300)
	mid := p.create(plan.Striped)
	p.append(rng, mid, 500)
	p.compare(rng, 0, []SeqID{short, long, mid}, []int{16, 32, 1 << 16}, true)
	var res Result
	q := randVec(rng, 4*16)
	if err := p.e.Step(context.Background(), 0, []Request{{Seq: mid, Q: q, BudgetTokens: 1 << 16}}, StepOptions{Diagnostics: true}, &res); err != nil {
		t.Fatal(err)
	}
	if dg := res.Diag[0]; !res.Plans[0].Dense || dg.RelL2 > 1e-5 || math.Abs(dg.MassRecall-1) > 1e-5 {
		t.Fatalf("full budget: plan %+v, rel L2 %v, mass %v", res.Plans[0], dg.RelL2, dg.MassRecall)
	}
}

// TestForkRollbackSharded: fork, diverge, roll back inside and across pages;
// every shard stays consistent with a single-shard reference doing the
// same operations, also when the shards keep their pages in (pretend)
// device memory only.
func TestForkRollbackSharded(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		sel    Selection
		device bool
	}{{Exact, false}, {Replicated, false}, {Exact, true}, {Replicated, true}} {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim = 2, 4, 2, 16
		cfg.CP, cfg.TP, cfg.CapacityPages, cfg.Selection = 3, 2, 100, tc.sel
		cfg.Policy.DenseLayers = 0
		if tc.device {
			cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
			t.Cleanup(func() { cpu.Close() })
			cfg.Backend, cfg.DeviceResident = backendtest.FakeDevice{CPU: cpu}, true
		}
		p := newPair(t, cfg)
		parent := p.create(plan.Striped)
		p.append(rng, parent, 333)
		child, err := p.e.Fork(parent)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := p.ref.Store().Fork(p.ids[parent])
		if err != nil {
			t.Fatal(err)
		}
		p.ids[child] = rc
		p.append(rng, child, 40)
		p.append(rng, parent, 7)
		for _, n := range []int{5, 30, 16} {
			if err := p.e.Rollback(child, n); err != nil {
				t.Fatal(err)
			}
			if err := p.ref.Store().Rollback(p.ids[child], n); err != nil {
				t.Fatal(err)
			}
			p.compare(rng, 1, []SeqID{parent, child}, []int{64, 48}, true)
		}
		p.append(rng, child, 21)
		p.compare(rng, 0, []SeqID{parent, child}, []int{64, 48}, true)
		if err := p.e.Rollback(child, 10000); !errors.Is(err, ErrBadInput) {
			t.Fatalf("rollback past the start: %v", err)
		}
		for _, id := range []SeqID{parent, child} {
			if err := p.e.Release(id); err != nil {
				t.Fatal(err)
			}
		}
		for tp := range cfg.TP {
			for cp := range cfg.CP {
				if st := p.e.Shard(tp, cp).Store().Stats(); st.UsedPages != 0 {
					t.Fatalf("shard (%d,%d) keeps %d pages after release", tp, cp, st.UsedPages)
				}
			}
		}
	}
}

// faultyBackend fails or blocks Attend while armed.
type faultyBackend struct {
	kernels.Backend
	mode atomic.Int32 // 0 ok, 1 fail, 2 block until ctx ends
}

var errInjected = errors.New("injected attention failure")

func (f *faultyBackend) Attend(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, lists *kernels.Lists, o, lse []float32) error {
	switch f.mode.Load() {
	case 1:
		return errInjected
	case 2:
		<-ctx.Done()
		return ctx.Err()
	}
	return f.Backend.Attend(ctx, s, l, b, q, lists, o, lse)
}

// failStepTimeout is the step deadline of the failure tests. A failure must
// end a step in under half of it; it is long enough that a healthy step's
// work on a loaded machine never comes near that, so the bound proves the
// step did not wait for its deadline and cannot be missed by a slow run.
const failStepTimeout = 20 * time.Second

// TestShardFailure: a shard that errors or blocks mid-step fails the step
// before the deadline, and the engine keeps serving afterwards; no
// goroutine outlives the test (goleak in TestMain).
func TestShardFailure(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	bad := &faultyBackend{Backend: cpu}
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim = 1, 4, 2, 16
	cfg.CP, cfg.TP, cfg.CapacityPages = 4, 2, 64
	cfg.Policy.DenseLayers = 0
	cfg.StepTimeout = failStepTimeout
	cfg.Backends = func(tp, cp int) kernels.Backend {
		if tp == 1 && cp == 2 {
			return bad
		}
		return cpu
	}
	e := newEngine(t, cfg)
	var ids []SeqID
	for range 2 {
		id, _ := e.Create(plan.Striped)
		for l := range cfg.Layers {
			if err := e.Append(id, l, randVec(rng, 400*2*16), randVec(rng, 400*2*16)); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, id)
	}
	stepCtx := func(ctx context.Context, id SeqID) error {
		var res Result
		return e.Step(ctx, 0, []Request{{Seq: id, Q: randVec(rng, 4*16), BudgetTokens: 64}}, StepOptions{}, &res)
	}
	step := func(id SeqID) error { return stepCtx(context.Background(), id) }
	if err := step(ids[0]); err != nil {
		t.Fatal(err)
	}
	bad.mode.Store(1)
	t0 := time.Now()
	if err := step(ids[0]); !errors.Is(err, errInjected) {
		t.Fatalf("failing shard: step error %v", err)
	}
	// Peers abort at once instead of waiting for the step deadline.
	if el := time.Since(t0); el >= cfg.StepTimeout/2 {
		t.Fatalf("failing shard: the step took %v, want < %v: peers should abort long before the %v step deadline", el, cfg.StepTimeout/2, cfg.StepTimeout)
	}
	// A blocked shard is seen at the caller's deadline, which is far
	// earlier than StepTimeout: ending in under half of StepTimeout proves
	// the caller's deadline, not the engine's, ended the step.
	bad.mode.Store(2)
	const callerDeadline = 300 * time.Millisecond
	t0 = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), callerDeadline)
	defer cancel()
	if err := stepCtx(ctx, ids[1]); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked shard: step error %v", err)
	}
	if el := time.Since(t0); el < callerDeadline || el >= cfg.StepTimeout/2 {
		t.Fatalf("blocked shard: the step took %v, want the caller's %v deadline (and < %v)", el, callerDeadline, cfg.StepTimeout/2)
	}
	bad.mode.Store(0)
	for _, id := range ids {
		if err := step(id); err != nil {
			t.Fatalf("after the failures: %v", err)
		}
	}
}

// TestTransportFailure: a CP member whose transport fails its sends fails
// the step cleanly.
func TestTransportFailure(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim = 1, 4, 2, 16
	cfg.CP, cfg.CapacityPages = 3, 64
	cfg.Policy.DenseLayers = 0
	cfg.StepTimeout = failStepTimeout
	var faulty *collective.Faulty
	cfg.Transports = func(tp, n int) []collective.Transport {
		trs := collective.NewInprocGroup(n)
		faulty = &collective.Faulty{Transport: trs[1], FailSend: 2}
		trs[1] = faulty
		return trs
	}
	e := newEngine(t, cfg)
	id, _ := e.Create(plan.Striped)
	if err := e.Append(id, 0, randVec(rng, 300*2*16), randVec(rng, 300*2*16)); err != nil {
		t.Fatal(err)
	}
	var res Result
	t0 := time.Now()
	err := e.Step(context.Background(), 0, []Request{{Seq: id, Q: randVec(rng, 4*16), BudgetTokens: 64}}, StepOptions{}, &res)
	if !errors.Is(err, collective.ErrInjected) {
		t.Fatalf("step error %v, want the injected fault", err)
	}
	if el := time.Since(t0); el >= cfg.StepTimeout/2 {
		t.Fatalf("step took %v, want < %v: the failure should end it long before the %v step deadline", el, cfg.StepTimeout/2, cfg.StepTimeout)
	}
	// The fault was one send: the next step works.
	if err := e.Step(context.Background(), 0, []Request{{Seq: id, Q: randVec(rng, 4*16), BudgetTokens: 64}}, StepOptions{}, &res); err != nil {
		t.Fatalf("next step: %v", err)
	}
}

// TestEngineBadInput: each bad call fails and changes nothing.
func TestEngineBadInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim = 2, 4, 2, 8
	cfg.CP, cfg.TP, cfg.CapacityPages = 2, 2, 8
	p := newPair(t, cfg)
	id := p.create(plan.Striped)
	p.append(rng, id, 50)
	q := randVec(rng, 4*8)
	kv := randVec(rng, 2*8)
	nan := slices.Clone(kv)
	nan[0] = float32(math.NaN())
	type call struct {
		name string
		do   func() error
	}
	var res Result
	calls := []call{
		{"unknown seq", func() error { return p.e.Append(99, 0, kv, kv) }},
		{"bad layer", func() error { return p.e.Append(id, 2, kv, kv) }},
		{"short k", func() error { return p.e.Append(id, 0, kv[:3], kv[:3]) }},
		{"NaN v", func() error { return p.e.Append(id, 0, kv, nan) }},
		{"pool exhausted", func() error { return p.e.Append(id, 0, randVec(rng, 400*16), randVec(rng, 400*16)) }},
		{"step NaN key", func() error {
			return p.e.Step(context.Background(), 0, []Request{{Seq: id, Q: q, K: nan, V: kv}}, StepOptions{}, &res)
		}},
		{"step budget", func() error {
			return p.e.Step(context.Background(), 0, []Request{{Seq: id, Q: q, BudgetTokens: 3}}, StepOptions{}, &res)
		}},
		{"step dup", func() error {
			return p.e.Step(context.Background(), 0, []Request{{Seq: id, Q: q}, {Seq: id, Q: q}}, StepOptions{}, &res)
		}},
		{"rollback 0", func() error { return p.e.Rollback(id, 0) }},
	}
	for _, c := range calls {
		if err := c.do(); err == nil {
			t.Errorf("%s: no error", c.name)
		}
		if n, err := p.e.Len(id); err != nil || n != 50 {
			t.Fatalf("%s: length %d (%v), want 50", c.name, n, err)
		}
	}
	p.compare(rng, 1, []SeqID{id}, []int{16}, true)
}

// TestFusedAndRankedSteps: with one CP rank every shard fuses its local
// step into one backend call; with several, exact and union selection
// score and pick each rank's candidates in one call (kernels.Ranker). The
// outputs are bit-identical to the phased step (host pools, and pages on
// a pretend device), in both GQA modes and for every selection mode.
func TestFusedAndRankedSteps(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for _, tc := range []struct {
		sel    Selection
		gqa    kernels.GQAMode
		device bool
		cp     int
	}{
		{Exact, kernels.GroupMax, false, 1}, {Union, kernels.PerHead, false, 1}, {Replicated, kernels.GroupMax, true, 1}, {Exact, kernels.PerHead, true, 1},
		{Exact, kernels.GroupMax, false, 3}, {Union, kernels.PerHead, true, 2}, {Exact, kernels.PerHead, true, 3},
	} {
		t.Run(fmt.Sprintf("cp%d_%v_%v_device%v", tc.cp, tc.sel, tc.gqa, tc.device), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim = 2, 8, 4, 16
			cfg.CP, cfg.TP, cfg.CapacityPages, cfg.Selection = tc.cp, 2, 300, tc.sel
			cfg.Policy.DenseLayers, cfg.Policy.GQA, cfg.Policy.BudgetTokens = 1, tc.gqa, 64
			if tc.device {
				cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
				t.Cleanup(func() { cpu.Close() })
				cfg.Backend, cfg.DeviceResident = backendtest.FakeDevice{CPU: cpu}, true
			}
			e := newEngine(t, cfg)
			var ids []SeqID
			for _, n := range []int{17, 300, 1000} {
				id, err := e.Create(plan.Striped)
				if err != nil {
					t.Fatal(err)
				}
				for l := range cfg.Layers {
					if err := e.Append(id, l, randVec(rng, n*4*16), randVec(rng, n*4*16)); err != nil {
						t.Fatal(err)
					}
				}
				ids = append(ids, id)
			}
			for layer := range cfg.Layers {
				var reqs []Request
				for _, id := range ids {
					reqs = append(reqs, Request{Seq: id, Q: randVec(rng, 8*16)})
				}
				var fused, phased Result
				if err := e.Step(context.Background(), layer, reqs, StepOptions{Phased: true}, &phased); err != nil {
					t.Fatal(err)
				}
				if err := e.Step(context.Background(), layer, reqs, StepOptions{}, &fused); err != nil {
					t.Fatal(err)
				}
				switch {
				case phased.Time.Fused != 0:
					t.Fatalf("layer %d: the phased step fused", layer)
				case tc.cp == 1 && fused.Time.Fused == 0:
					t.Fatalf("layer %d: one CP rank did not fuse", layer)
				case tc.cp > 1 && layer > 0 && (fused.Time.TopK != 0 || phased.Time.TopK == 0):
					t.Fatalf("layer %d: top-K times %v (ranked) and %v (phased): the ranked step ran a separate top-K", layer, fused.Time.TopK, phased.Time.TopK)
				}
				if !slices.Equal(fused.O, phased.O) || !slices.Equal(fused.LSE, phased.LSE) {
					t.Fatalf("layer %d: fused and phased outputs differ", layer)
				}
			}
		})
	}
}

// TestStopRuleDistributedEqualsSingleShard: the stop-rule rows
// (StepOptions.StopRule) of a CP x TP engine equal the single shard's
// exactly (float64 from the same keys in the same page order), for both
// GQA modes and the three selection modes; dense steps carry none.
func TestStopRuleDistributedEqualsSingleShard(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 4))
	for trial, lay := range [][2]int{{1, 1}, {2, 1}, {3, 2}, {1, 4}, {5, 2}} {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 8, 4, 16, 16
		cfg.CP, cfg.TP, cfg.CapacityPages = lay[0], lay[1], 120
		cfg.Selection = []Selection{Exact, Replicated, Union}[trial%3]
		cfg.Policy.PageSize, cfg.Policy.DenseLayers, cfg.Policy.SinkPages = 16, 1, trial%2
		cfg.Policy.GQA = []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[trial%2]
		t.Run(fmt.Sprintf("cp%d_tp%d_%v_%v", cfg.CP, cfg.TP, cfg.Selection, cfg.Policy.GQA), func(t *testing.T) {
			p := newPair(t, cfg)
			id := p.create(plan.Striped)
			p.append(rng, id, 300+rng.IntN(400))
			for layer := range cfg.Layers {
				q := randVec(rng, cfg.QHeads*cfg.HeadDim)
				var got Result
				if err := p.e.Step(context.Background(), layer, []Request{{Seq: id, Q: q, BudgetTokens: 64}}, StepOptions{Diagnostics: true, StopRule: true}, &got); err != nil {
					t.Fatal(err)
				}
				var want shard.StepResult
				if err := p.ref.Step(context.Background(), layer, []shard.SeqStep{{Seq: p.ids[id], Q: q, BudgetTokens: 64}}, shard.StepOptions{Diagnostics: true, StopRule: true}, &want); err != nil {
					t.Fatal(err)
				}
				gs, ws := got.Diag[0].Stop, want.Diag[0].Stop
				if got.Plans[0].Dense {
					if len(gs) != 0 || len(ws) != 0 {
						t.Fatalf("layer %d dense: %d / %d stop rows", layer, len(gs), len(ws))
					}
					continue
				}
				pl := got.Plans[0]
				if len(gs) != cfg.QHeads || !reflect.DeepEqual(gs, ws) {
					t.Fatalf("layer %d: %d stop rows, single shard %d, or they differ", layer, len(gs), len(ws))
				}
				for _, r := range gs {
					if r.Ranked != pl.Pages-pl.Sink-pl.Local || !r.Exact || r.Recall[len(r.Recall)-1] != 1 || math.Abs(float64(r.Mass[len(r.Mass)-1])-1) > 1e-6 {
						t.Fatalf("layer %d head %d: ranked %d of plan %+v, exact %v, all pages read: recall %v mass %v", layer, r.Head, r.Ranked, pl, r.Exact, r.Recall[len(r.Recall)-1], r.Mass[len(r.Mass)-1])
					}
				}
			}
		})
	}
}
