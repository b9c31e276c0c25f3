package completion

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
)

// TestServeOnDevice serves through the device executor on the CPU twin of
// a device (gpu.Decoder, pages device-resident): concurrent greedy
// requests, batched together, return the texts a CPU server returns for
// the same requests; a selector the executor does not run is refused
// with 400; configs the Decoder cannot serve are refused.
func TestServeOnDevice(t *testing.T) {
	m, tok, dev, x, cfg, cpuTS := deviceTwin(t)
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

// deviceTwin makes the tiny model's executor on the CPU twin of a
// device and a CPU server of the test config (a budget of four pages),
// the reference the device servers are compared with.
func deviceTwin(t *testing.T) (*model.Model, model.Tokenizer, *backendtest.QueuedDevice, *gpu.Executor, Config, *httptest.Server) {
	t.Helper()
	m, tok := tinyModel(t)
	dev, x := twinExecutor(t, m, 0)
	cfg := testConfig("tiny")
	cfg.Policy.BudgetTokens = 4 * cfg.Policy.PageSize
	_, cpuTS := startServer(t, m, tok, cfg)
	return m, tok, dev, x, cfg, cpuTS
}

// prefillPair is a CPU server and a device server of the same config on
// the CPU twin of a device (prefillTwin).
type prefillPair struct {
	m            *model.Model
	tok          model.Tokenizer
	dev          *backendtest.QueuedDevice
	cfg          Config // the CPU server's
	cpuTS, devTS *httptest.Server
	pf           *countingPrefiller // the device server's prompt tokens
}

// prefillTwin makes a CPU server of the test config (a budget of four
// pages, chunks of 48 tokens) and a device server of the same config,
// changed by device when set, whose prompts the executor on the CPU twin
// prefills in chunks of 32.
func prefillTwin(t *testing.T, device func(*Config)) prefillPair {
	t.Helper()
	m, tok := tinyModel(t)
	dev, x := twinExecutor(t, m, 32)
	cfg := testConfig("tiny")
	cfg.Policy.BudgetTokens = 4 * cfg.Policy.PageSize
	cfg.ChunkTokens = 48
	_, cpuTS := startServer(t, m, tok, cfg)
	dec := &gpu.Decoder{X: x}
	pf := &countingPrefiller{Prefiller: dec}
	dcfg := cfg
	if device != nil {
		device(&dcfg)
	}
	dcfg.Backend, dcfg.DeviceResident, dcfg.Decoder, dcfg.Prefiller = dev, true, dec, pf
	_, devTS := startServer(t, m, tok, dcfg)
	return prefillPair{m, tok, dev, cfg, cpuTS, devTS, pf}
}

// twinExecutor makes m's executor (float32 weights, batches up to 16,
// prefill chunks of prefillChunk tokens, 0 the default) on the CPU twin
// of a device.
func twinExecutor(t *testing.T, m *model.Model, prefillChunk int) (*backendtest.QueuedDevice, *gpu.Executor) {
	t.Helper()
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	t.Cleanup(func() { cpu.Close() })
	dev := &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}
	ctx := context.Background()
	x, err := gpu.New(ctx, dev, m, gpu.Options{Float32Weights: true, MaxBatch: 16, PrefillChunk: prefillChunk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close(ctx) })
	return dev, x
}

// countingPrefiller counts the device prefill's chunks and tokens.
type countingPrefiller struct {
	Prefiller
	mu             sync.Mutex
	chunks, tokens int
}

func (c *countingPrefiller) Prefill(ctx context.Context, a model.Attention, tokens []int) ([]float32, error) {
	c.mu.Lock()
	c.chunks++
	c.tokens += len(tokens)
	c.mu.Unlock()
	return c.Prefiller.Prefill(ctx, a, tokens)
}

// TestServeOnDevicePrefill serves with the prompts prefilled by the
// device executor on the CPU twin (Config.Prefiller), in chunks of 48
// tokens: concurrent greedy requests, a prompt of several chunks, n = 2
// (one prefill, a fork) and a seeded sampled request return the CPU
// server's texts; echo with logprobs (every position's logits) is
// prefilled on the CPU and agrees too. The prefiller saw every prompt
// token but the echoed one's.
func TestServeOnDevicePrefill(t *testing.T) {
	tw := prefillTwin(t, nil)
	m, tok, cfg, cpuTS, devTS, pf := tw.m, tw.tok, tw.cfg, tw.cpuTS, tw.devTS, tw.pf

	long := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 4)
	reqs := []map[string]any{
		{"model": "tiny", "prompt": long, "max_tokens": 10, "temperature": 0},
		{"model": "tiny", "prompt": "0123456789 ", "max_tokens": 10, "temperature": 0},
		{"model": "tiny", "prompt": "a", "max_tokens": 10, "temperature": 0},
		{"model": "tiny", "prompt": long[:100], "max_tokens": 8, "n": 2, "temperature": 0.9, "seed": 7},
		{"model": "tiny", "prompt": long[:70], "max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 3},
	}
	got := make([]Completion, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { got[i] = complete(t, devTS.URL, r) })
	}
	wg.Wait()
	prompt := 0
	for i, r := range reqs {
		want := complete(t, cpuTS.URL, r)
		if len(got[i].Choices) != len(want.Choices) {
			t.Fatalf("request %d: %d choices, CPU %d", i, len(got[i].Choices), len(want.Choices))
		}
		for c := range want.Choices {
			if got[i].Choices[c].Text != want.Choices[c].Text {
				t.Errorf("request %d choice %d: device-prefilled %q, CPU %q", i, c, got[i].Choices[c].Text, want.Choices[c].Text)
			}
		}
		prompt += got[i].Usage.PromptTokens - got[i].Usage.PromptTokensDetails.CachedTokens
	}
	if pf.tokens != prompt || pf.chunks < len(reqs)+2 {
		t.Errorf("the device prefilled %d tokens in %d chunks; the prompts hold %d uncached (the long one more than one chunk)", pf.tokens, pf.chunks, prompt)
	}
	// The prefix cache with the device prefill: the long prompt again
	// forks its cached pages on the device and prefills only the rest.
	before := pf.tokens
	again := complete(t, devTS.URL, reqs[0])
	c := again.Usage.PromptTokensDetails.CachedTokens
	if c == 0 || c%cfg.Policy.PageSize != 0 || pf.tokens-before != again.Usage.PromptTokens-c {
		t.Errorf("repeated prompt: %d cached tokens, %d prefilled on the device, %d in the prompt", c, pf.tokens-before, again.Usage.PromptTokens)
	}
	if want := complete(t, cpuTS.URL, reqs[0]).Choices[0].Text; again.Choices[0].Text != want {
		t.Errorf("repeated prompt from the cache: %q, CPU %q", again.Choices[0].Text, want)
	}
	// Echo with logprobs: the CPU's dense prefill (every position).
	before = pf.tokens
	r := map[string]any{"model": "tiny", "prompt": long[:60], "max_tokens": 3, "temperature": 0, "echo": true, "logprobs": 1}
	e, w := complete(t, devTS.URL, r), complete(t, cpuTS.URL, r)
	if e.Choices[0].Text != w.Choices[0].Text || len(e.Choices[0].Logprobs.Tokens) != len(w.Choices[0].Logprobs.Tokens) {
		t.Errorf("echo: device %q (%d logprobs), CPU %q (%d)", e.Choices[0].Text, len(e.Choices[0].Logprobs.Tokens), w.Choices[0].Text, len(w.Choices[0].Logprobs.Tokens))
	}
	if pf.tokens != before {
		t.Errorf("echo with logprobs went through the device prefill (%d tokens)", pf.tokens-before)
	}
	if _, err := New(m, tok, func() Config { c := cfg; c.Prefiller = pf; return c }()); err == nil {
		t.Error("a Prefiller without a Decoder accepted")
	}
}

var _ SamplingDecoder = (*gpu.Decoder)(nil)

// countingSampler counts the device decoder's sampled steps and the
// logits they copied back.
type countingSampler struct {
	*gpu.Decoder
	mu            sync.Mutex
	steps, logits int
}

func (c *countingSampler) DecodeSample(ctx context.Context, attns []model.Attention, tokens []int, params []kernels.SampleParams, want []bool) ([]int, []int, [][]float32, error) {
	ids, greedy, logits, err := c.Decoder.DecodeSample(ctx, attns, tokens, params, want)
	c.mu.Lock()
	c.steps++
	for _, l := range logits {
		if l != nil {
			c.logits++
		}
	}
	c.mu.Unlock()
	return ids, greedy, logits, err
}

// TestServeOnDeviceSampled: with a SamplingDecoder the serving loop picks
// tokens on the device (the twin runs kernels.SampleRow): concurrent
// seeded requests (temperature, top-p, n = 2, greedy, logprobs, top-k
// and min-p) return the CPU server's texts and logprobs, decode steps go
// through DecodeSample, and logits come back only for the request that
// asks for logprobs and the one with top_k and min_p (which the device's
// rule lacks: the host draws its tokens again, with the same u).
func TestServeOnDeviceSampled(t *testing.T) {
	m, tok, dev, x, cfg, cpuTS := deviceTwin(t)
	cs := &countingSampler{Decoder: &gpu.Decoder{X: x}}
	dcfg := cfg
	dcfg.Backend, dcfg.DeviceResident, dcfg.Decoder = dev, true, cs
	_, devTS := startServer(t, m, tok, dcfg)

	long := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 4)
	reqs := []map[string]any{
		{"model": "tiny", "prompt": long[:90], "max_tokens": 10, "n": 2, "temperature": 0.9, "seed": 7},
		{"model": "tiny", "prompt": long[:70], "max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 3},
		{"model": "tiny", "prompt": long[:50], "max_tokens": 10, "temperature": 1.3, "seed": 11, "logprobs": 2},
		{"model": "tiny", "prompt": long[:40], "max_tokens": 10, "temperature": 0},
		{"model": "tiny", "prompt": long[:60], "max_tokens": 10, "temperature": 1.2, "top_k": 3, "min_p": 0.05, "seed": 9},
	}
	if a, b := complete(t, cpuTS.URL, reqs[4]).Choices[0].Text, complete(t, cpuTS.URL, with(reqs[4], "top_k", nil, "min_p", nil)).Choices[0].Text; a == b {
		t.Fatalf("top_k 3 and min_p 0.05 change nothing of %q: pick another seed", a)
	}
	got := make([]Completion, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { got[i] = complete(t, devTS.URL, r) })
	}
	wg.Wait()
	for i, r := range reqs {
		want := complete(t, cpuTS.URL, r)
		for k := range want.Choices {
			g, w := got[i].Choices[k], want.Choices[k]
			if g.Text != w.Text {
				t.Errorf("request %d choice %d: device %q, CPU %q", i, k, g.Text, w.Text)
			}
			if (g.Logprobs == nil) != (w.Logprobs == nil) || g.Logprobs != nil && !slices.Equal(g.Logprobs.Tokens, w.Logprobs.Tokens) {
				t.Errorf("request %d choice %d: logprobs differ", i, k)
			}
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.steps == 0 {
		t.Fatal("no decode step went through DecodeSample")
	}
	// Only the logprobs and top_k requests' rows (9 decode steps each
	// after their first token) copied logits back.
	if cs.logits == 0 || cs.logits > 18 {
		t.Errorf("%d rows of logits copied back in %d steps, want the logprobs and top_k requests' 1..18", cs.logits, cs.steps)
	}
}
