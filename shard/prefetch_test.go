package shard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
	"go.uber.org/goleak"
)

// drainPrefetch waits until the shard's prefetcher has read (or given
// up on) every reservation.
func drainPrefetch(t *testing.T, sh *Shard) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for sh.Store().ResidencyStats().PrefetchPending > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("prefetch still pending after 10s: %+v", sh.OffloadStats())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// slowPrefetchTier delays the prefetcher's reads (those whose context
// can end: the test's steps run under context.Background) by d, so that
// they are in flight when the next step comes.
type slowPrefetchTier struct {
	tier.Tier
	d time.Duration
}

func (s *slowPrefetchTier) Read(ctx context.Context, slot int, dst []byte) error {
	if ctx.Done() != nil {
		t := time.NewTimer(s.d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	return s.Tier.Read(ctx, slot, dst)
}

// TestPrefetchProperty is TestOffloadProperty with prefetch on over a
// tier whose prefetch reads are slow (1 ms): reads are often in flight
// when the next step comes, so steps wait for them, take queued
// reservations over and give reservations back for room; every step's
// o and lse stay bit-identical to a shard holding every page. Run with
// -race.
func TestPrefetchProperty(t *testing.T) {
	const qh, kvh, s = 4, 2, 4
	seeds := 4
	if testing.Short() {
		seeds = 1
	}
	for seed := range seeds {
		pol := plan.DefaultPolicy()
		pol.BudgetTokens, pol.DenseLayers = 3*s, 0
		pol.GQA = []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[seed%2]
		pol.SinkPages = seed % 2
		rows := kvh
		if pol.GQA == kernels.PerHead {
			rows = qh
		}
		const maxSeqs = 4
		budget := maxSeqs*2 + maxSeqs*(2+rows*3)
		ev := []pagestore.Eviction{pagestore.EvictLRU, pagestore.EvictScore}[seed/2%2]
		pf := []prefetchOpt{{pages: 16}, {pages: 6, cross: true}}[seed%2]
		t.Run(fmt.Sprintf("seed%d_%v_%v_%v", seed, pol.GQA, ev, pf), func(t *testing.T) {
			c := pagestore.Config{Layers: 2, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: 8, PageSize: s}, Capacity: 400}
			mem, err := tier.NewMemory(c.Capacity, c.PayloadBytes())
			if err != nil {
				t.Fatal(err)
			}
			offloadProperty(t, seed+100, pol, budget, ev, pf, &slowPrefetchTier{Tier: mem, d: time.Millisecond})
		})
	}
}

// TestPrefetchHits: a slowly drifting query (the demo's workload) over
// one long sequence: with prefetch, the pages just below each step's
// selection are read while it attends, so the next steps miss less;
// outputs stay bit-identical to a shard holding every page.
func TestPrefetchHits(t *testing.T) {
	const layers, qh, kvh, d, s, tokens = 1, 8, 2, 16, 16, 4096
	pol := plan.DefaultPolicy()
	pol.BudgetTokens, pol.DenseLayers, pol.SinkPages = 8*s, 0, 1
	pages := tokens / s
	var misses [2]int64
	for i, pf := range []prefetchOpt{{}, {pages: 8}} {
		p := newOffPair(t, layers, qh, kvh, d, s, pages+8, pages/4, pol, pagestore.EvictLRU, nil, pf)
		rng := rand.New(rand.NewPCG(5, 6))
		id := p.create()
		p.append(rng, id, tokens)
		qs := benchQueries(rng, "slow", 80, qh*d)
		var before pagestore.ResidencyStats
		for n, q := range qs {
			if n == 20 { // past the warm-up (the first recalls write the dirty pages back)
				before = p.off.Store().ResidencyStats()
			}
			var want, got StepResult
			if err := p.ref.Step(context.Background(), 0, []SeqStep{{Seq: id, Q: q}}, StepOptions{}, &want); err != nil {
				t.Fatal(err)
			}
			if err := p.off.Step(context.Background(), 0, []SeqStep{{Seq: p.ids[id], Q: q}}, StepOptions{}, &got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
				t.Fatalf("%v step %d: outputs differ", pf, n)
			}
			drainPrefetch(t, p.off)
			if err := p.off.Store().CheckResidency(); err != nil {
				t.Fatal(err)
			}
		}
		st := p.off.OffloadStats()
		misses[i] = st.Misses - before.Misses
		t.Logf("%v: %d misses in 60 steps, stall per step %v, prefetch hits %d, issued %d, wasted %d, plan %v",
			pf, misses[i], st.StallPerStep(), st.PrefetchHits, st.PrefetchIssued, st.PrefetchWasted, st.PrefetchPlan)
		if pf.pages > 0 && (st.PrefetchHits == 0 || st.PrefetchSteps == 0 || st.PrefetchLoaded == 0) {
			t.Fatalf("prefetch never hit: %+v", st)
		}
	}
	if misses[1] >= misses[0] {
		t.Fatalf("prefetch did not reduce misses: %d with, %d without", misses[1], misses[0])
	}
}

// TestPrefetchCrossLayer: when layer l+1's queries resemble layer l's
// (here: equal), cross-layer prefetch ranks layer l+1's summaries with
// layer l's queries while layer l attends, so layer l+1 finds its
// selection resident: no misses once the device pool is warm. Within-
// layer prefetch, predicting layer l's next step instead, leaves layer
// l+1 its misses. Outputs are bit-identical either way.
func TestPrefetchCrossLayer(t *testing.T) {
	const layers, qh, kvh, d, s, tokens = 2, 4, 2, 16, 16, 2048
	pol := plan.DefaultPolicy()
	pol.BudgetTokens, pol.DenseLayers = 6*s, 0
	pages := tokens / s
	var layer1Misses [2]int64
	for i, pf := range []prefetchOpt{{pages: 1}, {pages: 1, cross: true}} {
		p := newOffPair(t, layers, qh, kvh, d, s, pages+8, 48, pol, pagestore.EvictLRU, nil, pf)
		rng := rand.New(rand.NewPCG(7, 8))
		id := p.create()
		p.append(rng, id, tokens) // independent keys per layer
		for n := range 40 {
			q := randVec(rng, qh*d, 2)
			for layer := range layers {
				before := p.off.Store().ResidencyStats()
				var want, got StepResult
				if err := p.ref.Step(context.Background(), layer, []SeqStep{{Seq: id, Q: q}}, StepOptions{}, &want); err != nil {
					t.Fatal(err)
				}
				if err := p.off.Step(context.Background(), layer, []SeqStep{{Seq: p.ids[id], Q: q}}, StepOptions{}, &got); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
					t.Fatalf("%v step %d layer %d: outputs differ", pf, n, layer)
				}
				drainPrefetch(t, p.off)
				if layer == 1 && n >= 20 {
					layer1Misses[i] += p.off.Store().ResidencyStats().Misses - before.Misses
				}
			}
		}
		st := p.off.OffloadStats()
		t.Logf("%v: layer-1 misses in 20 steps %d; %+v", pf, layer1Misses[i], st)
	}
	if layer1Misses[1] != 0 || layer1Misses[0] == 0 {
		t.Fatalf("layer-1 misses: within-layer %d, cross-layer %d (want > 0 and 0)", layer1Misses[0], layer1Misses[1])
	}
}

// stepKey marks the contexts of test steps (see gateTier).
type stepKey struct{}

// gateTier blocks, while closed is set, every Read whose context is not
// a test step's (the prefetcher's reads) until its context ends.
type gateTier struct {
	tier.Tier
	closed  atomic.Bool
	blocked chan struct{} // one send per blocked read (non-blocking)
}

func (g *gateTier) Read(ctx context.Context, slot int, dst []byte) error {
	if g.closed.Load() && ctx.Value(stepKey{}) == nil {
		select {
		case g.blocked <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return g.Tier.Read(ctx, slot, dst)
}

// TestPrefetchClose: Close ends the prefetcher even with a read that
// would never finish in flight and reservations queued; nothing leaks,
// the residency stays consistent, and a second Close is harmless.
func TestPrefetchClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const layers, qh, kvh, d, s = 1, 4, 2, 8, 4
	c := pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 128, DeviceBudget: 24}
	mem, err := tier.NewMemory(c.Capacity, c.PayloadBytes())
	if err != nil {
		t.Fatal(err)
	}
	g := &gateTier{Tier: mem, blocked: make(chan struct{}, 1)}
	c.Tier = g
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	pol := plan.DefaultPolicy()
	pol.BudgetTokens, pol.DenseLayers = 3*s, 0
	sh, err := New(Config{Store: c, Policy: pol, PrefetchPages: 6}, be)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	id := sh.Store().Create()
	fill(t, rng, sh, id, &refSeq{}, 100*s)
	ctx := context.WithValue(context.Background(), stepKey{}, true)
	var res StepResult
	for range 5 { // warm: clean resident pages to evict
		if err := sh.Step(ctx, 0, []SeqStep{{Seq: id, Q: randVec(rng, qh*d, 2)}}, StepOptions{}, &res); err != nil {
			t.Fatal(err)
		}
	}
	drainPrefetch(t, sh)
	g.closed.Store(true)
	for n := 0; ; n++ {
		if err := sh.Step(ctx, 0, []SeqStep{{Seq: id, Q: randVec(rng, qh*d, 2)}}, StepOptions{}, &res); err != nil {
			t.Fatal(err)
		}
		select {
		case <-g.blocked:
		case <-time.After(100 * time.Millisecond):
			if n < 20 {
				continue
			}
			t.Fatal("no prefetch read started")
		}
		break
	}
	done := make(chan error, 1)
	go func() { done <- sh.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked on a prefetch read in flight")
	}
	st := sh.OffloadStats()
	if st.PrefetchPending != 0 || st.PrefetchFailed == 0 {
		t.Fatalf("after Close: %+v", st)
	}
	if err := sh.Store().CheckResidency(); err != nil {
		t.Fatal(err)
	}
	if err := sh.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPrefetchConfig: prefetch settings out of range, without offload or
// cross-layer without prefetch are refused with ErrInvalidConfig.
func TestPrefetchConfig(t *testing.T) {
	st := pagestore.Config{Layers: 2, Geometry: plan.Geometry{QHeads: 2, KVHeads: 1, HeadDim: 4, PageSize: 4}, Capacity: 8, DeviceBudget: 4}
	ok := Config{Store: st, Policy: plan.DefaultPolicy(), PrefetchPages: 2, PrefetchCrossLayer: true}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"negative":         func(c *Config) { c.PrefetchPages = -1 },
		"over capacity":    func(c *Config) { c.PrefetchPages = 9 },
		"without offload":  func(c *Config) { c.Store.DeviceBudget = 0 },
		"cross without it": func(c *Config) { c.PrefetchPages = 0 },
	} {
		c := ok
		mod(&c)
		if err := c.Validate(); !errors.Is(err, pagestore.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}
