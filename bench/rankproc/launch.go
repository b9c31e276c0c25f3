package rankproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// rankEvent is what a child's watcher reports: its hello, then (last) its
// report or why it has none. A final event comes after the child was
// reaped.
type rankEvent struct {
	rank     int
	hello    *Hello
	report   json.RawMessage
	err      error
	signaled bool // a signal ended the child
	final    bool
}

// Launcher starts the child processes of one configuration.
type Launcher struct {
	// Exe is the program to start (RunRank behind the command line the
	// caller gives).
	Exe string
	// Timeout is the longest one configuration may take, from starting
	// its processes to their reports.
	Timeout time.Duration
	// SysProcAttr, when set, gives each child's attributes (on Linux: a
	// signal when the parent dies).
	SysProcAttr func() *syscall.SysProcAttr
}

// Run runs one configuration on n child processes, rank r's with the
// command line args(r), and returns each rank's report line, by rank.
// Once they run it writes what, with their pids, to progress (when set).
// Whatever happens, every child has exited and been reaped when it
// returns.
func (l Launcher) Run(parent context.Context, n int, progress io.Writer, what string, args func(r int) []string) ([]json.RawMessage, error) {
	exe, timeout := l.Exe, l.Timeout
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
		if l.SysProcAttr != nil {
			cmd.SysProcAttr = l.SysProcAttr()
		}
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
					peers, _ := json.Marshal(Peers{Peers: addrs})
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
	var hello Hello
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
