package completion

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestConfigValidate: the defaults are valid; each bad value is refused
// with its name.
func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"page size", func(c *Config) { c.Policy.PageSize = 0 }, "page size"},
		{"huge page size", func(c *Config) { c.Policy.PageSize, c.Policy.BudgetTokens = 8192, 8192 }, "page size"},
		{"budget", func(c *Config) { c.Policy.BudgetTokens = 8 }, "budget"},
		{"cp", func(c *Config) { c.CP = 0 }, "cp"},
		{"tp", func(c *Config) { c.TP = 65 }, "tp"},
		{"capacity", func(c *Config) { c.CapacityPages = -1 }, "capacity"},
		{"memory fraction", func(c *Config) { c.MemoryFraction = 0.96 }, "memory fraction"},
		{"memory fraction zero", func(c *Config) { c.MemoryFraction = 0 }, "memory fraction"},
		{"memory limit", func(c *Config) { c.MemoryLimit = -2 }, "memory limit"},
		{"max running", func(c *Config) { c.MaxRunning = 0 }, "max running"},
		{"max queued", func(c *Config) { c.MaxQueued = -1 }, "max queued"},
		{"chunk", func(c *Config) { c.ChunkTokens = 0 }, "chunk"},
		{"grid retries", func(c *Config) { c.GridRetries = -1 }, "grid retries"},
		{"grid retry wait", func(c *Config) { c.GridRetryWait = -time.Second }, "grid retry wait"},
		{"max batched", func(c *Config) { c.MaxBatchedTokens = 15 }, "max batched 15 tokens"},
		{"max batched negative", func(c *Config) { c.MaxBatchedTokens = -1 }, "max batched -1 tokens"},
		{"max batched below max running", func(c *Config) { c.MaxRunning, c.MaxBatchedTokens = 64, 63 }, "max running, 64"},
		{"max context", func(c *Config) { c.MaxContext = -1 }, "max context"},
		{"max body", func(c *Config) { c.MaxBodyBytes = 0 }, "max body"},
		{"request timeout", func(c *Config) { c.RequestTimeout = -time.Second }, "request timeout"},
		{"default max tokens", func(c *Config) { c.DefaultMaxTokens = 0 }, "default max tokens"},
		{"default max tokens -2", func(c *Config) { c.DefaultMaxTokens = -2 }, "default max tokens"},
		{"retry after", func(c *Config) { c.RetryAfter = -1 }, "retry after"},
		{"workers", func(c *Config) { c.Workers = 300 }, "workers"},
		{"selection", func(c *Config) { c.Selection = 9 }, "selection"},
	} {
		cfg := DefaultConfig()
		c.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
}

// TestNewRefuses: New refuses a config without a model name and an
// engine the model's geometry cannot have, and starts nothing (goleak
// checks the scheduler).
func TestNewRefuses(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("")
	if _, err := New(m, tok, cfg); err == nil || !strings.Contains(err.Error(), "model name") {
		t.Errorf("no name: %v", err)
	}
	cfg = testConfig("tiny")
	cfg.TP = 3 // the tiny model has 2 KV heads
	if _, err := New(m, tok, cfg); err == nil {
		t.Error("TP 3 over 2 KV heads: no error")
	}
}

// TestNewNeedsEngines: New refuses a config without Engines, whatever
// the layout (with a Cluster they check its grid).
func TestNewNeedsEngines(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.Engines = nil
	if _, err := New(m, tok, cfg); !errors.Is(err, errNoEngines) {
		t.Errorf("no Engines: %v, want errNoEngines", err)
	}
}

// TestLoadNamesModel: Load names the model after its directory unless
// the config names it, and closes the model with the server.
func TestLoadNamesModel(t *testing.T) {
	dir := writeTinyModel(t, "my-model", 512)
	cfg := testConfig("")
	s, err := Load(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name() != "my-model" || s.maxContext != 512 {
		t.Errorf("name %q, context %d", s.Name(), s.maxContext)
	}
	s.Close()
	cfg.ModelName, cfg.MaxContext = "other", 100
	if s, err = Load(dir, cfg); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Name() != "other" || s.maxContext != 100 {
		t.Errorf("name %q, context %d", s.Name(), s.maxContext)
	}
}
