package serveload

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Bounds of the settings (of questctl bench serve's flags).
const (
	MaxConcurrency = 1024
	MaxPromptLen   = 8 << 20 // bytes
	MaxTokens      = 1 << 20
	MaxRequests    = 1 << 20
	MaxWarmup      = 100
	MaxBudget      = 1 << 30 // tokens
	MaxTimeout     = 24 * time.Hour
)

// Config is one run of the load test. The fields' ranges are those of
// the flags of questctl bench serve that set them, which Validate's
// errors name.
type Config struct {
	Addr  string // HOST:PORT of the completions API
	Model string // the model to request; "": the one the server lists first
	// Concurrency is the requests in flight of each level; Selectors
	// the selectors each level runs ("quest", "dense").
	Concurrency []int
	Selectors   []string
	PromptLen   int // bytes of each passkey prompt
	MaxTokens   int // max_tokens of each request
	Requests    int // per level; 0: max(4, 2 x concurrency)
	Budget      int // quest.budget; 0: the server's
	// BackgroundLen is the bytes of a background prompt prefilled while
	// each level runs again; 0: none.
	BackgroundLen int
	// SharedPrefix is the bytes of each group's shared document (0: no
	// shared-prefix workload); PrefixGroups the documents the requests
	// of a level share.
	SharedPrefix int
	PrefixGroups int
	Warmup       int // unmeasured requests per selector before the first level
	Seed         uint64
	Timeout      time.Duration // of one request
}

// DefaultConfig returns the settings of questctl bench serve without
// flags but --addr: concurrency 1, 4 and 16, both selectors, prompts of
// 8192 bytes, 64 tokens, one warm-up request per selector, seed 1 and a
// 10-minute timeout per request.
func DefaultConfig() Config {
	return Config{
		Concurrency: []int{1, 4, 16}, Selectors: []string{"quest", "dense"},
		PromptLen: 8192, MaxTokens: 64, PrefixGroups: 1, Warmup: 1, Seed: 1, Timeout: 10 * time.Minute,
	}
}

// Validate reports the first setting outside its range, naming the flag
// of questctl bench serve that sets it.
func (c Config) Validate() error {
	if len(c.Concurrency) == 0 || len(c.Selectors) == 0 {
		return errors.New("--concurrency, --selector: no values")
	}
	for i, s := range c.Selectors {
		if (s != "quest" && s != "dense") || slices.Contains(c.Selectors[:i], s) {
			return fmt.Errorf("--selector: %q unknown or twice (want quest, dense)", s)
		}
	}
	for _, n := range c.Concurrency {
		if n < 1 || n > MaxConcurrency {
			return fmt.Errorf("--concurrency %d: want 1..%d", n, MaxConcurrency)
		}
	}
	switch {
	case c.PromptLen < 64 || c.PromptLen > MaxPromptLen:
		return fmt.Errorf("--prompt-len %d: want 64..%d bytes", c.PromptLen, MaxPromptLen)
	case c.MaxTokens < 1 || c.MaxTokens > MaxTokens:
		return fmt.Errorf("--max-tokens %d: want 1..%d", c.MaxTokens, MaxTokens)
	case c.Requests < 0 || c.Requests > MaxRequests:
		return fmt.Errorf("--requests %d: want 0 (the default) or 1..%d", c.Requests, MaxRequests)
	case c.Warmup < 0 || c.Warmup > MaxWarmup:
		return fmt.Errorf("--warmup %d: want 0..%d", c.Warmup, MaxWarmup)
	case c.Budget < 0 || c.Budget > MaxBudget:
		return fmt.Errorf("--budget %d: want 0 (the server's) or a token budget up to %d", c.Budget, MaxBudget)
	case c.BackgroundLen != 0 && (c.BackgroundLen < 64 || c.BackgroundLen > MaxPromptLen):
		return fmt.Errorf("--background-prompt-len %d: want 0 (none) or 64..%d bytes", c.BackgroundLen, MaxPromptLen)
	case c.SharedPrefix != 0 && (c.SharedPrefix < 64 || c.SharedPrefix > MaxPromptLen):
		return fmt.Errorf("--shared-prefix-len %d: want 0 (off) or 64..%d bytes", c.SharedPrefix, MaxPromptLen)
	case c.PrefixGroups < 1 || c.PrefixGroups > MaxRequests:
		return fmt.Errorf("--prefix-groups %d: want 1..%d", c.PrefixGroups, MaxRequests)
	case c.SharedPrefix > 0 && c.BackgroundLen > 0:
		return fmt.Errorf("--shared-prefix-len with --background-prompt-len: run the two workloads separately")
	case c.Timeout <= 0 || c.Timeout > MaxTimeout:
		return fmt.Errorf("--timeout %v: want above 0 and at most %v", c.Timeout, MaxTimeout)
	}
	return nil
}

// levelRequests is the requests of a level of concurrency n.
func (c Config) levelRequests(n int) int {
	if c.Requests == 0 {
		return max(4, 2*n)
	}
	return max(c.Requests, n)
}
