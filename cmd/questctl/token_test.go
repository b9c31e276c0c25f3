package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/cluster/node"
	"github.com/questrt/questrt/cluster/node/nodetest"
	"github.com/questrt/questrt/engine"
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
