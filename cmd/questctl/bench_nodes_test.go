//go:build unix

package main

import (
	"bufio"
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nodesQuick are tiny sizes for --nodes runs.
var nodesQuick = []string{"--steps", "20", "--warmup", "2", "--pages", "64", "--k", "8", "--json"}

// TestBenchCollectiveNodesUsage: --nodes mistakes are one-line usage
// errors (exit 2) before any process starts, and the hidden rank command
// refuses to run without its internal flags.
func TestBenchCollectiveNodesUsage(t *testing.T) {
	base := []string{"bench", "collective", "--transport", "grpc", "--batch", "1", "--steps", "5", "--warmup", "1", "--json"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodes", "1"}, "--nodes 1: want 2 to 64"},
		{[]string{"--nodes", "2,1"}, "--nodes 1: want 2 to 64"},
		{[]string{"--nodes", "0"}, "--nodes 0: want 2 to 64"},
		{[]string{"--nodes", "65"}, "--nodes 65: want 2 to 64"},
		{[]string{"--nodes", "2,x"}, "--nodes"},
		{[]string{"--nodes", ""}, "--nodes"},
		{[]string{"--nodes", "2", "--shards", "2"}, "--nodes and --shards"},
		{[]string{"--nodes", "2", "--transport", "inproc"}, "add it"},
		{[]string{"--nodes", "2", "--timeout", "0s"}, "--timeout 0s"},
		{[]string{"--nodes", "2", "--timeout", "soon"}, "--timeout"},
		{[]string{"--shards", "2", "--timeout", "5s"}, "--timeout: only with --nodes"},
		{[]string{"--nodes", "4", "--pages", "2", "--k", "1"}, "--nodes 4: more ranks than the 2 pages"},
		{[]string{"--nodes", "2", "--steps", "0"}, "--steps 0: want 1 to"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			code, out, stderr := runCLI(t, append(append([]string{}, base...), c.args...)...)
			if code != exitUsage || out != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, one line with %q", code, out, stderr, c.want)
			}
		})
	}
	for _, args := range [][]string{
		{"bench", "collective", "rank"},
		{"bench", "collective", "rank", "--rank", "0", "--size", "2", "--batch", "1"}, // no --group
		{"bench", "collective", "rank", "--group", "g", "--rank", "2", "--size", "2", "--batch", "1"},
	} {
		code, out, stderr := runCLI(t, args...)
		if code != exitUsage || out != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "rank") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a one-line usage error", args, code, out, stderr)
		}
	}
	// The bench collective usage lists --nodes but not the rank command.
	_, out, _ := runCLI(t, "bench", "collective", "--help")
	if !strings.Contains(out, "-nodes") || strings.Contains(out, "collective rank") {
		t.Errorf("--help does not document --nodes, or shows the internal rank command:\n%s", out)
	}
}

// TestBenchCollectiveGRPCAlone: --transport grpc on its own runs (it was
// refused as an unknown transport before --nodes needed it).
func TestBenchCollectiveGRPCAlone(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "collective", "--transport", "grpc", "--shards", "2", "--batch", "1", "--steps", "5", "--warmup", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if res := collectiveLines(t, out); len(res) != 1 || res[0].Transport != "grpc" || res[0].Processes != 1 {
		t.Errorf("lines %+v, want one grpc line run in 1 process", res)
	}
}

// buildQuestctl builds the real questctl into a temporary folder: the
// children of --nodes are this program's own executable, which in a test
// would be the test binary.
func buildQuestctl(t *testing.T) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build questctl with")
	}
	bin := filepath.Join(t.TempDir(), "questctl")
	b := exec.Command(goCmd, "build", "-o", bin, "github.com/questrt/questrt/cmd/questctl")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("go build questctl: %v\n%s", err, out)
	}
	return bin
}

// pidsRE matches the progress line of a --nodes configuration.
var pidsRE = regexp.MustCompile(`one process per rank \(pids ([0-9 ]+)\)`)

// rankPIDs returns the child pids of every progress line in stderr.
func rankPIDs(t *testing.T, stderr string) []int {
	t.Helper()
	var pids []int
	for _, m := range pidsRE.FindAllStringSubmatch(stderr, -1) {
		for _, f := range strings.Fields(m[1]) {
			p, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, p)
		}
	}
	return pids
}

// checkGone fails t for every pid that is still a process (running or an
// unreaped zombie).
func checkGone(t *testing.T, pids []int) {
	t.Helper()
	for _, p := range pids {
		if err := syscall.Kill(p, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("child pid %d still exists after questctl exited (kill 0: %v)", p, err)
		}
	}
}

// TestBenchCollectiveNodes runs the real questctl binary: ranks in
// processes print the same JSON lines as goroutines (plus "processes"),
// and a child that is killed or stops fails the run within --timeout,
// leaving no process behind.
func TestBenchCollectiveNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds questctl and starts processes")
	}
	bin := buildQuestctl(t)

	t.Run("json", func(t *testing.T) {
		args := append([]string{"bench", "collective", "--transport", "inproc,grpc", "--nodes", "2", "--batch", "1,2"}, nodesQuick...)
		cmd := exec.Command(bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stderr.String())
		}
		res := collectiveLines(t, stdout.String())
		if len(res) != 4 {
			t.Fatalf("%d lines, want inproc then grpc for batches 1 and 2:\n%s", len(res), stdout.String())
		}
		for i, r := range res {
			wantTr, wantProcs := "inproc", 1
			if i >= 2 {
				wantTr, wantProcs = "grpc", 2
			}
			if r.Transport != wantTr || r.Processes != wantProcs || r.Shards != 2 || r.Batch != 1+i%2 || r.Steps != 20 || r.K != 8 ||
				!(r.SelectP50 > 0 && r.SelectP50 <= r.SelectP99 && r.MergeP50 > 0 && r.MergeP50 <= r.MergeP99) ||
				r.SelectMsgs != 2 || r.MergeMsgs != 1 {
				t.Errorf("line %d: %+v; want %s in %d processes, shards 2, batch %d, positive ordered latencies", i, r, wantTr, wantProcs, 1+i%2)
			}
		}
		for i := range 2 {
			if a, b := res[i], res[i+2]; a.SelectBytes != b.SelectBytes || a.MergeBytes != b.MergeBytes {
				t.Errorf("goroutines %+v vs processes %+v: the same exchange should move the same bytes", a, b)
			}
		}
		pids := rankPIDs(t, stderr.String())
		if len(pids) != 4 {
			t.Errorf("stderr names %d child pids, want 2 per grpc configuration:\n%s", len(pids), stderr.String())
		}
		checkGone(t, pids)
	})

	// fail starts a long --nodes 3 run, does hurt to one child once all
	// have started and returns the exit code, the last stderr line, the
	// time it took after hurt and the child pids.
	fail := func(t *testing.T, timeout string, hurt func(pid int) error) (int, string, time.Duration, []int) {
		t.Helper()
		args := []string{"bench", "collective", "--transport", "grpc", "--nodes", "3", "--batch", "1",
			"--steps", "200000", "--warmup", "2", "--pages", "64", "--k", "8", "--timeout", timeout, "--json"}
		cmd := exec.Command(bin, args...)
		errPipe, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		sc := bufio.NewScanner(errPipe)
		var pids []int
		var last string
		var hurtAt time.Time
		for sc.Scan() {
			last = sc.Text()
			if pids == nil {
				if pids = rankPIDs(t, last); pids != nil {
					time.Sleep(200 * time.Millisecond) // into the measured loop
					if err := hurt(pids[1]); err != nil {
						t.Fatal(err)
					}
					hurtAt = time.Now()
				}
			}
		}
		err = cmd.Wait()
		took := time.Since(hurtAt)
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("questctl: %v, want an exit status; last stderr line %q", err, last)
		}
		if len(pids) != 3 {
			t.Fatalf("child pids %v, want 3", pids)
		}
		return ee.ExitCode(), last, took, pids
	}

	t.Run("killed", func(t *testing.T) {
		code, last, took, pids := fail(t, "30s", func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) })
		if code != exitFailure || !strings.HasPrefix(last, "questctl bench collective nodes=3 batch=1: rank ") || !strings.Contains(last, "rank 1") {
			t.Errorf("exit %d, last stderr line %q; want 1 and one line naming rank 1", code, last)
		}
		if took > 10*time.Second {
			t.Errorf("took %v after the kill to fail", took)
		}
		checkGone(t, pids)
	})

	t.Run("stopped", func(t *testing.T) {
		// A stopped child never reports; the others wait for it.
		code, last, took, pids := fail(t, "3s", func(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) })
		if code != exitFailure || !strings.Contains(last, "did not report within 3s (--timeout)") || !strings.Contains(last, "1 (pid "+strconv.Itoa(pids[1])+")") {
			t.Errorf("exit %d, last stderr line %q; want 1 and the ranks that did not report within 3s", code, last)
		}
		if took > 10*time.Second {
			t.Errorf("took %v after the stop to fail, with --timeout 3s", took)
		}
		checkGone(t, pids)
	})
}
