package main

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestMemberConfig: the node's membership config carries the flags, is
// valid, and its detection bound is the one documented on Config.
func TestMemberConfig(t *testing.T) {
	c, err := load(t, nil, "--plaintext", "--name", "n1", "--grpc-addr", "10.0.0.5:7070", "--gossip-addr", ":0",
		"--join", "10.0.0.6:7946", "--cluster-label", "lab", "--probe-interval", "100ms", "--probe-timeout", "50ms",
		"--suspicion-mult", "2", "--gossip-interval", "20ms")
	if err != nil {
		t.Fatal(err)
	}
	m := c.memberConfig()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if m.Name != "n1" || m.BindAddr != "0.0.0.0" || m.BindPort != 0 || m.AdvertiseAddr != "10.0.0.5" ||
		!slices.Equal(m.Join, []string{"10.0.0.6:7946"}) || m.Label != "lab" || len(m.SecretKeys) != 0 ||
		m.ProbeInterval != 100*time.Millisecond || m.ProbeTimeout != 50*time.Millisecond || m.SuspicionMult != 2 ||
		m.GossipInterval != 20*time.Millisecond {
		t.Errorf("member config %+v", m)
	}
	if m.DeadRetention != cluster.DefaultMemberConfig().DeadRetention {
		t.Errorf("unexposed fields must keep cluster's defaults")
	}

	c, err = load(t, nil, "--plaintext", "--advertise", "192.0.2.1", "--grpc-addr", "192.0.2.1:7070", "--gossip-addr", "0.0.0.0:7946")
	if err != nil {
		t.Fatal(err)
	}
	m = c.memberConfig()
	if m.BindAddr != "0.0.0.0" || m.BindPort != 7946 || m.AdvertiseAddr != "192.0.2.1" || c.advertiseHost() != "192.0.2.1" {
		t.Errorf("defaults with --advertise: %+v", m)
	}
	if got := m.DetectionBound(3); got != 9800*time.Millisecond {
		t.Errorf("DetectionBound(3) with the default timings = %v, documented 9.8s", got)
	}
}

// TestEngineConfig: the engine config carries the geometry, grid, policy
// and mode, and is valid.
func TestEngineConfig(t *testing.T) {
	c, err := load(t, nil, "--plaintext", "--layers", "3", "--q-heads", "16", "--kv-heads", "4", "--head-dim", "64",
		"--page-size", "8", "--cp", "2", "--tp", "2", "--capacity-pages", "256", "--block-pages", "16",
		"--budget-tokens", "512", "--sink-pages", "1", "--local-pages", "2", "--dense-layers", "1",
		"--gqa", "per_head", "--selector", "dense", "--selection", "replicated", "--max-memory", "8GiB", "--step-timeout", "3s")
	if err != nil {
		t.Fatal(err)
	}
	e := c.engineConfig()
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	want := plan.Policy{PageSize: 8, BudgetTokens: 512, SinkPages: 1, LocalPages: 2, DenseLayers: 1, GQA: plan.PerHead, Selector: plan.Dense}
	if e.Layers != 3 || e.QHeads != 16 || e.KVHeads != 4 || e.HeadDim != 64 || e.PageSize != 8 || e.CP != 2 || e.TP != 2 ||
		e.CapacityPages != 256 || e.BlockPages != 16 || !reflect.DeepEqual(e.Policy, want) || e.Selection != plan.Replicated ||
		e.MemoryLimit != 8<<30 || e.StepTimeout != 3*time.Second {
		t.Errorf("engine config %+v", e)
	}
	if e.DeviceBudgetPages != 0 || e.Eviction != pagestore.EvictLRU || e.PrefetchPages != 0 || e.PrefetchCrossLayer {
		t.Errorf("offload is on by default: %+v", e)
	}
}

// TestEngineConfigOffload: the offload flags, from each source, reach the
// engine config and its worker config (what travels to the grid's
// nodes), which validate.
func TestEngineConfigOffload(t *testing.T) {
	check := func(c Config) {
		t.Helper()
		e := c.engineConfig()
		if err := e.Validate(); err != nil {
			t.Fatal(err)
		}
		if e.DeviceBudgetPages != 64 || e.Eviction != pagestore.EvictScore || e.PrefetchPages != 8 || !e.PrefetchCrossLayer {
			t.Errorf("engine config offload: budget %d, eviction %v, prefetch %d, cross-layer %v", e.DeviceBudgetPages, e.Eviction, e.PrefetchPages, e.PrefetchCrossLayer)
		}
		w := e.WorkerConfig()
		if w.DeviceBudgetPages != 64 || w.Eviction != pagestore.EvictScore || w.PrefetchPages != 8 || !w.PrefetchCrossLayer {
			t.Errorf("worker config offload: %+v", w)
		}
	}
	c, err := load(t, nil, "--plaintext", "--device-budget-pages", "64", "--eviction", "score", "--prefetch-pages", "8", "--prefetch-cross-layer")
	if err != nil {
		t.Fatal(err)
	}
	check(c)
	c, err = load(t, map[string]string{"QUESTRT_DEVICE_BUDGET_PAGES": "64", "QUESTRT_EVICTION": "score",
		"QUESTRT_PREFETCH_PAGES": "8", "QUESTRT_PREFETCH_CROSS_LAYER": "true"}, "--plaintext")
	if err != nil {
		t.Fatal(err)
	}
	check(c)
	p := writeFile(t, "offload.yaml", "plaintext: true\ndevice-budget-pages: 64\neviction: score\nprefetch-pages: 8\nprefetch-cross-layer: true\n")
	c, err = load(t, nil, "--config", p)
	if err != nil {
		t.Fatal(err)
	}
	check(c)
	// A value from the file names the file.
	p = writeFile(t, "bad.yaml", "plaintext: true\nprefetch-pages: 8\n")
	if _, err := load(t, nil, "--config", p); err == nil || err.Error() != `--prefetch-pages "8": needs --device-budget-pages (prefetch needs offload) (set by `+p+` line 2)` {
		t.Errorf("prefetch without a budget from the file: %v", err)
	}
}
