package main

// One process per rank for `questctl bench collective --nodes`: the parent
// (benchNodes) starts N children of itself, `questctl bench collective
// rank` (hidden, internal flags required), and coordinates them over their
// stdin and stdout:
//
//	child  -> parent  {"rank":R,"pid":P,"addr":"127.0.0.1:PORT"}  once it listens
//	parent -> child   {"peers":["ADDR0","ADDR1",...]}               once all listen
//	child  -> parent  collective.BenchSamples as one JSON line      at the end
//	                  (collective.SweepSamples for a sweep: --min-bytes given)
//
// then the child exits 0. A child stops when its stdin closes (the parent
// is gone) or its --timeout passes; on Linux it also gets SIGTERM when the
// parent dies (childSysProcAttr).

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/grpctransport"
	"github.com/questrt/questrt/internal/memlimit"
)

const (
	// rankCommand, after `bench collective`, runs one rank: the hidden
	// child command of --nodes.
	rankCommand = "rank"
	// maxBenchNodes is the largest --nodes: processes on one host.
	maxBenchNodes = 64
	// defaultNodesTimeout is --timeout's default.
	defaultNodesTimeout = 60 * time.Second
	// childTimeoutMargin is how much later than the parent's deadline a
	// child's own passes.
	childTimeoutMargin = 5 * time.Second
	// failGrace is how long a failed configuration waits for the other
	// ranks' failures, to name the one that caused them.
	failGrace = 500 * time.Millisecond
)

// rankHello is a child's first stdout line.
type rankHello struct {
	Rank int    `json:"rank"`
	PID  int    `json:"pid"`
	Addr string `json:"addr"`
}

// rankPeers is the line the parent writes to every child's stdin.
type rankPeers struct {
	Peers []string `json:"peers"`
}

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
	timeout := fs.Duration("timeout", defaultNodesTimeout, "the longest the rank may run")
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
	if *size < 2 || *size > maxBenchNodes || *rank < 0 || *rank >= *size || *timeout <= 0 {
		return usageError{fmt.Errorf("rank: --rank %d --size %d --timeout %v: want 0 <= rank < size, size 2 to %d, a positive timeout", *rank, *size, *timeout, maxBenchNodes)}
	}
	c.Transport = "grpc"
	c.MaxMemory = memlimit.NoLimit // the parent checked the group's
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("rank %d: %w", *rank, err)
	}
	defer ln.Close() // the transport closes it too; a second Close is harmless
	if err := bench.WriteJSONLine(stdout, rankHello{Rank: *rank, PID: os.Getpid(), Addr: ln.Addr().String()}); err != nil {
		return fmt.Errorf("rank %d: %w", *rank, err)
	}
	peers, err := readPeers(ctx, cancel, stdin)
	if err != nil {
		return fmt.Errorf("rank %d: peers: %w", *rank, err)
	}
	if len(peers) != *size || peers[*rank] != ln.Addr().String() {
		return fmt.Errorf("rank %d: peers %q: want %d addresses with this rank's, %s, at %d", *rank, peers, *size, ln.Addr(), *rank)
	}
	cfg := grpctransport.DefaultConfig()
	cfg.Group, cfg.Rank, cfg.Peers, cfg.Listener, cfg.Plaintext = *group, *rank, peers, ln, true
	if sweep {
		sw.Steps, sw.Warmup, sw.MaxMemory, sw.Shards = c.Steps, c.Warmup, memlimit.NoLimit, []int{*size}
		cfg.MaxMessageBytes = max(cfg.MaxMessageBytes, int(sw.MaxMsgBytes()))
	}
	tr, err := grpctransport.New(ctx, cfg)
	if err != nil {
		return fmt.Errorf("rank %d: connect: %w", *rank, err)
	}
	defer tr.Close()
	if sweep {
		samples, err := collective.SweepRank(ctx, sw, tr)
		if err != nil {
			return err
		}
		return bench.WriteJSONLine(stdout, samples)
	}
	samples, err := collective.BenchRank(ctx, c, *batch, tr)
	if err != nil {
		return err
	}
	return bench.WriteJSONLine(stdout, samples)
}

// readPeers reads the parent's peers line from stdin, then keeps reading
// it on a goroutine and calls cancel when it closes: the parent is gone,
// or done with this rank.
func readPeers(ctx context.Context, cancel context.CancelFunc, stdin io.Reader) ([]string, error) {
	type result struct {
		peers []string
		err   error
	}
	got := make(chan result, 1)
	go func() {
		br := bufio.NewReader(stdin)
		line, err := br.ReadBytes('\n')
		if err != nil {
			got <- result{err: fmt.Errorf("stdin: %w", err)}
			cancel()
			return
		}
		var p rankPeers
		if err := json.Unmarshal(line, &p); err != nil {
			got <- result{err: fmt.Errorf("stdin: %w", err)}
			cancel()
			return
		}
		got <- result{peers: p.Peers}
		io.Copy(io.Discard, br)
		cancel()
	}()
	select {
	case r := <-got:
		return r.peers, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
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
		"--timeout", (timeout + childTimeoutMargin).String(),
		"--steps", strconv.Itoa(c.Steps), "--warmup", strconv.Itoa(c.Warmup),
	}
}

// benchNodes runs every (nodes, batch) configuration of c with each rank
// in its own child process over gRPC, and emits each result as
// BenchCollective does, with Processes set.
func benchNodes(ctx context.Context, c collective.BenchConfig, timeout time.Duration, emit func(collective.BenchResult) error) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench collective --nodes: this program's path: %w", err)
	}
	for _, n := range c.Shards {
		for _, b := range c.Batches {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("bench collective: %w", err)
			}
			what := fmt.Sprintf("bench collective: nodes %d batch %d: %d + %d layer-steps over grpc, one process per rank",
				n, b, c.Warmup, c.Steps)
			group := "bench-" + rand.Text()
			reports, err := runRanks(ctx, exe, n, timeout, c.Progress, what, func(r int) []string {
				return rankArgs(c, group, r, n, b, timeout)
			})
			var res collective.BenchResult
			if err == nil {
				samples := make([]collective.BenchSamples, n)
				for r, rep := range reports {
					if err = json.Unmarshal(rep, &samples[r]); err != nil {
						err = fmt.Errorf("rank %d wrote a bad report: %w", r, err)
						break
					}
				}
				if err == nil {
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

// sweepNodes runs the sweep sw for every group size of sw.Shards with
// each rank in its own child process over gRPC, and emits each result as
// BenchSweep does, with Processes set.
func sweepNodes(ctx context.Context, sw collective.SweepConfig, timeout time.Duration, emit func(collective.SweepResult) error) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench collective --nodes: this program's path: %w", err)
	}
	for _, n := range sw.Shards {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("bench collective: %w", err)
		}
		what := fmt.Sprintf("bench collective: all-gather sweep, nodes %d: %d sizes, %d + %d rounds each over grpc, one process per rank",
			n, len(sw.MsgSizes(n)), sw.Warmup, sw.Steps)
		group := "bench-" + rand.Text()
		reports, err := runRanks(ctx, exe, n, timeout, sw.Progress, what, func(r int) []string {
			return sweepRankArgs(sw, group, r, n, timeout)
		})
		var res []collective.SweepResult
		if err == nil {
			samples := make([]collective.SweepSamples, n)
			for r, rep := range reports {
				if err = json.Unmarshal(rep, &samples[r]); err != nil {
					err = fmt.Errorf("rank %d wrote a bad report: %w", r, err)
					break
				}
			}
			if err == nil {
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

// rankEvent is what a child's watcher reports: its hello, then (last) its
// report or why it has none. A final event comes after the child was
// reaped.
type rankEvent struct {
	rank     int
	hello    *rankHello
	report   json.RawMessage
	err      error
	signaled bool // a signal ended the child
	final    bool
}

// runRanks runs one configuration on n child processes, rank r's with
// the command line args(r), and returns each rank's report line, by rank.
// Once they run it writes what, with their pids, to progress (when set).
// Whatever happens, every child has exited and been reaped when it
// returns.
func runRanks(parent context.Context, exe string, n int, timeout time.Duration, progress io.Writer, what string, args func(r int) []string) ([]json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	var wg sync.WaitGroup
	defer func() {
		cancel() // kills the children still running (exec.CommandContext)
		wg.Wait()
	}()
	events := make(chan rankEvent, 2*n)
	stdins := make([]io.WriteCloser, n)
	pids := make([]int, n)
	for r := range n {
		cmd := exec.CommandContext(ctx, exe, args(r)...)
		cmd.SysProcAttr = childSysProcAttr()
		cmd.WaitDelay = time.Second // a grandchild holding a pipe cannot hang Wait
		errTail := &tailBuffer{max: 4 << 10}
		cmd.Stderr = errTail
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start rank %d (%s): %w", r, exe, err)
		}
		stdins[r], pids[r] = stdin, cmd.Process.Pid
		wg.Go(func() { watchRank(r, cmd, stdout, errTail, events) })
	}
	if progress != nil {
		fmt.Fprintf(progress, "%s (pids %s)\n", what, strings.Trim(fmt.Sprint(pids), "[]"))
	}

	addrs := make([]string, n)
	reports := make([]json.RawMessage, n)
	listening, reported := 0, make([]bool, n)
	// The first rank to fail is often not the cause (its peer was killed
	// and it noticed first): gather failures for failGrace and name a rank
	// that a signal ended, if any, else the first.
	var failures []rankEvent
	var grace <-chan time.Time
	failed := func() error {
		f := failures[0]
		for _, e := range failures {
			if e.signaled {
				f = e
				break
			}
		}
		return fmt.Errorf("rank %d (pid %d) %w", f.rank, pids[f.rank], f.err)
	}
	for done := 0; done < n; {
		select {
		case ev := <-events:
			switch {
			case ev.err != nil:
				failures = append(failures, ev)
				done++
				if grace == nil {
					grace = time.After(failGrace)
				}
			case ev.hello != nil:
				if ev.hello.Rank != ev.rank || ev.hello.Addr == "" {
					return nil, fmt.Errorf("rank %d (pid %d): bad first line %+v", ev.rank, pids[ev.rank], *ev.hello)
				}
				addrs[ev.rank] = ev.hello.Addr
				if listening++; listening == n {
					// A child that died meanwhile reports it; its write
					// error says less.
					peers, _ := json.Marshal(rankPeers{Peers: addrs})
					for _, w := range stdins {
						w.Write(append(peers, '\n'))
					}
				}
			case ev.final:
				reports[ev.rank], reported[ev.rank] = ev.report, true
				done++
			}
		case <-grace:
			return nil, failed()
		case <-ctx.Done():
			if err := parent.Err(); err != nil {
				return nil, err
			}
			if failures != nil {
				return nil, failed()
			}
			var missing []string
			for r, ok := range reported {
				if !ok {
					missing = append(missing, fmt.Sprintf("%d (pid %d)", r, pids[r]))
				}
			}
			what := "rank " + missing[0]
			if len(missing) > 1 {
				what = "ranks " + strings.Join(missing, ", ")
			}
			return nil, fmt.Errorf("%s did not report within %v (--timeout)", what, timeout)
		}
	}
	if failures != nil {
		return nil, failed()
	}
	return reports, nil
}

// watchRank reads rank r's stdout, reaps it and sends its events: the
// hello line, then a final event with the report (the child printed it
// and exited 0) or an error saying what went wrong.
func watchRank(r int, cmd *exec.Cmd, stdout io.Reader, errTail *tailBuffer, events chan<- rankEvent) {
	dec := json.NewDecoder(stdout)
	var hello rankHello
	var samples json.RawMessage
	var readErr error
	if readErr = dec.Decode(&hello); readErr == nil {
		events <- rankEvent{rank: r, hello: &hello}
		readErr = dec.Decode(&samples)
	}
	if readErr == nil {
		_, readErr = io.Copy(io.Discard, io.MultiReader(dec.Buffered(), stdout))
	}
	waitErr := cmd.Wait()
	var err error
	switch {
	case waitErr != nil:
		err = fmt.Errorf("failed (%v)", waitErr)
	case readErr != nil && !errors.Is(readErr, io.EOF):
		err = fmt.Errorf("wrote a bad report: %v", readErr)
	case readErr != nil:
		err = errors.New("exited before reporting")
	}
	if err != nil {
		if last := errTail.lastLine(); last != "" {
			err = fmt.Errorf("%w: %s", err, last)
		}
		var ee *exec.ExitError
		signaled := errors.As(waitErr, &ee) && ee.ExitCode() == -1
		events <- rankEvent{rank: r, err: err, signaled: signaled, final: true}
		return
	}
	events <- rankEvent{rank: r, report: samples, final: true}
}

// tailBuffer keeps the last max bytes written to it; safe for concurrent
// use (exec copies a child's stderr on its own goroutine).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = slices.Clone(t.b[len(t.b)-t.max:])
	}
	return len(p), nil
}

// lastLine is the last non-empty line written.
func (t *tailBuffer) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
