package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestOffloadDistributedEqualsSingleShard is invariant 8 with offload on
// in every shard of a CP x TP grid (the engine passes DeviceBudgetPages
// to each rank's store): the same selected pages per head as a single
// shard holding every page, outputs within fp32 tolerance. The device
// budget (24 pages per shard) is below the dense layer's pages, so dense
// steps attend in several passes.
func TestOffloadDistributedEqualsSingleShard(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	trials := 8
	if testing.Short() {
		trials = 3
	}
	var prefetchSteps int64 // over the trials that prefetch
	defer func() {
		if prefetchSteps == 0 && !t.Failed() {
			t.Error("no step of any trial prefetched")
		}
	}()
	for trial := range trials {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 8, 4, 16, 16
		cfg.CP = 2 + rng.IntN(3)
		cfg.TP = []int{1, 2}[rng.IntN(2)]
		cfg.CapacityPages = 200
		cfg.DeviceBudgetPages = 24
		cfg.Eviction = []pagestore.Eviction{pagestore.EvictLRU, pagestore.EvictScore}[trial%2]
		cfg.BlockPages = 1 + rng.IntN(4)
		cfg.Selection = []Selection{Exact, Replicated}[rng.IntN(2)]
		cfg.Policy.PageSize = 16
		cfg.Policy.DenseLayers = 1
		cfg.Policy.SinkPages = rng.IntN(2)
		cfg.Policy.GQA = []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[rng.IntN(2)]
		// Half the trials prefetch (within-layer or cross-layer).
		cfg.PrefetchPages = []int{0, 4}[trial%2]
		cfg.PrefetchCrossLayer = cfg.PrefetchPages > 0 && trial%4 == 3
		// Every third trial keeps the pools device-resident on the
		// pretend device (slot pools and its host tier).
		if trial%3 == 1 {
			cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2, AttendChunk: 4, ScoreChunk: 8})
			t.Cleanup(func() { cpu.Close() })
			cfg.Backend, cfg.DeviceResident = backendtest.FakeDevice{CPU: cpu}, true
		}
		name := fmt.Sprintf("trial%d_cp%d_tp%d_%v_%v_%v_sink%d_prefetch%d_cross%v_dev%v", trial, cfg.CP, cfg.TP, cfg.Selection, cfg.Policy.GQA, cfg.Eviction, cfg.Policy.SinkPages, cfg.PrefetchPages, cfg.PrefetchCrossLayer, cfg.DeviceResident)
		t.Run(name, func(t *testing.T) {
			p := newPair(t, cfg)
			lens := []int{1, 17, 200 + rng.IntN(500), 300 + rng.IntN(500), 600}
			var seqs []SeqID
			var budgets []int
			for _, n := range lens {
				id := p.create([]plan.Placement{plan.Striped, plan.Contiguous}[rng.IntN(2)])
				p.append(rng, id, n)
				seqs = append(seqs, id)
				budgets = append(budgets, []int{16, 32, 64, 4096}[rng.IntN(4)])
			}
			for range 2 {
				for layer := range cfg.Layers {
					p.compare(rng, layer, seqs, budgets, true)
				}
			}
			var evictions, multi, issued int64
			for tp := range cfg.TP {
				for cp := range cfg.CP {
					sh := p.e.Shard(tp, cp)
					if err := sh.Store().CheckResidency(); err != nil {
						t.Fatal(err)
					}
					st := sh.OffloadStats()
					if st.Resident > cfg.DeviceBudgetPages {
						t.Fatalf("shard (%d,%d): %d pages resident, budget %d", tp, cp, st.Resident, cfg.DeviceBudgetPages)
					}
					evictions += st.Evictions
					multi += st.MultiPass
					issued += st.PrefetchSteps
				}
			}
			if evictions == 0 || multi == 0 {
				t.Fatalf("offload not exercised: %d evictions, %d multi-pass steps", evictions, multi)
			}
			prefetchSteps += issued
		})
	}
}

func TestOffloadConfigRefused(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DeviceBudgetPages = cfg.CapacityPages + 1
	if err := cfg.Validate(); err == nil {
		t.Error("a device budget over the capacity was accepted")
	}
	// Offload with device-resident pools needs a backend with slot pools
	// (kernels.SlotStore): valid, refused by New on the CPU backend.
	cfg.DeviceBudgetPages, cfg.DeviceResident = 8, true
	if err := cfg.Validate(); err != nil {
		t.Errorf("offload with device-resident pools: %v", err)
	}
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	c := cfg
	c.Backend = cpu
	if e, err := New(c); !errors.Is(err, pagestore.ErrInvalidConfig) {
		if e != nil {
			e.Close()
		}
		t.Errorf("device-resident offload on the CPU backend: %v, want ErrInvalidConfig", err)
	}
	cfg.DeviceBudgetPages, cfg.DeviceResident, cfg.PrefetchPages = 0, false, 4
	if err := cfg.Validate(); err == nil {
		t.Error("prefetch without offload was accepted")
	}
	cfg.DeviceBudgetPages = 64
	if err := cfg.Validate(); err != nil {
		t.Errorf("prefetch with offload: %v", err)
	}
}
