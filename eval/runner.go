package eval

import (
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// RunnerConfig is what the harness asks of one runner: one (selector,
// summary type) of its Config, laid out and sized for its prompts.
type RunnerConfig struct {
	// Geometry is the model's attention shape.
	Geometry model.Geometry
	// Policy is the runner's policy: the Config's with the selector, the
	// summary type and a budget of at least one page set.
	Policy plan.Policy
	// CapacityPages is the page pool of each shard.
	CapacityPages int
	// CP, TP (at least 1) and Selection lay the runner out.
	CP, TP    int
	Selection plan.SelectMode
	// MemoryLimit bounds the runner's page pools (Config.MemoryLimit).
	MemoryLimit int64
	// KVDType is the storage type of the K/V pages (Config.KVDType).
	KVDType plan.DType
}

// Runner is one in-process runner the harness decodes on (an engine of
// one grid, built by the caller: cmd/questctl's eval). Not safe for
// concurrent use by the harness's callers; the harness uses it from one
// goroutine.
type Runner interface {
	// NewAttention creates an empty sequence of the runner (striped
	// placement) driven as an attention of geometry g.
	NewAttention(g model.Geometry) (*model.EngineAttention, error)
	// HierCounts snapshots the runner's hierarchical search counters.
	HierCounts() HierCounts
	// TopPCounts snapshots the runner's top-p pruning counters.
	TopPCounts() TopPCounts
	// Close releases the runner.
	Close() error
}

// NewRunnerFunc builds a runner for c.
type NewRunnerFunc func(c RunnerConfig) (Runner, error)
