package serveload

import (
	"strings"
	"testing"
)

// TestConfigValidate: the defaults with an address are valid, and the
// settings a caller other than the CLI can get wrong (no levels, an
// unknown or repeated selector) are refused with the flag's name.
func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.Addr = "127.0.0.1:8000"
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Concurrency = nil }, "no values"},
		{func(c *Config) { c.Selectors = []string{"quest", "quest"} }, `--selector: "quest" unknown or twice`},
		{func(c *Config) { c.Selectors = []string{"sparse"} }, `--selector: "sparse" unknown or twice`},
		{func(c *Config) { c.Timeout = 0 }, "--timeout 0s"},
	} {
		c := c
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
		}
	}
}

// TestLevelRequests: a level runs max(4, 2n) requests by default, and at
// least its concurrency.
func TestLevelRequests(t *testing.T) {
	c := DefaultConfig()
	if got := c.levelRequests(1); got != 4 {
		t.Errorf("default, n 1: %d requests, want 4", got)
	}
	if got := c.levelRequests(16); got != 32 {
		t.Errorf("default, n 16: %d requests, want 32", got)
	}
	c.Requests = 3
	if got := c.levelRequests(8); got != 8 {
		t.Errorf("--requests 3, n 8: %d requests, want 8", got)
	}
}
