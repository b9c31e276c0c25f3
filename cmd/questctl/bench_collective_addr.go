package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/bench/clusterrun"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/worker/remote"
)

// addrFlags are the flags of bench collective that --addr reads besides
// the sizes.
type addrFlags struct {
	addr           string
	conn           *connFlags
	tokenFile      string
	nodes, batches string
	timeout        time.Duration
	asJSON         bool
}

// benchCollectiveAddr is bench collective --addr: it checks the flags
// (every refusal before anything runs), then runs each configuration on
// the cluster.
func benchCollectiveAddr(ctx context.Context, fs *flag.FlagSet, f addrFlags, c collective.BenchConfig, sw collective.SweepConfig, sweep bool, stdout, stderr io.Writer) error {
	for _, name := range []string{"shards", "transport", "max-memory"} {
		if flagSet(fs, name) {
			return usageError{fmt.Errorf("--%s: not with --addr (the ranks run on the cluster's nodes, over its streams, within each node's memory limit)", name)}
		}
	}
	if err := checkHostPort(f.addr); err != nil {
		return usageError{fmt.Errorf("--addr %q: %v", f.addr, err)}
	}
	timeout := remote.DefaultBenchTimeout
	if flagSet(fs, "timeout") {
		timeout = f.timeout
	}
	if timeout <= 0 || timeout > remote.MaxBenchTimeout {
		return usageError{fmt.Errorf("--timeout %v: with --addr, want a positive duration of at most %v", timeout, remote.MaxBenchTimeout)}
	}
	nodes := []int{0}
	if flagSet(fs, "nodes") {
		var err error
		if nodes, err = sizeList("nodes", f.nodes); err != nil {
			return usageError{err}
		}
		for _, n := range nodes {
			if n < 2 || n > remote.MaxBenchRanks {
				return usageError{fmt.Errorf("--nodes %d: want 2 to %d (one rank per node of the cluster)", n, remote.MaxBenchRanks)}
			}
			if !sweep && c.Pages >= 1 && n > c.Pages {
				return usageError{fmt.Errorf("--nodes %d: more ranks than the %d pages of a sequence (--pages)", n, c.Pages)}
			}
		}
	}
	// Sizes are checked here as for the local modes, for the largest
	// group asked (2 when every node up: the node checks the rest).
	check := slices.Max(nodes)
	check = max(check, 2)
	var err error
	if sweep {
		sw.Shards, sw.Transport, sw.MaxMemory = []int{check}, "inproc", memlimit.NoLimit
		sw.Steps, sw.Warmup = sweepSteps, sweepWarmup
		if flagSet(fs, "steps") {
			sw.Steps = c.Steps
		}
		if flagSet(fs, "warmup") {
			sw.Warmup = c.Warmup
		}
		err = sw.Validate()
	} else {
		if c.Batches, err = sizeList("batch", f.batches); err != nil {
			return usageError{err}
		}
		c.Shards, c.Transport, c.MaxMemory = []int{check}, "inproc", memlimit.NoLimit
		err = c.Validate()
	}
	if err != nil {
		var re *collective.BenchRangeError
		if errors.As(err, &re) {
			limit := ""
			if re.Limit != "" {
				limit = fmt.Sprintf(" (--%s)", collectiveFlags[re.Limit])
			}
			field := collectiveFlags[re.Field]
			if re.Field == "Shards" {
				field = "nodes"
			}
			return usageError{fmt.Errorf("--%s %d: want %d to %d%s", field, re.Value, re.Min, re.Max, limit)}
		}
		return usageError{err}
	}
	sec, err := f.conn.settings()
	if err != nil {
		return err
	}
	token, err := readTokenFile(f.tokenFile)
	if err != nil {
		return err
	}
	cc, err := dialDecode(f.addr, sec, token)
	if err != nil {
		return err
	}
	defer cc.Close()
	lw := newLineWriter(stdout, stderr, f.asJSON)
	start := time.Now()
	err = clusterrun.Run(ctx, clusterrun.Config{Addr: f.addr, Client: decodev1.NewDecodeClient(cc), Nodes: nodes, Bench: c, Sweep: sw, IsSweep: sweep,
		Timeout: timeout, Emit: lw.collective, EmitSweep: lw.sweep, Progress: stderr})
	if errors.Is(err, clusterrun.ErrRefused) {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	if !f.asJSON {
		fmt.Fprintf(stderr, "done in %.1fs\n", time.Since(start).Seconds())
	}
	return nil
}
