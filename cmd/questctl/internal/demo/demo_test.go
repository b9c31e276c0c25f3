package demo

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
)

func smallConfig() Config {
	c := DefaultConfig()
	c.Context, c.Steps, c.Layers, c.DenseLayers = 2048, 4, 3, 1
	c.QHeads, c.KVHeads, c.HeadDim, c.Budget, c.Mentions, c.Needles = 8, 2, 32, 256, 8, 2
	c.Workers = 1
	return c
}

// TestMemoryPoolsMatchEngine: the demo's pool bytes are exactly what
// engine.New's preflight counts (it refuses one byte less), for every
// layout the demo can build.
func TestMemoryPoolsMatchEngine(t *testing.T) {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"single", func(*Config) {}},
		{"cp3-tp2", func(c *Config) { c.CP, c.TP = 3, 2 }},
		{"replicated", func(c *Config) { c.CP, c.Selection = 2, "replicated" }},
		{"device", func(c *Config) { c.DeviceResident = true }},
	} {
		c := smallConfig()
		tc.mod(&c)
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		m, err := c.Memory()
		if err != nil {
			t.Fatal(err)
		}
		var be kernels.Backend = cpu
		if c.DeviceResident {
			be = backendtest.FakeDevice{CPU: cpu}
		}
		ec := c.engineConfig(be)
		ec.MemoryLimit = m.Pools
		e, err := engine.New(ec)
		if err != nil {
			t.Fatalf("%s: engine refuses the demo's own pool count %d: %v", tc.name, m.Pools, err)
		}
		e.Close()
		ec.MemoryLimit = m.Pools - 1
		if _, err := engine.New(ec); !errors.Is(err, memlimit.ErrTooLarge) {
			t.Fatalf("%s: engine accepts %d bytes, one less than the demo counts: %v", tc.name, m.Pools-1, err)
		}
		if m.Data <= 0 || m.Scratch <= 0 || m.Total() != m.Pools+m.Data+m.Scratch {
			t.Fatalf("%s: memory %+v", tc.name, m)
		}
	}
}

// TestValidateMemory: a 10M-token context is refused before anything is
// allocated, in one line that says how much it needs.
func TestValidateMemory(t *testing.T) {
	c := DefaultConfig()
	c.Context = 10_000_000
	c.MemoryLimit = 16 << 30
	err := c.Validate()
	if !errors.Is(err, memlimit.ErrTooLarge) {
		t.Fatalf("10M tokens within 16 GiB: %v", err)
	}
	m, _ := c.Memory()
	if msg := err.Error(); !strings.Contains(msg, memlimit.Bytes(m.Total())) || !strings.Contains(msg, "--max-memory") || strings.Contains(msg, "\n") {
		t.Fatalf("message %q (need %s)", msg, memlimit.Bytes(m.Total()))
	}
	if _, err := Run(context.Background(), c, &bytes.Buffer{}); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Fatalf("Run: %v", err)
	}
	c.MemoryLimit = memlimit.NoLimit
	c.Context = MaxContext
	if m, err := c.Memory(); err != nil || m.Total() <= 0 {
		t.Fatalf("the largest context: %+v %v", m, err)
	}
}

func TestMeanSkipsNaN(t *testing.T) {
	var m mean
	if !math.IsNaN(m.value()) {
		t.Fatal("mean of nothing is not NaN")
	}
	for _, x := range []float64{1, math.NaN(), 3, math.NaN()} {
		m.add(x)
	}
	if m.value() != 2 || m.n != 2 || m.skipped != 2 {
		t.Fatalf("mean %v over %d, %d skipped", m.value(), m.n, m.skipped)
	}
}

func TestRhoFormula(t *testing.T) {
	for _, c := range []struct {
		s, k, p int
		want    float64
	}{
		{16, 128, 4097, 1.0/16 + 128.0/4097},
		{16, 62500000, 4097, 1 + 1.0/16}, // K capped at P
		{16, 4097, 4097, 1 + 1.0/16},
	} {
		if got := rhoFormula(c.s, c.k, c.p); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("rho(%d, %d, %d) = %v, want %v", c.s, c.k, c.p, got, c.want)
		}
	}
	if !math.IsNaN(rhoFormula(16, 1, 0)) {
		t.Error("rho of no pages is not NaN")
	}
}

// TestRunSmall: a small demo measures both phases; every summary value is
// defined.
func TestRunSmall(t *testing.T) {
	var out bytes.Buffer
	sum, err := Run(context.Background(), smallConfig(), &out)
	if err != nil {
		t.Fatal(err)
	}
	if sum.StepsA != 2 || sum.StepsB != 2 || sum.SparseLayers != 2 || sum.RelL2Undefined != 0 || sum.DensePlans != 0 {
		t.Fatalf("summary %+v", sum)
	}
	for name, v := range map[string]float64{"speedup": sum.SpeedupMean, "recall A": sum.RecallA, "recall B": sum.RecallB,
		"mass A": sum.MassA, "mass B": sum.MassB, "rel L2": sum.RelL2, "abs L2": sum.AbsL2, "rho": sum.RhoMeasured, "needles": sum.NeedleHitRate} {
		if math.IsNaN(v) || v < 0 {
			t.Errorf("%s = %v", name, v)
		}
	}
	if sum.RhoFormula <= 0 || sum.RhoFormula > 1+1.0/16 {
		t.Errorf("rho formula %v", sum.RhoFormula)
	}
	for _, want := range []string{"host memory:", "over 2 steps", "rel L2", "summary over 2 sparse layers x 4 steps"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// A step's speedup is positive however slow the host made the step
	// (two significant digits below 1): 0x means a zero dense time.
	if strings.Contains(out.String(), "NaN") || strings.Contains(out.String(), " 0x") {
		t.Errorf("output shows NaN or 0x:\n%s", out.String())
	}
}

// TestRunOneStep: with one step the A phase has none; the summary says so
// instead of printing zeros.
func TestRunOneStep(t *testing.T) {
	c := smallConfig()
	c.Steps = 1
	var out bytes.Buffer
	sum, err := Run(context.Background(), c, &out)
	if err != nil {
		t.Fatal(err)
	}
	if sum.StepsA != 0 || sum.StepsB != 1 || !math.IsNaN(sum.RecallA) || math.IsNaN(sum.RecallB) {
		t.Fatalf("summary %+v", sum)
	}
	if !strings.Contains(out.String(), "asking A: no steps (--steps 1: the query turns to B at step 0)") {
		t.Fatalf("output:\n%s", out.String())
	}
}

// TestValidateMessages: each refusal is one line naming the flag and the
// allowed range, without a struct dump.
func TestValidateMessages(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.DenseLayers = 5 }, "--dense-layers 5: want 0..3"},
		{func(c *Config) { c.DenseLayers = 4 }, "--dense-layers 4: want 0..3"},
		{func(c *Config) { c.PageSize = 1_000_000 }, "--page-size 1..3276"},
		{func(c *Config) { c.Budget = 1_000_000_000 }, "--budget 1000000000: want 16..65535 tokens"},
		{func(c *Config) { c.Budget = 65536 }, "--budget 65536: want 16..65535 tokens"},
		{func(c *Config) { c.Budget = 8 }, "--budget 8: want 16..65535"},
		{func(c *Config) { c.Context = 1 }, "--context 320.."},
		{func(c *Config) { c.Context = 2000 }, "--budget 2048: want 16..1999"},
		{func(c *Config) { c.Context = 1000 }, "--mentions 64: want 1..62"},
		{func(c *Config) { c.Needles = 1024 }, "--needles 1..1023"},
		{func(c *Config) { c.Mentions = 5000 }, "--mentions 5000: want 1..4096"},
		{func(c *Config) { c.Steps = 0 }, "--steps 0: want 1..100000"},
		{func(c *Config) { c.Workers = -1 }, "--workers -1: want 0..256 (0: GOMAXPROCS-1)"},
		{func(c *Config) { c.TP = 3 }, "--tp 3: want a divisor of --kv-heads 8"},
		{func(c *Config) { c.QHeads = 12 }, "--q-heads 12: want a multiple of --kv-heads 8"},
		{func(c *Config) { c.CP = 5000 }, "--cp 5000: want 1..256"},
		{func(c *Config) {
			c.Context, c.PageSize, c.Budget, c.Needles, c.Mentions, c.CP = 2048, 64, 256, 1, 1, 40
		}, "--cp 40: want 1..32"},
		{func(c *Config) { c.Selection, c.Selector = "replicated", "oracle" }, "--selection replicated needs --selector quest or dense"},
		{func(c *Config) { c.MemoryLimit = -2 }, "--max-memory -2"},
		{func(c *Config) { c.MemoryLimit = 1 }, "1 B memory limit"},
	} {
		c := DefaultConfig()
		c.MemoryLimit = memlimit.NoLimit // the messages, not this machine's free memory
		tc.mod(&c)
		err := c.Validate()
		if err == nil {
			t.Errorf("%q: accepted", tc.want)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.ContainsAny(msg, "\n{") {
			t.Errorf("got %q, want it to contain %q on one line", msg, tc.want)
		}
	}
	// Zeros with a documented meaning.
	for _, mod := range []func(*Config){
		func(c *Config) { c.DenseLayers = 0 },
		func(c *Config) { c.Workers = 0 },
		func(c *Config) { c.Seed = 0 },
		func(c *Config) { c.MemoryLimit = memlimit.NoLimit },
	} {
		c := DefaultConfig()
		c.MemoryLimit = memlimit.NoLimit
		mod(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("documented zero refused: %v", err)
		}
	}
}

// TestRunDeviceResident: the demo on a pretend device (pages only in
// device memory, diagnostics reading keys back in chunks) measures the
// same selection quality as on host pools.
func TestRunDeviceResident(t *testing.T) {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	c := smallConfig()
	c.Steps = 2
	host, err := Run(context.Background(), c, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	c.Backend, c.DeviceResident = backendtest.FakeDevice{CPU: cpu}, true
	var out bytes.Buffer
	dev, err := Run(context.Background(), c, &out)
	if err != nil {
		t.Fatal(err)
	}
	if host.RecallA != dev.RecallA || host.RecallB != dev.RecallB || host.MassA != dev.MassA || host.MassB != dev.MassB ||
		host.RelL2 != dev.RelL2 || host.RhoMeasured != dev.RhoMeasured {
		t.Fatalf("device-resident summary %+v differs from host %+v", dev, host)
	}
	if !strings.Contains(out.String(), "pages in device memory only") {
		t.Fatalf("output:\n%s", out.String())
	}
}
