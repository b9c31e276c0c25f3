package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/certgen"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
)

// TestStatusTokenFile: against a node with a bearer token, status without
// --token-file fails UNAUTHENTICATED (exit 1) and with the token's file
// succeeds; an empty token file and a token over plaintext to a
// non-loopback address are usage errors (exit 2).
func TestStatusTokenFile(t *testing.T) {
	nodes := nodetest.Start(t, "t", 1, engine.DefaultConfig(), func(_ int, c *node.Config) { c.Token = "tok-1" })
	addr := nodes[0].Addr()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, wrong, empty := write("good", "tok-1\n"), write("wrong", "tok-2\n"), write("empty", "\n")

	if code, _, stderr := runCLI(t, "status", "--addr", addr); code != 1 || !strings.Contains(stderr, "Unauthenticated") {
		t.Errorf("no token: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runCLI(t, "status", "--addr", addr, "--token-file", wrong); code != 1 || !strings.Contains(stderr, "Unauthenticated") {
		t.Errorf("wrong token: exit %d, stderr %q", code, stderr)
	}
	if code, out, stderr := runCLI(t, "status", "--addr", addr, "--token-file", good); code != 0 || !strings.Contains(out, "node t0") {
		t.Errorf("token: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if code, _, stderr := runCLI(t, "status", "--addr", addr, "--token-file", empty); code != 2 || !strings.Contains(stderr, "--token-file") {
		t.Errorf("empty token file: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runCLI(t, "status", "--addr", "192.0.2.1:7070", "--token-file", good); code != 2 || !strings.Contains(stderr, "loopback") {
		t.Errorf("token over plaintext to another host: exit %d, stderr %q", code, stderr)
	}
}

// tlsClusterDir starts n nodes with mutual TLS, each with its own
// certificate of a new CA (internal/certgen, as questctl up makes them),
// and the bearer token tok ("" for none); it returns the nodes and a
// directory holding ca.pem, client.pem and client.key of that CA, as up
// writes it.
func tlsClusterDir(t *testing.T, n int, tok string) ([]*node.Node, string) {
	t.Helper()
	ca, err := certgen.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cl, err := ca.Issue(upClientName)
	if err != nil {
		t.Fatal(err)
	}
	if err := certgen.WriteFiles(dir, ca, map[string]*certgen.Leaf{upClientName: cl}); err != nil {
		t.Fatal(err)
	}
	nodes := nodetest.Start(t, "s", n, engine.DefaultConfig(), func(i int, c *node.Config) {
		leaf, err := ca.Issue(fmt.Sprintf("s%d", i))
		if err != nil {
			t.Fatal(err)
		}
		c.Plaintext, c.Token = false, tok
		c.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{leaf.TLSCertificate()},
			RootCAs: ca.Pool(), ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
	})
	return nodes, dir
}

// TestClientTLS: against nodes with mutual TLS and a token, status with
// --tls-dir (or --ca, --tls-cert and --tls-key) and the token succeeds;
// plaintext, TLS without a client certificate, and a client of another
// CA fail (exit 1) with a hint at what to pass; bad combinations and
// unreadable files are usage errors (exit 2); over TLS a token may go to
// a non-loopback address.
func TestClientTLS(t *testing.T) {
	nodes, dir := tlsClusterDir(t, 1, "tok-1")
	_, other := tlsClusterDir(t, 1, "")
	addr := nodes[0].Addr()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")

	for _, args := range [][]string{
		{"--tls-dir", dir},
		{"--ca", ca, "--tls-cert", cert, "--tls-key", key},
		{"--tls-dir", dir, "--plaintext=false"},
	} {
		args = append([]string{"status", "--addr", addr, "--token-file", tok}, args...)
		if code, out, stderr := runCLI(t, args...); code != 0 || !strings.Contains(out, "node s0") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, stderr)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no token", []string{"--tls-dir", dir}, []string{"Unauthenticated"}},
		{"plaintext", []string{"--token-file", tok}, []string{"cannot reach questd at " + addr, "plaintext was refused", "--tls-dir DIR"}},
		{"no client certificate", []string{"--ca", ca, "--token-file", tok}, []string{"cannot reach questd", "no client certificate was sent", "--tls-cert"}},
		{"another CA", []string{"--tls-dir", other, "--token-file", tok}, []string{"cannot reach questd", "different CAs"}},
	} {
		args := append([]string{"status", "--addr", addr, "--timeout", "3s"}, tc.args...)
		code, out, stderr := runCLI(t, args...)
		ok := code == 1 && out == "" && strings.Count(stderr, "\n") == 1
		for _, w := range tc.want {
			ok = ok && strings.Contains(stderr, w)
		}
		if !ok {
			t.Errorf("%s: %q: exit %d, stdout %q, stderr %q; want exit 1 with %q", tc.name, args, code, out, stderr, tc.want)
		} else {
			t.Logf("%s: %s", tc.name, strings.TrimSpace(stderr))
		}
	}
	plain := serveFakeDecode(t, sampleStatus)
	if code, out, stderr := runCLI(t, "status", "--addr", plain, "--tls-dir", dir, "--timeout", "3s"); code != 1 || out != "" || !strings.Contains(stderr, "does not speak TLS") {
		t.Errorf("TLS against a plaintext node: exit %d, stdout %q, stderr %q", code, out, stderr)
	} else {
		t.Logf("TLS against plaintext: %s", strings.TrimSpace(stderr))
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-dir", dir, "--ca", ca}, "--tls-dir"},
		{[]string{"--tls-cert", cert}, "--tls-key"},
		{[]string{"--tls-key", key}, "--tls-cert"},
		{[]string{"--tls-dir", dir, "--plaintext"}, "--plaintext"},
		{[]string{"--ca", ca, "--plaintext=true"}, "--plaintext"},
		{[]string{"--tls-dir", filepath.Join(dir, "none")}, "--tls-dir"},
		{[]string{"--ca", cert + ".missing"}, "--ca"},
		{[]string{"--ca", key}, "no PEM certificate"},
		{[]string{"--tls-cert", cert, "--tls-key", ca}, "--tls-cert"},
		{[]string{"--tls-dir", ""}, "empty value"},
	} {
		args := append([]string{"status", "--addr", addr}, tc.args...)
		if code, out, stderr := runCLI(t, args...); code != 2 || out != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a usage error naming %s", args, code, out, stderr, tc.want)
		}
	}
	// Over TLS the token may travel to any address: not a usage error,
	// just unreachable (TEST-NET-1).
	code, _, stderr := runCLI(t, "status", "--addr", "192.0.2.1:7070", "--tls-dir", dir, "--token-file", tok, "--timeout", "300ms")
	if code != 1 || strings.Contains(stderr, "loopback") {
		t.Errorf("token over TLS to another host: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, "replay", "--in", exampleCase, "--addr", "192.0.2.1:7070", "--token-file", tok)
	if code != 2 || !strings.Contains(stderr, "loopback") {
		t.Errorf("replay: token over plaintext to another host: exit %d, stderr %q", code, stderr)
	}
}

// TestReplayGenerateTLS: replay --addr and generate --addr reach nodes
// with mutual TLS through --tls-dir (with the token), and give the same
// result as in process; without the TLS flags they fail within their
// deadline, saying why.
func TestReplayGenerateTLS(t *testing.T) {
	nodes, dir := tlsClusterDir(t, 2, "tok-1")
	addr := nodes[0].Addr()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, local, stderr := runCLI(t, "replay", "--in", exampleCase, "--cp", "2")
	if code != 0 {
		t.Fatalf("replay in process: exit %d: %s", code, stderr)
	}
	code, remote, stderr := runCLI(t, "replay", "--in", exampleCase, "--cp", "2", "--addr", addr, "--tls-dir", dir, "--token-file", tok)
	if code != 0 || remote != local {
		t.Errorf("replay --addr --tls-dir: exit %d, stderr %q; same result as in process: %v", code, stderr, remote == local)
	}
	start := time.Now()
	code, _, stderr = runCLI(t, "replay", "--in", exampleCase, "--cp", "2", "--addr", addr, "--token-file", tok, "--timeout", "1s")
	if code != 1 || !strings.Contains(stderr, "plaintext was refused") || time.Since(start) > 10*time.Second {
		t.Errorf("replay --addr, plaintext against TLS: exit %d after %v, stderr %q", code, time.Since(start), stderr)
	}

	t.Run("generate", func(t *testing.T) {
		v1 := filepath.Join(testModels(t), "passkey-llama-v1")
		args := []string{"--model", v1, "--prompt", refPrompt, "--max-tokens", "3", "--budget", "32", "--cp", "2", "--json"}
		code, local, errs := call(generate, args...)
		if code != 0 {
			t.Fatalf("in process: exit %d: %s", code, errs)
		}
		code, remote, errs := call(generate, append(args, "--addr", addr, "--tls-dir", dir, "--token-file", tok)...)
		if code != 0 {
			t.Fatalf("--addr --tls-dir: exit %d: %s", code, errs)
		}
		var a, b genSummary
		if err := json.Unmarshal([]byte(local), &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(remote), &b); err != nil {
			t.Fatal(err)
		}
		if a.Text != b.Text {
			t.Errorf("text %q in process, %q through the TLS cluster", a.Text, b.Text)
		}
		code, _, errs = call(generate, append(args, "--addr", addr, "--tls-dir", filepath.Join(dir, "none"))...)
		if code != 2 || !strings.Contains(errs, "--tls-dir") {
			t.Errorf("--tls-dir missing: exit %d, stderr %q", code, errs)
		}
	})
}
