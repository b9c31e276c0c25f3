package main

// The hidden child command of `questctl bench collective --nodes`
// (`questctl bench collective rank`, internal flags required) and the
// child command lines the parent gives it; package bench/rankproc runs
// both sides.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/questrt/questrt/bench/rankproc"
	"github.com/questrt/questrt/collective"
)

// rankCommand, after `bench collective`, runs one rank: the hidden child
// command of --nodes.
const rankCommand = "rank"

// runBenchRank is the child: one rank of an n-rank gRPC group.
func runBenchRank(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := collective.DefaultBenchConfig()
	fs := newFlags("bench collective rank", `Usage: questctl bench collective rank --group ID --rank R --size N --batch B [flags]

Internal to 'questctl bench collective --nodes', which starts it: one rank
of an N-rank gRPC group on 127.0.0.1, coordinated over stdin and stdout.
Not for direct use.`)
	group := fs.String("group", "", "the group id (internal)")
	rank := fs.Int("rank", -1, "this process's rank (internal)")
	size := fs.Int("size", 0, "the group's size (internal)")
	batch := fs.Int("batch", 0, "the batch size (internal)")
	timeout := fs.Duration("timeout", rankproc.DefaultTimeout, "the longest the rank may run")
	fs.IntVar(&c.Steps, "steps", c.Steps, "measured layer-steps")
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, "unmeasured layer-steps run first")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads")
	fs.IntVar(&c.QHeads, "q-heads", c.QHeads, "query heads")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "head dimension D")
	fs.IntVar(&c.PageBudget, "k", c.PageBudget, "pages selected per row (K)")
	fs.IntVar(&c.Pages, "pages", c.Pages, "pages per sequence")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the data")
	sw := collective.DefaultSweepConfig()
	fs.Int64Var(&sw.MinBytes, "min-bytes", sw.MinBytes, "the sweep's smallest all-gather (internal)")
	fs.Int64Var(&sw.MaxBytes, "max-bytes", sw.MaxBytes, "the sweep's largest all-gather (internal)")
	fs.IntVar(&sw.Factor, "factor", sw.Factor, "the sweep's factor (internal)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	sweep := flagSet(fs, "min-bytes")
	for _, f := range []string{"group", "rank", "size", "batch"} {
		if !flagSet(fs, f) {
			return usageError{errors.New("rank: internal to 'questctl bench collective --nodes', which gives it --group, --rank, --size and --batch")}
		}
	}
	if *size < 2 || *size > rankproc.MaxNodes || *rank < 0 || *rank >= *size || *timeout <= 0 {
		return usageError{fmt.Errorf("rank: --rank %d --size %d --timeout %v: want 0 <= rank < size, size 2 to %d, a positive timeout", *rank, *size, *timeout, rankproc.MaxNodes)}
	}
	return rankproc.RunRank(ctx, rankproc.Rank{Group: *group, Rank: *rank, Size: *size, Batch: *batch, Timeout: *timeout,
		Bench: c, Sweep: sweep, SweepConfig: sw}, stdin, stdout)
}

// rankArgs are the child command line of rank r of an n-rank group.
func rankArgs(c collective.BenchConfig, group string, r, n, batch int, timeout time.Duration) []string {
	return append(rankBaseArgs(c, group, r, n, batch, timeout),
		"--kv-heads", strconv.Itoa(c.KVHeads), "--q-heads", strconv.Itoa(c.QHeads), "--head-dim", strconv.Itoa(c.HeadDim),
		"--k", strconv.Itoa(c.PageBudget), "--pages", strconv.Itoa(c.Pages), "--seed", strconv.FormatUint(c.Seed, 10))
}

// sweepRankArgs are the child command line of rank r of an n-rank group
// of the sweep sw.
func sweepRankArgs(sw collective.SweepConfig, group string, r, n int, timeout time.Duration) []string {
	c := collective.DefaultBenchConfig()
	c.Steps, c.Warmup = sw.Steps, sw.Warmup
	return append(rankBaseArgs(c, group, r, n, 1, timeout),
		"--min-bytes", strconv.FormatInt(sw.MinBytes, 10), "--max-bytes", strconv.FormatInt(sw.MaxBytes, 10),
		"--factor", strconv.Itoa(sw.Factor))
}

// rankBaseArgs are the arguments every child takes.
func rankBaseArgs(c collective.BenchConfig, group string, r, n, batch int, timeout time.Duration) []string {
	return []string{
		"bench", "collective", rankCommand,
		"--group", group, "--rank", strconv.Itoa(r), "--size", strconv.Itoa(n), "--batch", strconv.Itoa(batch),
		// Later than the parent's deadline, which kills the child first and
		// names the ranks that did not report; the child's own is for when
		// the parent is gone.
		"--timeout", (timeout + rankproc.ChildTimeoutMargin).String(),
		"--steps", strconv.Itoa(c.Steps), "--warmup", strconv.Itoa(c.Warmup),
	}
}

// nodesLauncher starts the children of --nodes: this program, each
// configuration for at most timeout.
func nodesLauncher(timeout time.Duration) (rankproc.Launcher, error) {
	exe, err := os.Executable()
	if err != nil {
		return rankproc.Launcher{}, fmt.Errorf("bench collective --nodes: this program's path: %w", err)
	}
	return rankproc.Launcher{Exe: exe, Timeout: timeout, SysProcAttr: childSysProcAttr}, nil
}

// benchNodes runs every (nodes, batch) configuration of c with each rank
// in its own child process over gRPC (rankproc.Bench).
func benchNodes(ctx context.Context, c collective.BenchConfig, timeout time.Duration, emit func(collective.BenchResult) error) error {
	l, err := nodesLauncher(timeout)
	if err != nil {
		return err
	}
	return rankproc.Bench(ctx, c, l, func(group string, r, n, batch int) []string {
		return rankArgs(c, group, r, n, batch, timeout)
	}, emit)
}

// sweepNodes runs the sweep sw for every group size of sw.Shards with
// each rank in its own child process over gRPC (rankproc.Sweep).
func sweepNodes(ctx context.Context, sw collective.SweepConfig, timeout time.Duration, emit func(collective.SweepResult) error) error {
	l, err := nodesLauncher(timeout)
	if err != nil {
		return err
	}
	return rankproc.Sweep(ctx, sw, l, func(group string, r, n int) []string {
		return sweepRankArgs(sw, group, r, n, timeout)
	}, emit)
}
