package rankproc

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"

	"github.com/questrt/questrt/collective"
)

// Bench runs every (nodes, batch) configuration of c (nodes from
// c.Shards) with each rank in its own child process over gRPC, started
// by l with the command line args(group, rank, nodes, batch) (a
// RunRank), and emits each result as collective.BenchCollective does,
// with Processes set.
func Bench(ctx context.Context, c collective.BenchConfig, l Launcher, args func(group string, r, n, batch int) []string, emit func(collective.BenchResult) error) error {
	for _, n := range c.Shards {
		for _, b := range c.Batches {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("bench collective: %w", err)
			}
			what := fmt.Sprintf("bench collective: nodes %d batch %d: %d + %d layer-steps over grpc, one process per rank",
				n, b, c.Warmup, c.Steps)
			group := "bench-" + rand.Text()
			reports, err := l.Run(ctx, n, c.Progress, what, func(r int) []string {
				return args(group, r, n, b)
			})
			var res collective.BenchResult
			if err == nil {
				var samples []collective.BenchSamples
				if samples, err = decode[collective.BenchSamples](reports); err == nil {
					res, err = collective.BenchCombine(c, b, samples)
				}
			}
			if err != nil {
				return fmt.Errorf("bench collective nodes=%d batch=%d: %w", n, b, err)
			}
			res.Processes = n
			if err := emit(res); err != nil {
				return err
			}
		}
	}
	return nil
}

// Sweep runs the sweep sw for every group size of sw.Shards with each
// rank in its own child process over gRPC, started by l with the command
// line args(group, rank, nodes) (a RunRank with Sweep set), and emits
// each result as collective.BenchSweep does, with Processes set.
func Sweep(ctx context.Context, sw collective.SweepConfig, l Launcher, args func(group string, r, n int) []string, emit func(collective.SweepResult) error) error {
	for _, n := range sw.Shards {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("bench collective: %w", err)
		}
		what := fmt.Sprintf("bench collective: all-gather sweep, nodes %d: %d sizes, %d + %d rounds each over grpc, one process per rank",
			n, len(sw.MsgSizes(n)), sw.Warmup, sw.Steps)
		group := "bench-" + rand.Text()
		reports, err := l.Run(ctx, n, sw.Progress, what, func(r int) []string {
			return args(group, r, n)
		})
		var res []collective.SweepResult
		if err == nil {
			var samples []collective.SweepSamples
			if samples, err = decode[collective.SweepSamples](reports); err == nil {
				res, err = collective.SweepCombine(sw, samples)
			}
		}
		if err != nil {
			return fmt.Errorf("bench collective sweep nodes=%d: %w", n, err)
		}
		for _, r := range res {
			r.Processes = n
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// decode reads each rank's report line as its samples.
func decode[S any](reports []json.RawMessage) ([]S, error) {
	samples := make([]S, len(reports))
	for r, rep := range reports {
		if err := json.Unmarshal(rep, &samples[r]); err != nil {
			return nil, fmt.Errorf("rank %d wrote a bad report: %w", r, err)
		}
	}
	return samples, nil
}
