package offload

import (
	"errors"
	"strings"
	"testing"

	"github.com/questrt/questrt/internal/memlimit"
)

// TestConfigValidate: the defaults are valid, and a setting a caller
// other than the CLI can get wrong (an empty list, an unknown workload
// or backend) is refused with the flag's name.
func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Contexts = nil }, "--context: no values"},
		{func(c *Config) { c.Workloads = nil }, "--workload: no values"},
		{func(c *Config) { c.Workloads = []string{"bursty"} }, `--workload: unknown workload "bursty"`},
		{func(c *Config) { c.Backend = "tpu" }, `--backend "tpu"`},
		{func(c *Config) { c.Prefetch = []int{1 << 20} }, "--prefetch 1048576"},
		{func(c *Config) { c.Backend, c.DType = "cuda", "int3" }, "int3"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
		}
	}
}

// TestPreflight: a limit below the defaults' memory is refused with
// memlimit.ErrTooLarge.
func TestPreflight(t *testing.T) {
	c := DefaultConfig()
	c.MemoryLimit = 1 << 20
	if err := c.Preflight(); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Errorf("Preflight with 1 MiB = %v, want memlimit.ErrTooLarge", err)
	}
}
