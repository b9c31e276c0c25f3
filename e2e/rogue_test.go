package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// TestUpRogueJoiners: a cluster started the default way (questctl up:
// mutual TLS, node certificates, a gossip key) and four processes that
// try to become members of it:
//   - a questd with the cluster's certificates (node-1's, under its
//     name) but no gossip key: its join is refused and its log says why
//     (no gossip key);
//   - a questd holding the gossip key that would serve with the client
//     certificate as its node certificate: it refuses to start (exit 2,
//     naming the certificate's client role) and never reaches the gossip;
//     so does one with another node's certificate (node-0's);
//   - a plaintext questd holding the gossip key: it joins the gossip and
//     is refused ("serves gRPC in plaintext": its gossip metadata says so).
//
// Sequences created through either honest node while they are there
// have a CP 3 grid (more ranks than honest nodes) placed on the honest
// nodes only, and decode as the in-process engine does.
func TestUpRogueJoiners(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := filepath.Join(t.TempDir(), "tls")
	up := exec.Command(filepath.Join(bin, "questctl"), append([]string{"up", "--nodes", "2", "--cp", "3", "--json", "--tls-dir", dir,
		"--questd", filepath.Join(bin, "questd"), "--timeout", "30s", "--"}, geometryFlags...)...)
	upErr := &syncWriter{}
	up.Stderr = upErr
	nodes := startJSON(t, up, 2, upErr)
	if t.Failed() {
		return
	}

	// The rogues. Each one's stderr is kept; each is stopped at the end.
	var rogueLogs = map[string]*syncWriter{}
	rogueArgs := func(name string, extra ...string) []string {
		args := append([]string{"--name", name, "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
			"--cp", "3", "--tp", "1", "--join", nodes[0].Gossip}, extra...)
		return append(args, geometryFlags...)
	}
	// rogue starts questd --name name; its log is rogueLogs[tag].
	rogue := func(tag, name string, extra ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, "questd"), rogueArgs(name, extra...)...)
		logs := &syncWriter{}
		rogueLogs[tag] = logs
		cmd.Stderr = logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			waitOrKill(cmd, 5*time.Second)
			if t.Failed() {
				t.Logf("%s stderr:\n%s", tag, tail(logs.String(), 3000))
			}
		})
		return cmd
	}
	tlsOf := func(cert string) []string {
		return []string{"--tls-cert", filepath.Join(dir, cert+".pem"), "--tls-key", filepath.Join(dir, cert+".key"), "--tls-ca", filepath.Join(dir, "ca.pem")}
	}
	key := filepath.Join(dir, "gossip.key")
	// The rogue without the key runs under node-1's name and
	// certificate (questd refuses another node's certificate, and up
	// keeps no CA key to issue one): its join is refused for the key
	// before its name could matter.
	rogue("nokey", "node-1", tlsOf("node-1")...)
	rogue("plain", "plain", "--insecure", "--gossip-key-file", key)
	bctx, bcancel := context.WithTimeout(t.Context(), 30*time.Second)
	out, err := exec.CommandContext(bctx, filepath.Join(bin, "questd"), rogueArgs("byclient", append(tlsOf("client"), "--gossip-key-file", key)...)...).CombinedOutput()
	bcancel()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "client certificate") {
		t.Fatalf("questd with the client certificate as its node certificate: %v, want exit status 2 naming the client certificate:\n%s", err, tail(string(out), 2000))
	}
	bctx, bcancel = context.WithTimeout(t.Context(), 30*time.Second)
	out, err = exec.CommandContext(bctx, filepath.Join(bin, "questd"), rogueArgs("other", append(tlsOf("node-0"), "--gossip-key-file", key)...)...).CombinedOutput()
	bcancel()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), `node "node-0"'s certificate`) {
		t.Fatalf("questd other with node-0's certificate: %v, want exit status 2 naming node-0's certificate:\n%s", err, tail(string(out), 2000))
	}

	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	sec := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS13}
	ctx := t.Context()
	dial := func(addr string) *client.Client {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, err := client.Dial(dctx, addr, client.Options{Creds: credentials.NewTLS(sec)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	clients := []*client.Client{dial(nodes[0].GRPC), dial(nodes[1].GRPC)}

	// Every honest node sees the keyed plaintext rogue alive and refused
	// with its reason, and never the one without the key nor the one
	// that refused to start; the rogue without the key says why it
	// cannot join.
	want := map[string]string{"plain": "serves gRPC in plaintext"}
	deadline := time.Now().Add(20 * time.Second)
	for i, c := range clients {
		for {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			st, err := c.Status(sctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			var bad []string
			seen := map[string]bool{}
			for _, m := range st.GetMembers() {
				seen[m.GetName()] = m.GetState() == "alive"
				w := want[m.GetName()]
				switch {
				case m.GetName() == "nokey" || m.GetName() == "byclient":
					t.Fatalf("node-%d lists the rogue %s: %v", i, m.GetName(), m)
				case w == "" && m.GetRefused() != "":
					t.Fatalf("node-%d refuses honest %s: %s", i, m.GetName(), m.GetRefused())
				case w != "" && !strings.Contains(m.GetRefused(), w):
					bad = append(bad, m.GetName()+" refused "+`"`+m.GetRefused()+`"`)
				}
			}
			for name := range want {
				if !seen[name] {
					bad = append(bad, name+" not alive")
				}
			}
			if len(bad) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node-%d's Status: %s", i, strings.Join(bad, "; "))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for !strings.Contains(rogueLogs["nokey"].String(), "this node has no gossip key") {
		if time.Now().After(deadline) {
			t.Fatalf("the rogue without the key does not say why it cannot join:\n%s", tail(rogueLogs["nokey"].String(), 2000))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The reference: the grid the nodes run is the in-process engine's.
	ec := nodetest.Geometry(3, 1, plan.Exact)
	st, err := clients[0].Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.GridConfigFromProto(st.GetConfig())
	wantCfg := ec.WorkerConfig()
	wantCfg.MemoryLimit = got.MemoryLimit // a node's own business, not the grid's: it does not travel
	if err != nil || fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", wantCfg) {
		t.Fatalf("the nodes' grid %+v (%v), the reference's %+v", got, err, wantCfg)
	}
	ref, err := engine.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	rng := rand.New(rand.NewPCG(28, 2))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	for i, c := range clients {
		id, on, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatalf("create through node-%d: %v", i, err)
		}
		for _, n := range on {
			if n != "node-0" && n != "node-1" {
				t.Fatalf("create through node-%d: ranks on %v, a rogue among them", i, on)
			}
		}
		rid, err := ref.Create(plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		for l := range ec.Layers {
			k, v := randVec(rng, 50*kv), randVec(rng, 50*kv)
			if err := c.Append(ctx, id, l, k, v); err != nil {
				t.Fatal(err)
			}
			if err := ref.Append(rid, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
		for step := range 2 {
			for l := range ec.Layers {
				q, k, v := randVec(rng, qd), randVec(rng, kv), randVec(rng, kv)
				got, err := c.Step(ctx, l, []client.Item{{Seq: id, Q: q, K: k, V: v}}, client.StepOptions{})
				if err != nil {
					t.Fatalf("step %d layer %d: %v", step, l, err)
				}
				var want engine.Result
				if err := ref.Step(ctx, l, []engine.Request{{Seq: rid, Q: q, K: k, V: v}}, engine.StepOptions{}, &want); err != nil {
					t.Fatal(err)
				}
				for j := range want.O {
					if d := math.Abs(float64(got.O[j] - want.O[j])); d > 1e-5*(1+math.Abs(float64(want.O[j]))) {
						t.Fatalf("step %d layer %d: o[%d] = %g, in process %g", step, l, j, got.O[j], want.O[j])
					}
				}
			}
		}
	}
}

// startJSON starts questctl up (its --json lines on stdout), waits for
// count nodes and stops it (SIGTERM) when the test ends.
func startJSON(t *testing.T, up *exec.Cmd, count int, upErr *syncWriter) []upNode {
	t.Helper()
	stdout, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	var nodes []upNode
	t.Cleanup(func() {
		up.Process.Signal(syscall.SIGTERM)
		waitOrKill(up, 15*time.Second)
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
	lines := make(chan upNode, count)
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
	for len(nodes) < count {
		select {
		case n := <-lines:
			nodes = append(nodes, n)
		case <-deadline:
			t.Fatalf("questctl up printed %d nodes in 40 s", len(nodes))
		}
	}
	return nodes
}
