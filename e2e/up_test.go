package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/plan"
)

// geometryFlags is the small model every node of these tests runs, with
// fast failure detection.
var geometryFlags = []string{"--layers", "2", "--q-heads", "8", "--kv-heads", "4", "--head-dim", "16", "--page-size", "4",
	"--capacity-pages", "128", "--budget-tokens", "24", "--dense-layers", "1", "--step-timeout", "2s",
	"--probe-interval", "100ms", "--probe-timeout", "50ms", "--suspicion-mult", "2", "--gossip-interval", "50ms", "--dead-node-reclaim", "100ms",
	"--drain-timeout", "2s"}

type upNode struct {
	Name   string `json:"name"`
	GRPC   string `json:"grpc"`
	Gossip string `json:"gossip"`
	PID    int    `json:"pid"`
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// alive reports whether process pid exists.
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// waitMembers waits until the node at addr lists want members alive and,
// when dead is not "", that member dead.
func waitMembers(t *testing.T, addr string, want int, dead string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for {
		st, err := c.Status(ctx)
		n, gone := 0, dead == ""
		if err == nil {
			for _, m := range st.GetMembers() {
				if m.GetState() == "alive" {
					n++
				}
				gone = gone || (m.GetName() == dead && m.GetState() == "dead")
			}
			if n == want && gone {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %d members alive (%v), want %d", addr, n, err, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// The real binaries: questctl up --insecure starts 3 questd processes
// (plaintext: the test dials them without TLS); sequences
// decode through the client API; kill -9 of one node fails the steps of
// the sequences placed on it with UNAVAILABLE within the step deadline,
// while the others keep decoding; the node restarts under its name and
// rejoins, and new sequences are placed on it; SIGTERM to questctl up
// stops every node.
func TestUpKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	up := exec.Command(filepath.Join(bin, "questctl"), append([]string{"up", "--nodes", "3", "--cp", "2", "--json", "--insecure",
		"--questd", filepath.Join(bin, "questd"), "--timeout", "30s", "--"}, geometryFlags...)...)
	stdout, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	upErr := &syncWriter{}
	up.Stderr = upErr
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	var nodes []upNode
	var restarted *exec.Cmd
	t.Cleanup(func() {
		if restarted != nil && restarted.Process != nil {
			restarted.Process.Signal(syscall.SIGTERM)
			waitOrKill(restarted, 5*time.Second)
		}
		if up.ProcessState == nil {
			up.Process.Signal(syscall.SIGTERM)
			waitOrKill(up, 15*time.Second)
		}
		for _, n := range nodes {
			if alive(n.PID) {
				t.Errorf("%s (pid %d) outlived questctl up", n.Name, n.PID)
				syscall.Kill(n.PID, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			t.Logf("questctl up stderr:\n%s", tail(upErr.String(), 4000))
		}
	})
	lines := make(chan upNode, 3)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var n upNode
			if json.Unmarshal(sc.Bytes(), &n) == nil && n.Name != "" {
				lines <- n
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	deadline := time.After(40 * time.Second)
	for len(nodes) < 3 {
		select {
		case n := <-lines:
			nodes = append(nodes, n)
		case <-deadline:
			t.Fatalf("questctl up printed %d nodes in 40 s", len(nodes))
		}
	}
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(3, 4))
	const kv, qd = 4 * 16, 8 * 16
	type seq struct {
		id    string
		nodes []string
		c     *client.Client
	}
	dial := func(addr string) *client.Client {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, err := client.Dial(dctx, addr, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	step := func(s seq, c *client.Client) (time.Duration, error) {
		start := time.Now()
		_, err := c.Step(ctx, 1, []client.Item{{Seq: s.id, Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}}, client.StepOptions{})
		return time.Since(start), err
	}
	create := func(c *client.Client) seq {
		id, on, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		for l := range 2 {
			if err := c.Append(ctx, id, l, randVec(rng, 30*kv), randVec(rng, 30*kv)); err != nil {
				t.Fatal(err)
			}
		}
		return seq{id, on, c}
	}
	var seqs []seq
	for _, n := range nodes {
		seqs = append(seqs, create(dial(n.GRPC)))
	}
	for _, s := range seqs {
		if _, err := step(s, s.c); err != nil {
			t.Fatalf("%s: %v", s.id, err)
		}
	}
	uses := func(s seq, name string) bool {
		for _, n := range s.nodes {
			if n == name {
				return true
			}
		}
		return false
	}
	// The victim hosts a rank of a sequence it does not coordinate while
	// another sequence does not use it (placement is deterministic).
	victim := -1
	for i, n := range nodes {
		hit, miss := false, false
		for _, s := range seqs {
			hit = hit || (uses(s, n.Name) && s.nodes[0] != n.Name)
			miss = miss || !uses(s, n.Name)
		}
		if hit && miss {
			victim = i
			break
		}
	}
	if victim < 0 {
		t.Fatalf("no node fits as the victim: %+v", seqs)
	}
	v := nodes[victim]
	if err := syscall.Kill(v.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, s := range seqs {
		if s.nodes[0] == v.Name {
			continue
		}
		took, err := step(s, s.c)
		switch {
		case uses(s, v.Name) && status.Code(err) != codes.Unavailable:
			t.Fatalf("%s on %v after kill -9 of %s: %v, want UNAVAILABLE", s.id, s.nodes, v.Name, err)
		case uses(s, v.Name) && took > 3*time.Second:
			t.Fatalf("%s: the failed step took %v (step deadline 2s)", s.id, took)
		case !uses(s, v.Name) && err != nil:
			t.Fatalf("%s on %v does not use %s but failed: %v", s.id, s.nodes, v.Name, err)
		}
		t.Logf("%s on %v: step after the kill took %v (%v)", s.id, s.nodes, took, status.Code(err))
	}
	survivor := nodes[(victim+1)%3]
	waitMembers(t, survivor.GRPC, 2, v.Name)
	// Restart the victim under its name, on new ports.
	restarted = exec.Command(filepath.Join(bin, "questd"), append([]string{"--name", v.Name, "--grpc-addr", "127.0.0.1:0",
		"--gossip-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--plaintext", "--cp", "2", "--tp", "1", "--join", survivor.Gossip}, geometryFlags...)...)
	rout, err := restarted.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var restartErr strings.Builder
	restarted.Stderr = &restartErr
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("restarted %s stderr:\n%s", v.Name, tail(restartErr.String(), 6000))
		}
	})
	if err := restarted.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan upNode, 1)
	go func() {
		sc := bufio.NewScanner(rout)
		for sc.Scan() {
			var n upNode
			if json.Unmarshal(sc.Bytes(), &n) == nil && n.Name != "" {
				ready <- n
			}
		}
	}()
	var back upNode
	select {
	case back = <-ready:
	case <-time.After(20 * time.Second):
		t.Fatal("the restarted node printed no ready line in 20 s")
	}
	waitMembers(t, survivor.GRPC, 3, "")
	waitMembers(t, back.GRPC, 3, "")
	// New sequences through the restarted node are placed on it (rank 0
	// on its coordinator) and decode.
	s := create(dial(back.GRPC))
	if s.nodes[0] != v.Name {
		t.Fatalf("a sequence created through the restarted %s is on %v", v.Name, s.nodes)
	}
	if _, err := step(s, s.c); err != nil {
		t.Fatalf("step on the rejoined node: %v", err)
	}
	// SIGTERM to questctl up: every node it started stops, exit 0.
	up.Process.Signal(syscall.SIGTERM)
	if err := waitOrKill(up, 20*time.Second); err != nil {
		t.Fatalf("questctl up after SIGTERM: %v", err)
	}
	for _, n := range nodes {
		if n.Name != v.Name && alive(n.PID) {
			t.Errorf("%s still runs", n.Name)
		}
	}
}

// waitOrKill waits for cmd, killing it after d.
func waitOrKill(cmd *exec.Cmd, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("did not exit within %v: killed", d)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// syncWriter is a process's output, written by os/exec's copying
// goroutine and read by the test: writes and String serialized.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var _ = os.Stderr
