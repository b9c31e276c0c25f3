package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// The multi-host test: three questd processes, each in a network namespace
// of its own, joined by a bridge in a fourth ("switch") namespace, with the
// test (the client, in the root namespace) on the bridge too:
//
//	root ns: qrt<pid>h 10.231.K.254 ──┐
//	                                  │ veth
//	qrt<pid>sw: br0 ── host, port0, port1, port2
//	                          │      │      │ veth
//	qrt<pid>n0..n2:   qrt<pid>e0..e2 10.231.K.1, .2, .3  (questd n0..n2)
//
// K is chosen from the test's PID among the /24s of 10.231.0.0/16 that the
// root namespace has no address or route in. Nothing else is touched: the
// namespaces and the one root-namespace veth are deleted in cleanup.

// Geometry of the netns cluster (that of node's tests): every
// sequence has CP 3 ranks, so with 3 nodes each spans all of them.
const (
	netnsCP          = 3
	netnsStepTimeout = 2 * time.Second
)

var netnsGeometryFlags = []string{"--layers", "2", "--q-heads", "8", "--kv-heads", "4", "--head-dim", "16",
	"--page-size", "4", "--capacity-pages", "128", "--budget-tokens", "24", "--dense-layers", "1",
	"--cp", fmt.Sprint(netnsCP), "--tp", "1", "--step-timeout", netnsStepTimeout.String(), "--max-memory", "none"}

// netnsEngineConfig is the engine config questd builds from
// netnsGeometryFlags (cmd/questd's engineConfig; node_test.go's geometry).
func netnsEngineConfig() engine.Config {
	ec := engine.DefaultConfig()
	ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = 2, 8, 4, 16, 4
	ec.CP, ec.TP, ec.CapacityPages, ec.Selection = netnsCP, 1, 128, plan.Exact
	ec.Policy.PageSize, ec.Policy.BudgetTokens, ec.Policy.DenseLayers = 4, 24, 1
	ec.StepTimeout = netnsStepTimeout
	ec.MemoryLimit = memlimit.NoLimit
	return ec
}

// netnsIP runs `ip args...` (or another command of iproute2) with a bounded
// time and returns its combined output.
func netnsIP(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// netnsNet is the namespaces and links the test made.
type netnsNet struct {
	sw     string   // the switch namespace
	nodes  []string // the node namespaces
	dev    []string // the node's veth in each node namespace
	host   string   // the root namespace's veth
	hostIP string   // its address, on the nodes' subnet
	ip     []string // the nodes' addresses
	made   []func() // undo steps, in creation order
}

// netnsSubnet picks the third byte of a 10.231.K.0/24 that the root
// namespace uses for nothing, starting from the PID.
func netnsSubnet(t *testing.T) int {
	t.Helper()
	for i := range 256 {
		k := (os.Getpid() + i) % 256
		cidr := fmt.Sprintf("10.231.%d.0/24", k)
		r, err1 := netnsIP("ip", "-4", "route", "show", "to", "root", cidr)
		a, err2 := netnsIP("ip", "-4", "addr", "show", "to", cidr)
		if err1 != nil || err2 != nil {
			t.Skipf("ip cannot list routes or addresses: %v %v", err1, err2)
		}
		if strings.TrimSpace(r) == "" && strings.TrimSpace(a) == "" {
			return k
		}
	}
	t.Skip("every /24 of 10.231.0.0/16 is in use in the root namespace")
	return 0
}

// netnsSetup makes the namespaces, bridge and veths; t.Cleanup removes
// them (in reverse order), whatever happens later.
func netnsSetup(t *testing.T, n int) *netnsNet {
	t.Helper()
	pid := os.Getpid()
	k := netnsSubnet(t)
	nw := &netnsNet{sw: fmt.Sprintf("qrt%dsw", pid), host: fmt.Sprintf("qrt%dh", pid)}
	t.Cleanup(func() {
		for i := len(nw.made) - 1; i >= 0; i-- {
			nw.made[i]()
		}
	})
	addNS := func(name string) {
		if _, err := netnsIP("ip", "netns", "add", name); err != nil {
			if len(nw.made) == 0 {
				t.Skipf("cannot create a network namespace (no CAP_SYS_ADMIN?): %v", err)
			}
			t.Fatal(err)
		}
		nw.made = append(nw.made, func() {
			if _, err := netnsIP("ip", "netns", "del", name); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
	}
	must := func(args ...string) {
		t.Helper()
		if _, err := netnsIP("ip", args...); err != nil {
			t.Fatal(err)
		}
	}
	addNS(nw.sw)
	if _, err := netnsIP("ip", "-n", nw.sw, "link", "add", "br0", "type", "bridge"); err != nil {
		t.Skipf("cannot create a bridge (no bridge support in the kernel?): %v", err)
	}
	must("-n", nw.sw, "link", "set", "lo", "up")
	must("-n", nw.sw, "link", "set", "br0", "up")
	for i := range n {
		ns := fmt.Sprintf("qrt%dn%d", pid, i)
		addNS(ns)
		nw.nodes = append(nw.nodes, ns)
		ip := fmt.Sprintf("10.231.%d.%d", k, i+1)
		nw.ip = append(nw.ip, ip)
		port := fmt.Sprintf("port%d", i)
		// Both ends are made inside namespaces: no name in the root
		// namespace can clash; and the node's end has a name no other
		// namespace uses, so that a command that went to the wrong
		// namespace would fail rather than touch another link.
		dev := fmt.Sprintf("qrt%de%d", pid, i)
		nw.dev = append(nw.dev, dev)
		must("-n", ns, "link", "add", dev, "type", "veth", "peer", "name", port, "netns", nw.sw)
		must("-n", nw.sw, "link", "set", port, "master", "br0")
		must("-n", nw.sw, "link", "set", port, "up")
		must("-n", ns, "link", "set", "lo", "up")
		must("-n", ns, "addr", "add", ip+"/24", "dev", dev)
		must("-n", ns, "link", "set", dev, "up")
	}
	must("link", "add", nw.host, "type", "veth", "peer", "name", "host", "netns", nw.sw)
	nw.made = append(nw.made, func() {
		// Normally gone already with the switch namespace's end; deleted
		// here first (cleanup runs in reverse), quietly if it is gone.
		netnsIP("ip", "link", "del", nw.host)
	})
	must("-n", nw.sw, "link", "set", "host", "master", "br0")
	must("-n", nw.sw, "link", "set", "host", "up")
	nw.hostIP = fmt.Sprintf("10.231.%d.254", k)
	must("addr", "add", nw.hostIP+"/24", "dev", nw.host)
	must("link", "set", nw.host, "up")
	return nw
}

// netnsReady is questd's ready line.
type netnsReady struct {
	Event, Name, GRPC, Gossip string
}

// netnsReadyWriter is questd's stdout: it passes the first ready line to
// ch. exec's copying goroutine is its only caller.
type netnsReadyWriter struct {
	line []byte
	sent bool
	ch   chan netnsReady
}

func (w *netnsReadyWriter) Write(p []byte) (int, error) {
	if w.sent {
		return len(p), nil
	}
	w.line = append(w.line, p...)
	for {
		i := bytes.IndexByte(w.line, '\n')
		if i < 0 {
			break
		}
		var r netnsReady
		if json.Unmarshal(w.line[:i], &r) == nil && r.Event == "ready" {
			w.sent = true
			w.ch <- r // cap 1, sent once
			w.line = nil
			break
		}
		w.line = w.line[i+1:]
	}
	return len(p), nil
}

// netnsProc is one questd process. Its waiting goroutine ends when the
// process does (cleanup kills it), closing done.
type netnsProc struct {
	name   string
	cmd    *exec.Cmd
	stderr string
	ready  chan netnsReady
	done   chan struct{}
	err    error // of Wait, once done is closed
}

// logTail returns the last lines of the process's stderr.
func (p *netnsProc) logTail() string {
	b, _ := os.ReadFile(p.stderr)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// netnsStart starts questd in namespace ns with args, adds it to procs
// (which the caller's cleanup stops) and waits (10 s at most) for its
// ready line.
func netnsStart(t *testing.T, procs *[]*netnsProc, ns, name string, args ...string) netnsReady {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// `ip netns exec` enters ns and execs questd: the PID is questd's.
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, filepath.Join(bin, "questd"), "--name", name}, args...)...)
	p := &netnsProc{name: name, cmd: cmd, stderr: f.Name(), ready: make(chan netnsReady, 1), done: make(chan struct{})}
	cmd.Stdout = &netnsReadyWriter{ch: p.ready}
	cmd.Stderr = f
	cmd.WaitDelay = 2 * time.Second
	// Gone with the test process even if it dies without cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// Inter-node gRPC must not go through a proxy of the environment.
	for _, e := range os.Environ() {
		if !strings.Contains(strings.ToLower(strings.SplitN(e, "=", 2)[0]), "proxy") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	*procs = append(*procs, p)
	select {
	case r := <-p.ready:
		return r
	case <-p.done:
		t.Fatalf("%s exited before ready: %v\n%s", name, p.err, p.logTail())
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no ready line within 10s\n%s", name, p.logTail())
	}
	return netnsReady{}
}

// netnsStopAll ends the processes together: SIGTERM to each, SIGKILL to
// those still running 5 s later, and waits for each (10 s more at most).
func netnsStopAll(t *testing.T, procs []*netnsProc) {
	start := time.Now()
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	term := time.NewTimer(5 * time.Second)
	defer term.Stop()
	for _, p := range procs {
		select {
		case <-p.done:
			t.Logf("%s stopped %v after SIGTERM: %v", p.name, time.Since(start).Round(time.Millisecond), p.err)
			continue
		case <-term.C:
			term.Reset(0) // the rest get SIGKILL at once
		}
		t.Logf("%s: no exit 5s after SIGTERM: SIGKILL", p.name)
		p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) still running 10s after SIGKILL", p.name, p.cmd.Process.Pid)
		}
	}
	if t.Failed() {
		for _, p := range procs {
			t.Logf("%s: its log ends:\n%s", p.name, p.logTail())
		}
	}
}

func netnsRandVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// netnsSeq is a sequence on the cluster and its twin in the in-process
// reference engine.
type netnsSeq struct {
	id    string
	rid   engine.SeqID
	nodes []string
	coord int // index of the node that created (coordinates) it
}

// netnsMedian returns the median of d.
func netnsMedian(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// Three questd processes in three network namespaces (a bridge between
// them, real veths, memberlist over UDP and TCP, gRPC over TCP) form a
// cluster; sequences spanning the three nodes decode exactly as the
// in-process engine does; netem delay on one node's link slows the steps
// by at least the delayed round trips and changes no result; a node whose
// link goes down fails the steps that need it with UNAVAILABLE within the
// step deadline, and once the others declare it dead new sequences are
// placed on them alone and decode correctly.
//
// CP 3 on 3 nodes puts every sequence on every node, so the sequences
// still working after the link loss are the ones created after it (CP 3
// ranks on the 2 survivors); the "some sequences unaffected" case of a
// partial placement is TestClusterNodeLoss's (node, CP 2).
func TestNetnsCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("network-namespace cluster test: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("network-namespace cluster test: needs root (ip netns, tc)")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("network-namespace cluster test: %s (iproute2) not found: %v", tool, err)
		}
	}
	began := time.Now()
	t.Cleanup(func() { t.Logf("wall time %v (cleanup included)", time.Since(began).Round(time.Millisecond)) })
	const n = 3
	nw := netnsSetup(t, n)
	t.Logf("namespaces %s %v, nodes at %v, client at %s", nw.sw, nw.nodes, nw.ip, nw.host)

	fast := []string{"--plaintext", "--probe-interval", "100ms", "--probe-timeout", "50ms", "--suspicion-mult", "2",
		"--gossip-interval", "50ms", "--drain-timeout", "1s"}
	var procs []*netnsProc
	t.Cleanup(func() { netnsStopAll(t, procs) })
	var grpcs []string
	var join string
	for i := range n {
		args := append(slices.Clone(fast), netnsGeometryFlags...)
		args = append(args, "--grpc-addr", nw.ip[i]+":7070", "--gossip-addr", nw.ip[i]+":7946")
		if i > 0 {
			args = append(args, "--join", join)
		}
		r := netnsStart(t, &procs, nw.nodes[i], fmt.Sprintf("n%d", i), args...)
		if r.Name != fmt.Sprintf("n%d", i) || r.GRPC != nw.ip[i]+":7070" {
			t.Fatalf("node %d ready line %+v", i, r)
		}
		if i == 0 {
			join = r.Gossip
		}
		grpcs = append(grpcs, r.GRPC)
	}

	ctx := t.Context()
	clients := make([]*client.Client, n)
	for i, addr := range grpcs {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := client.Dial(dctx, addr, client.Options{})
		cancel()
		if err != nil {
			t.Fatalf("dial n%d across namespaces: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}

	// alive returns the alive members node i lists.
	alive := func(i int) ([]string, error) {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := clients[i].Status(sctx)
		if err != nil {
			return nil, err
		}
		var up []string
		for _, m := range st.GetMembers() {
			if m.GetState() == "alive" {
				up = append(up, m.GetName())
			}
		}
		slices.Sort(up)
		return up, nil
	}
	// waitAlive waits until every node of idx lists exactly want alive.
	waitAlive := func(idx []int, want []string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for _, i := range idx {
			for {
				up, err := alive(i)
				if err == nil && slices.Equal(up, want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("n%d lists %v alive (%v), want %v within %v", i, up, err, want, within)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}

	// 1. The cluster forms.
	formed := time.Now()
	waitAlive([]int{0, 1, 2}, []string{"n0", "n1", "n2"}, 15*time.Second)
	t.Logf("cluster of 3 formed (every node lists 3 alive) %v after the last ready line", time.Since(formed).Round(time.Millisecond))

	// 2. Sequences created through each node and driven through the next
	// (forwarded across namespaces) equal the in-process engine.
	ec := netnsEngineConfig()
	ref, err := engine.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ref.Close() })
	rng := rand.New(rand.NewPCG(7, uint64(os.Getpid())))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim

	create := func(t *testing.T, via int) netnsSeq {
		t.Helper()
		id, on, err := clients[via].Create(ctx, plan.Striped)
		if err != nil {
			t.Fatalf("create via n%d: %v", via, err)
		}
		if len(on) != ec.CP*ec.TP {
			t.Fatalf("create via n%d: %d nodes for %d ranks", via, len(on), ec.CP*ec.TP)
		}
		rid, err := ref.Create(plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		s := netnsSeq{id: id, rid: rid, nodes: on, coord: via}
		tokens := 20 + rng.IntN(60)
		for l := range ec.Layers {
			k, v := netnsRandVec(rng, tokens*kv), netnsRandVec(rng, tokens*kv)
			if err := clients[via].Append(ctx, id, l, k, v); err != nil {
				t.Fatalf("append %s via n%d: %v", id, via, err)
			}
			if err := ref.Append(rid, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	// step runs one step of s through node via and checks it against the
	// reference; it returns the client-side wall time and the
	// coordinator's.
	step := func(t *testing.T, s netnsSeq, via, layer int, fresh bool) (time.Duration, time.Duration) {
		t.Helper()
		q := netnsRandVec(rng, qd)
		var k, v []float32
		if fresh {
			k, v = netnsRandVec(rng, kv), netnsRandVec(rng, kv)
		}
		start := time.Now()
		got, err := clients[via].Step(ctx, layer, []client.Item{{Seq: s.id, Q: q, K: k, V: v}}, client.StepOptions{})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("step %s (on %v) layer %d via n%d: %v", s.id, s.nodes, layer, via, err)
		}
		var want engine.Result
		if err := ref.Step(ctx, layer, []engine.Request{{Seq: s.rid, Q: q, K: k, V: v}}, engine.StepOptions{}, &want); err != nil {
			t.Fatal(err)
		}
		if len(got.O) != len(want.O) {
			t.Fatalf("%s: %d outputs, in process %d", s.id, len(got.O), len(want.O))
		}
		for i := range want.O {
			if d := math.Abs(float64(got.O[i] - want.O[i])); d > 1e-5*(1+math.Abs(float64(want.O[i]))) {
				t.Fatalf("%s layer %d via n%d: o[%d] = %g, in process %g", s.id, layer, via, i, got.O[i], want.O[i])
			}
		}
		if got.Plans[0] != want.Plans[0] {
			t.Fatalf("%s layer %d: plan %+v, in process %+v", s.id, layer, got.Plans[0], want.Plans[0])
		}
		return took, got.Total
	}

	var seqs []netnsSeq
	for i := range n {
		s := create(t, i)
		names := slices.Sorted(slices.Values(s.nodes))
		if s.nodes[0] != fmt.Sprintf("n%d", i) || !slices.Equal(names, []string{"n0", "n1", "n2"}) {
			t.Fatalf("sequence %s created via n%d placed on %v: want every node, n%d first", s.id, i, s.nodes, i)
		}
		seqs = append(seqs, s)
	}
	for r := range 3 {
		for _, s := range seqs {
			for l := range ec.Layers {
				step(t, s, (s.coord+1)%n, l, r != 1)
			}
		}
	}
	t.Logf("3 sequences on %v: 18 steps through forwarding nodes equal the in-process engine", seqs[0].nodes)

	// 3. netem delay on n1's link (its egress: every packet n1 sends).
	// seqs[0] is coordinated by n0 and stepped through n0, so the client's
	// own hop is not delayed. A step waits in turn for n1's reply to
	// BeginStep, n1's selection candidates (SelectExact) and partial
	// output (Reduce) inside the Layer calls, n1's Layer reply and its
	// EndStep reply (engine.run, worker/rankstep.go): about 5 sends of n1
	// in sequence, each delayed by d, so a step should grow by about 5d.
	// We assert at least 2d and at most 50 ms for d = 2 ms; for 0.2 ms
	// (about 1 ms expected, near the noise of a median) only the upper
	// bound.
	measure := func(t *testing.T) (time.Duration, time.Duration) {
		var wall, coord []time.Duration
		for range 20 {
			w, c := step(t, seqs[0], 0, 1, true)
			wall, coord = append(wall, w), append(coord, c)
		}
		return netnsMedian(wall), netnsMedian(coord)
	}
	t.Run("netem", func(t *testing.T) {
		base, baseC := measure(t)
		t.Logf("median step (20 steps, layer 1, via n0), no delay: %v (coordinator %v)", base, baseC)
		dev := []string{"-n", nw.nodes[1], "qdisc"}
		if _, err := netnsIP("tc", append(dev, "add", "dev", nw.dev[1], "root", "netem", "delay", "0.2ms")...); err != nil {
			t.Skipf("tc netem unavailable here (sch_netem not in the kernel?): %v", err)
		}
		defer func() {
			if _, err := netnsIP("tc", append(dev, "del", "dev", nw.dev[1], "root")...); err != nil {
				t.Errorf("remove netem: %v", err)
			}
		}()
		small, smallC := measure(t)
		t.Logf("median step with netem delay 0.2ms on n1: %v (coordinator %v): +%v", small, smallC, small-base)
		if _, err := netnsIP("tc", append(dev, "change", "dev", nw.dev[1], "root", "netem", "delay", "2ms")...); err != nil {
			t.Fatal(err)
		}
		big, bigC := measure(t)
		t.Logf("median step with netem delay 2ms on n1: %v (coordinator %v): +%v", big, bigC, big-base)
		if grew := big - base; grew < 2*2*time.Millisecond || grew > 50*time.Millisecond {
			t.Errorf("2ms netem delay on n1 grew the median step by %v (%v -> %v), want 4ms to 50ms", grew, base, big)
		}
		if grew := small - base; grew > 50*time.Millisecond {
			t.Errorf("0.2ms netem delay on n1 grew the median step by %v (%v -> %v), want at most 50ms", grew, base, small)
		}
	})
	if t.Failed() {
		return
	}

	// 4. n2's link goes down mid-use: the next step of the sequences
	// coordinated by n0 and n1 (every one needs n2) fails with
	// UNAVAILABLE within the step deadline plus 1 s.
	if _, err := netnsIP("ip", "-n", nw.nodes[2], "link", "set", nw.dev[2], "down"); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	failStep := func(s netnsSeq, via int) (time.Duration, error) {
		sctx, cancel := context.WithTimeout(ctx, netnsStepTimeout+5*time.Second)
		defer cancel()
		start := time.Now()
		_, err := clients[via].Step(sctx, 1, []client.Item{{Seq: s.id, Q: netnsRandVec(rng, qd),
			K: netnsRandVec(rng, kv), V: netnsRandVec(rng, kv)}}, client.StepOptions{})
		return time.Since(start), err
	}
	for _, s := range seqs[:2] {
		took, err := failStep(s, s.coord)
		t.Logf("%s via n%d after n2's link went down: %v in %v", s.id, s.coord, status.Code(err), took.Round(time.Millisecond))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("%s via n%d: step after n2's link went down: %v, want UNAVAILABLE", s.id, s.coord, err)
		}
		if took > netnsStepTimeout+time.Second {
			t.Fatalf("%s: the failed step took %v (step deadline %v)", s.id, took, netnsStepTimeout)
		}
	}
	// Once n0 and n1 declare n2 dead, n2's own sequence fails through
	// them at once, and new sequences land on n0 and n1 alone and decode
	// as the in-process engine does.
	waitAlive([]int{0, 1}, []string{"n0", "n1"}, 10*time.Second)
	t.Logf("n0 and n1 list n2 as not alive %v after its link went down", time.Since(down).Round(time.Millisecond))
	took, err := failStep(seqs[2], 0)
	t.Logf("%s (coordinated by n2) via n0: %v in %v", seqs[2].id, status.Code(err), took.Round(time.Millisecond))
	if status.Code(err) != codes.Unavailable || took > netnsStepTimeout+time.Second {
		t.Fatalf("%s (coordinated by n2) via n0: %v after %v, want UNAVAILABLE within %v", seqs[2].id, err, took, netnsStepTimeout+time.Second)
	}
	for via := range 2 {
		s := create(t, via)
		if slices.Contains(s.nodes, "n2") {
			t.Fatalf("sequence %s created after n2's loss placed on %v", s.id, s.nodes)
		}
		for r := range 2 {
			for l := range ec.Layers {
				step(t, s, 1-via, l, r == 0)
			}
		}
		t.Logf("new sequence %s on %v decodes as the in-process engine", s.id, s.nodes)
	}
}
