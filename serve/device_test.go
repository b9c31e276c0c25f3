package serve

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/model/gpu"
)

// TestServeOnDevice serves through the device executor on the CPU twin of
// a device (gpu.Decoder, pages device-resident): concurrent greedy
// requests, batched together, return the texts a CPU server returns for
// the same requests; a selector the executor does not run is refused
// with 400; configs the Decoder cannot serve are refused.
func TestServeOnDevice(t *testing.T) {
	m, tok := tinyModel(t)
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	t.Cleanup(func() { cpu.Close() })
	dev := &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}
	ctx := context.Background()
	x, err := gpu.New(ctx, dev, m, gpu.Options{Float32Weights: true, MaxBatch: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close(ctx) })
	cfg := testConfig("tiny")
	cfg.Policy.BudgetTokens = 4 * cfg.Policy.PageSize
	_, cpuTS := startServer(t, m, tok, cfg)
	dcfg := cfg
	dcfg.Backend, dcfg.DeviceResident, dcfg.Decoder = dev, true, &gpu.Decoder{X: x}
	_, devTS := startServer(t, m, tok, dcfg)

	prompts := []string{"the quick brown fox jumps over the lazy dog, again and again and again", "0123456789 ", "a"}
	var wg sync.WaitGroup
	got := make([]string, len(prompts))
	for i, p := range prompts {
		wg.Go(func() {
			c := complete(t, devTS.URL, map[string]any{"model": "tiny", "prompt": p, "max_tokens": 12, "temperature": 0})
			got[i] = c.Choices[0].Text
		})
	}
	wg.Wait()
	// The steps ran on the device: fused steps on device tensors, two
	// host synchronisations each (End and the argmax) and the logits'.
	if dev.Queued() == 0 || dev.Syncs() == 0 {
		t.Fatalf("no step on the device: %d queued, %d syncs", dev.Queued(), dev.Syncs())
	}
	for i, p := range prompts {
		want := complete(t, cpuTS.URL, map[string]any{"model": "tiny", "prompt": p, "max_tokens": 12, "temperature": 0}).Choices[0].Text
		if got[i] != want {
			t.Errorf("prompt %d: device %q, CPU %q", i, got[i], want)
		}
	}
	// Dense requests run on the device too (every layer forced dense).
	d := complete(t, devTS.URL, map[string]any{"model": "tiny", "prompt": prompts[0], "max_tokens": 6, "temperature": 0, "quest": map[string]any{"selector": "dense"}})
	w := complete(t, cpuTS.URL, map[string]any{"model": "tiny", "prompt": prompts[0], "max_tokens": 6, "temperature": 0, "quest": map[string]any{"selector": "dense"}})
	if d.Choices[0].Text != w.Choices[0].Text {
		t.Errorf("dense: device %q, CPU %q", d.Choices[0].Text, w.Choices[0].Text)
	}
	status, _, body := post(t, devTS.URL+"/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":2,"quest":{"selector":"top_p"}}`)
	if status != http.StatusBadRequest {
		t.Errorf("selector top_p on the device: %d %s", status, body)
	}
	for name, mod := range map[string]func(*Config){
		"cp 2":       func(c *Config) { c.CP = 2 },
		"monitor":    func(c *Config) { c.Monitor.Rate = 0.5 },
		"no backend": func(c *Config) { c.Backend = nil },
		"host pages": func(c *Config) { c.DeviceResident = false },
	} {
		c := dcfg
		mod(&c)
		if _, err := New(m, tok, c); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s refused: %v", name, err)
		}
	}
}
