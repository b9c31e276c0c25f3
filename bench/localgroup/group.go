package localgroup

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/grpctransport"
)

// NewTransports returns what builds the n members of a local group of
// the named transport: for "grpc", a gRPC group on 127.0.0.1 (plaintext
// loopback streams, ephemeral ports) whose members accept messages of
// maxMsg bytes (at least grpctransport's default limit); nil for
// "inproc", collective's built-in, and for any other name, which the
// benchmark's Validate then refuses.
func NewTransports(ctx context.Context, name string, maxMsg int64) func(n int) ([]collective.Transport, error) {
	if name != "grpc" {
		return nil
	}
	return func(n int) ([]collective.Transport, error) {
		cfg := grpctransport.DefaultConfig()
		cfg.Plaintext = true
		cfg.MaxMessageBytes = max(cfg.MaxMessageBytes, int(maxMsg))
		g, err := grpctransport.NewLocalGroup(ctx, n, cfg)
		if err != nil {
			return nil, fmt.Errorf("grpc group of %d: %w", n, err)
		}
		trs := make([]collective.Transport, n)
		for i, t := range g {
			trs[i] = t
		}
		return trs, nil
	}
}

// Bench runs every (shards, batch) configuration of c on goroutines over
// c.Transport (collective.BenchCollective; NewTransports builds its
// groups when c has none) and emits each result as it is made.
func Bench(ctx context.Context, c collective.BenchConfig, emit func(collective.BenchResult) error) error {
	if c.NewTransports == nil {
		c.NewTransports = NewTransports(ctx, c.Transport, 0)
	}
	return collective.BenchCollective(ctx, c, emit)
}

// Sweep runs the all-gather sweep sw for every group size of sw.Shards on
// goroutines over sw.Transport (collective.BenchSweep; NewTransports
// builds its groups, with room for the sweep's largest message, when sw
// has none) and emits each result as it is made.
func Sweep(ctx context.Context, sw collective.SweepConfig, emit func(collective.SweepResult) error) error {
	if sw.NewTransports == nil {
		sw.NewTransports = NewTransports(ctx, sw.Transport, sw.MaxMsgBytes())
	}
	return collective.BenchSweep(ctx, sw, emit)
}
