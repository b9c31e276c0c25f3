package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// lockedBuffer is a bytes.Buffer safe for a writer and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// questdProc is a questd process: this test binary run as questd.
type questdProc struct {
	cmd    *exec.Cmd
	stdout *os.File // the read end of its stdout
	ready  map[string]string
	stderr *lockedBuffer
	done   chan error // Wait's result
}

// startQuestd starts questd with args and waits for its ready line; the
// test's cleanup kills it if it still runs.
func startQuestd(t *testing.T, args ...string) *questdProc {
	t.Helper()
	return startQuestdEnv(t, nil, args...)
}

// startQuestdEnv is startQuestd with env (NAME=value) added to the
// process's environment.
func startQuestdEnv(t *testing.T, env []string, args ...string) *questdProc {
	t.Helper()
	p, err := spawnQuestdEnv(t, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	awaitReady(t, p)
	return p
}

// awaitReady waits for the ready line of p (spawned) and parses it into
// p.ready.
func awaitReady(t *testing.T, p *questdProc) {
	t.Helper()
	lines := make(chan string, 1)
	go func() { // ends at EOF, when the process ends
		br := bufio.NewReader(p.stdout)
		line, _ := br.ReadString('\n')
		lines <- line
		_, _ = br.WriteTo(io.Discard)
	}()
	select {
	case line := <-lines:
		if err := json.Unmarshal([]byte(line), &p.ready); err != nil || p.ready["grpc"] == "" {
			t.Fatalf("questd ready line %q: %v\nstderr:\n%s", line, err, p.stderr.String())
		}
	case err := <-p.done:
		t.Fatalf("questd exited before its ready line: %v\nstderr:\n%s", err, p.stderr.String())
	case <-time.After(time.Minute):
		// Only a bound on a hang: a -race questd loading its model on
		// a loaded 2-core machine took over 20 s to be ready.
		t.Fatalf("questd printed no ready line in a minute\nstderr:\n%s", p.stderr.String())
	}
}

// spawnQuestd starts the process without waiting for anything.
func spawnQuestd(t *testing.T, args ...string) (*questdProc, error) {
	t.Helper()
	return spawnQuestdEnv(t, nil, args...)
}

// spawnQuestdEnv is spawnQuestd with env added to the environment.
func spawnQuestdEnv(t *testing.T, env []string, args ...string) (*questdProc, error) {
	t.Helper()
	return spawnQuestdVia(t, nil, env, args...)
}

// spawnQuestdVia is spawnQuestdEnv with the process started by the
// command wrap, given questd's path and arguments after its own (none:
// questd itself).
func spawnQuestdVia(t *testing.T, wrap, env []string, args ...string) (*questdProc, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := append(append(slices.Clone(wrap), exe), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), asQuestdEnv+"=1"), env...)
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	p := &questdProc{cmd: cmd, stdout: r, stderr: &lockedBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = w, p.stderr
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	w.Close()
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-p.done:
			p.done <- err
		default:
			cmd.Process.Kill()
		}
		r.Close()
		if t.Failed() {
			t.Logf("questd %v stderr:\n%s", args, p.stderr.String())
		}
	})
	return p, nil
}

// wait waits up to d for the process to end and returns its exit code.
func (p *questdProc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(d):
		t.Fatalf("questd did not exit within %v", d)
		return -1
	}
}

// logRecords returns the JSON log records of the process with message msg.
func (p *questdProc) logRecords(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// recovered returns the recovered sequences the process logged: for each
// its lengths per layer and lost tokens, by worker sequence id, in log
// order.
func (p *questdProc) recovered() []string {
	var out []string
	for _, r := range p.logRecords("worker server: recovered sequence") {
		out = append(out, fmt.Sprintf("seq %v lens %v lost %v", r["seq"], r["lens"], r["lost_tokens"]))
	}
	return out
}

// recoveredN is recovered once it lists n sequences, or after 5 s: the
// process logs them before its answer to the create that opened the
// grid, but its stderr reaches p.stderr through a pipe, which the test
// may read first.
func (p *questdProc) recoveredN(n int) []string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := p.recovered()
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestQuestdKill9Recovery runs questd as a process with --data-dir:
// sequences get appends that seal pages and leave tails, then kill -9.
// The restarted questd (a second questd on the same directory meanwhile
// refuses to start, naming it) recovers them when the same grid opens
// again (the first create after the restart): their sealed pages come
// back, the tail tokens are reported lost exactly (in the log and in
// questrt_recovery_lost_tokens), the coordinator adopts them (none stay
// parked), and new sequences work next to them. A SIGTERM then persists every sequence in full, tails and
// uneven layer lengths included: the third questd recovers them all with
// nothing lost.
func TestQuestdKill9Recovery(t *testing.T) {
	dir := t.TempDir()
	args := func(name string) []string {
		a := slices.Clone(smallNode)
		for i := range a {
			if a[i] == "m0" {
				a[i] = name
			}
		}
		return append(a, "--data-dir", dir, "--log-format", "json")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(4, 4))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	dial := func(p *questdProc) *client.Client {
		c, err := client.Dial(ctx, p.ready["grpc"], client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// create makes a sequence of n tokens in every layer.
	create := func(c *client.Client, n int) string {
		t.Helper()
		g := c.Geometry()
		id, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		kv := g.KVHeads * g.HeadDim
		for l := range g.Layers {
			if n > 0 {
				if err := c.Append(ctx, id, l, vec(n*kv), vec(n*kv)); err != nil {
					t.Fatal(err)
				}
			}
		}
		return id
	}
	gauge := func(p *questdProc, name string, labels ...string) float64 {
		return metric(t, scrape(t, p.ready["metrics"]), name, labels...).GetGauge().GetValue()
	}

	// Page size 4: 39 tokens are 9 sealed pages and 3 tail tokens, 42
	// are 10 pages and 2.
	p1 := startQuestd(t, args("m0")...)
	c1 := dial(p1)
	create(c1, 39)
	create(c1, 42)
	if err := p1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p1.wait(t, 10*time.Second); code != -1 {
		t.Fatalf("questd after kill -9: exit code %d, want -1 (signal)", code)
	}

	p2 := startQuestd(t, args("m0")...)
	// A second questd on the same directory refuses to start, before
	// anything starts: exit 2, one line.
	p3, err := spawnQuestd(t, args("m1")...)
	if err != nil {
		t.Fatal(err)
	}
	if code := p3.wait(t, 20*time.Second); code != 2 {
		t.Fatalf("second questd on %s: exit code %d, want 2", dir, code)
	}
	if msg := p3.stderr.String(); !strings.Contains(msg, dir) || !strings.Contains(msg, "in use") || strings.Count(msg, "\n") != 1 {
		t.Fatalf("second questd on %s: stderr does not name the directory in use:\n%s", dir, msg)
	}
	t.Logf("second questd: %s", strings.TrimSpace(p3.stderr.String()[strings.LastIndex(strings.TrimSpace(p3.stderr.String()), "\n")+1:]))
	if got := gauge(p2, "questrt_recovery_sequences", "state", "recovered"); got != 0 {
		t.Fatalf("recovered %v sequences before the grid opened again, want 0", got)
	}
	c2 := dial(p2)
	c3 := create(c2, 10) // opens the grid again: recovery
	for _, r := range p2.logRecords("worker server: grid recovered") {
		t.Logf("after kill -9: %v", r)
	}
	want := []string{"seq 1 lens [36 36] lost 3", "seq 2 lens [40 40] lost 2"}
	if got := p2.recoveredN(len(want)); !slices.Equal(got, want) {
		t.Fatalf("after kill -9 recovered %q, want %q", got, want)
	}
	// The coordinator adopted both when the grid opened: none parked.
	for _, w := range []struct {
		labels []string
		n      float64
	}{{[]string{"state", "recovered"}, 2}, {[]string{"state", "parked"}, 0}, {[]string{"state", "damaged"}, 0}} {
		if got := gauge(p2, "questrt_recovery_sequences", w.labels...); got != w.n {
			t.Errorf("questrt_recovery_sequences%v = %v, want %v", w.labels, got, w.n)
		}
	}
	if got := gauge(p2, "questrt_recovery_lost_tokens"); got != 5 {
		t.Errorf("questrt_recovery_lost_tokens = %v, want 5 (3 + 2 tail tokens)", got)
	}
	if got := gauge(p2, "questrt_recovery_corrupt_slots"); got != 0 {
		t.Errorf("questrt_recovery_corrupt_slots = %v, want 0", got)
	}
	// The new sequence decodes next to the adopted ones: one layer-0
	// step with a new token (layer 0 gets 11 tokens, layer 1 keeps 10).
	g := c2.Geometry()
	if _, err := c2.Step(ctx, 0, []client.Item{{Seq: c3, Q: vec(g.QHeads * g.HeadDim), K: vec(g.KVHeads * g.HeadDim), V: vec(g.KVHeads * g.HeadDim)}}, client.StepOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p2.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("questd after SIGTERM: exit code %d, want 0", code)
	}

	// After the graceful stop nothing is lost: the parked sequences
	// with the lengths they came back with, the new one with its tail
	// and its layers' uneven lengths.
	p4 := startQuestd(t, args("m0")...)
	create(dial(p4), 0)
	// The new sequence's number comes after the adopted ones'.
	want = []string{"seq 1 lens [36 36] lost 0", "seq 2 lens [40 40] lost 0", "seq 3 lens [11 10] lost 0"}
	if got := p4.recoveredN(len(want)); !slices.Equal(got, want) {
		t.Fatalf("after SIGTERM recovered %q, want %q", got, want)
	}
	if got := gauge(p4, "questrt_recovery_lost_tokens"); got != 0 {
		t.Errorf("questrt_recovery_lost_tokens = %v after a graceful stop, want 0", got)
	}
	if got := gauge(p4, "questrt_recovery_sequences", "state", "recovered"); got != 3 {
		t.Errorf("questrt_recovery_sequences{state=recovered} = %v, want 3", got)
	}
	if err := p4.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p4.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("questd after SIGTERM: exit code %d, want 0", code)
	}
}

// TestPersistFlags: --data-dir, --durability and --sync-interval, from
// the command line, the environment and the config file, and their
// checks; the node gets them.
func TestPersistFlags(t *testing.T) {
	file := writeFile(t, "questd.yaml", "data-dir: /var/lib/questd\ndurability: periodic\nsync-interval: 250ms\n")
	c, err := load(t, nil, "--plaintext", "--config", file)
	if err != nil {
		t.Fatal(err)
	}
	if c.Storage.DataDir != "/var/lib/questd" || c.Storage.Durability != pagestore.SyncPeriodic || c.Storage.SyncInterval != 250*time.Millisecond {
		t.Fatalf("from the file: data dir %q, durability %v, sync interval %v", c.Storage.DataDir, c.Storage.Durability, c.Storage.SyncInterval)
	}
	c, err = load(t, map[string]string{"QUESTRT_DATA_DIR": "/env"}, "--plaintext", "--durability", "sync")
	if err != nil {
		t.Fatal(err)
	}
	if c.Storage.DataDir != "/env" || c.Storage.Durability != pagestore.SyncOnWrite {
		t.Fatalf("from the environment and the command line: data dir %q, durability %v", c.Storage.DataDir, c.Storage.Durability)
	}
	for _, bad := range [][]string{
		{"--durability", "always"},
		{"--sync-interval", "0s"},
		{"--data-dir", "/d", "--selection", "replicated"},
	} {
		if _, err := load(t, nil, append([]string{"--plaintext"}, bad...)...); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("%v: %v, want an error naming %s", bad, err, bad[0])
		}
	}
}

// TestQuestdKill9Adopt drives a recovered sequence through the client
// API across two kill -9 restarts of a questd with --data-dir, next to
// a questd without one that never stops (the reference). A sequence
// gets appends over several pages and decode steps, then kill -9; the
// restarted node's Recovered lists it under its old id with the length
// and lost tokens the recovery predicts (the sealed pages; with
// --durability sync the lost tail is exact), the client appends the lost
// tokens again, and the next decode steps equal the reference's bit for
// bit. The same after a second kill -9 (the id stays). After its release
// no page is in use and none is parked, and a node restarted once more
// recovers nothing.
func TestQuestdKill9Adopt(t *testing.T) {
	dir := t.TempDir()
	args := func(name string, persist bool) []string {
		a := slices.Clone(smallNode)
		for i := range a {
			if a[i] == "m0" {
				a[i] = name
			}
		}
		a = append(a, "--log-format", "json")
		if persist {
			a = append(a, "--data-dir", dir)
		}
		return a
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(5, 5))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	dial := func(p *questdProc) *client.Client {
		c, err := client.Dial(ctx, p.ready["grpc"], client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	gauge := func(p *questdProc, name string, labels ...string) float64 {
		return metric(t, scrape(t, p.ready["metrics"]), name, labels...).GetGauge().GetValue()
	}
	kill := func(p *questdProc) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 10*time.Second); code != -1 {
			t.Fatalf("questd after kill -9: exit code %d, want -1 (signal)", code)
		}
	}

	ref := dial(startQuestd(t, args("r0", false)...))
	p := startQuestd(t, args("m0", true)...)
	c := dial(p)
	g := c.Geometry()
	kv := g.KVHeads * g.HeadDim
	// hist holds every token's key and value of each layer, for the
	// re-appends.
	hist := make([][2][]float32, g.Layers)
	appendBoth := func(seq, rseq string, n int) {
		t.Helper()
		for l := range g.Layers {
			k, v := vec(n*kv), vec(n*kv)
			for _, x := range []struct {
				c  *client.Client
				id string
			}{{c, seq}, {ref, rseq}} {
				if err := x.c.Append(ctx, x.id, l, k, v); err != nil {
					t.Fatal(err)
				}
			}
			hist[l][0], hist[l][1] = append(hist[l][0], k...), append(hist[l][1], v...)
		}
	}
	// step runs one decode step (every layer, a new token each) on both
	// nodes and compares the outputs bit for bit.
	step := func(seq, rseq string) {
		t.Helper()
		for l := range g.Layers {
			q, k, v := vec(g.QHeads*g.HeadDim), vec(kv), vec(kv)
			got, err := c.Step(ctx, l, []client.Item{{Seq: seq, Q: q, K: k, V: v}}, client.StepOptions{})
			if err != nil {
				t.Fatalf("step layer %d of %s: %v", l, seq, err)
			}
			want, err := ref.Step(ctx, l, []client.Item{{Seq: rseq, Q: q, K: k, V: v}}, client.StepOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !equalBits(got.O, want.O) || !equalBits(got.LSE, want.LSE) {
				t.Fatalf("layer %d: the output of %s differs from the reference that never stopped", l, seq)
			}
			hist[l][0], hist[l][1] = append(hist[l][0], k...), append(hist[l][1], v...)
		}
	}
	seq, _, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rseq, _, err := ref.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	// Page size 4: 37 tokens and one step are 9 sealed pages and 2 tail
	// tokens (the budget of 24 tokens reads 6 of the 10 pages).
	appendBoth(seq, rseq, 37)
	step(seq, rseq)
	wantLens := []int{36, 40} // after each kill: the sealed pages
	for round, n := range wantLens {
		kill(p)
		p = startQuestd(t, args("m0", true)...)
		c = dial(p)
		recs, dmg, err := c.Recovered(ctx)
		if err != nil {
			t.Fatal(err)
		}
		had := len(hist[0][0]) / kv
		if len(recs) != 1 || len(dmg) != 0 {
			t.Fatalf("restart %d: recovered %+v, damaged %+v; want one sequence", round+1, recs, dmg)
		}
		r := recs[0]
		t.Logf("restart %d: recovered %+v", round+1, r)
		if r.ID != seq || r.RenamedFrom != "" || r.Len != n || !slices.Equal(r.Lens, []int{n, n}) || r.Had != had || r.LostTokens != had-n {
			t.Fatalf("restart %d: recovered %+v, want %s of length %d, had %d, lost %d", round+1, r, seq, n, had, had-n)
		}
		if got, err := c.Len(ctx, seq); err != nil || got != n {
			t.Fatalf("restart %d: length of %s: %d, %v; want %d", round+1, seq, got, err, n)
		}
		if st, err := c.Status(ctx); err != nil || len(st.GetRecovered()) != 1 || st.GetRecovered()[0].GetSequence() != seq || st.GetSequences() != 1 {
			t.Fatalf("restart %d: status %v (%v): want the recovered sequence", round+1, st, err)
		}
		if got := gauge(p, "questrt_recovery_sequences", "state", "parked"); got != 0 {
			t.Fatalf("restart %d: %v sequences parked after the adoption, want 0", round+1, got)
		}
		// The lost tail again, from position n, then steps.
		for l := range g.Layers {
			if err := c.Append(ctx, seq, l, hist[l][0][n*kv:], hist[l][1][n*kv:]); err != nil {
				t.Fatalf("restart %d: re-append layer %d: %v", round+1, l, err)
			}
		}
		step(seq, rseq)
		appendBoth(seq, rseq, 4) // 43 tokens before the second kill: 10 sealed pages
		// A new sequence next to it gets a new id.
		other, _, err := c.Create(ctx, plan.Striped)
		if err != nil || other == seq {
			t.Fatalf("restart %d: create: %q, %v", round+1, other, err)
		}
		if err := c.Release(ctx, other); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release(ctx, seq); err != nil {
		t.Fatal(err)
	}
	if got := gauge(p, "questrt_tier_pages", "tier", "device"); got != 0 {
		t.Fatalf("%v pages in use after the release, want 0", got)
	}
	if st, err := c.Status(ctx); err != nil || len(st.GetRecovered()) != 0 || st.GetSequences() != 0 {
		t.Fatalf("status after the release: %v (%v)", st, err)
	}
	// Nothing comes back after another restart: no pile-up.
	kill(p)
	p = startQuestd(t, args("m0", true)...)
	c = dial(p)
	if recs, dmg, err := c.Recovered(ctx); err != nil || len(recs) != 0 || len(dmg) != 0 {
		t.Fatalf("after the release and a restart: recovered %+v, damaged %+v, %v; want none", recs, dmg, err)
	}
	for _, w := range []struct {
		name   string
		labels []string
	}{{"questrt_tier_pages", []string{"tier", "device"}}, {"questrt_recovery_sequences", []string{"state", "parked"}}} {
		if got := gauge(p, w.name, w.labels...); got != 0 {
			t.Errorf("after the release and a restart: %s%v = %v, want 0", w.name, w.labels, got)
		}
	}
}

// equalBits reports whether a and b hold the same float32 bits.
func equalBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestRecoveryVerifyFlags: --recovery-verify and --scrub-rate, their
// defaults (on-read, 64 MiB/s), from the config file, the environment
// and the command line, and the errors naming them for bad values.
func TestRecoveryVerifyFlags(t *testing.T) {
	c, err := load(t, nil, "--plaintext")
	if err != nil {
		t.Fatal(err)
	}
	if c.Storage.Verify != pagestore.VerifyOnRead || c.Storage.ScrubRate != pagestore.DefaultScrubRate {
		t.Fatalf("defaults: verify %v, scrub rate %d; want on-read, %d", c.Storage.Verify, c.Storage.ScrubRate, pagestore.DefaultScrubRate)
	}
	file := writeFile(t, "questd.yaml", "data-dir: /var/lib/questd\nrecovery-verify: at-open\nscrub-rate: 8MiB\n")
	if c, err = load(t, nil, "--plaintext", "--config", file); err != nil {
		t.Fatal(err)
	}
	if c.Storage.Verify != pagestore.VerifyAtOpen || c.Storage.ScrubRate != 8<<20 {
		t.Fatalf("from the file: verify %v, scrub rate %d", c.Storage.Verify, c.Storage.ScrubRate)
	}
	if c, err = load(t, map[string]string{"QUESTRT_RECOVERY_VERIFY": "on-read"}, "--plaintext", "--scrub-rate", "off"); err != nil {
		t.Fatal(err)
	}
	if c.Storage.Verify != pagestore.VerifyOnRead || c.Storage.ScrubRate != -1 {
		t.Fatalf("from the environment and the command line: verify %v, scrub rate %d", c.Storage.Verify, c.Storage.ScrubRate)
	}
	for _, bad := range []struct{ flag, val, want string }{
		{"--recovery-verify", "lazy", "want at-open or on-read"},
		{"--recovery-verify", "", "want at-open or on-read"},
		{"--scrub-rate", "0", "above 0"},
		{"--scrub-rate", "-5", "above 0"},
		{"--scrub-rate", "fast", "above 0"},
	} {
		_, err := load(t, nil, "--plaintext", bad.flag, bad.val)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(bad.flag, "--")) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s %q: %v, want an error naming %s and saying %q", bad.flag, bad.val, err, bad.flag, bad.want)
		}
	}
}
