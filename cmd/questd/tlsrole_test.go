package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/certgen"
)

// TestClientCertRefusedAsNode: questd started with a client certificate
// (questrt://client/NAME, as questctl up and questctl tls client issue
// it) as its own --tls-cert exits 2 with one line naming the flag, the
// file and the client role, before anything listens or logs, and so
// does one started with another node's certificate; with the
// node certificate of the same CA the files pass, and with a
// certificate without a role too (the lenient default). A SIGHUP reload
// that reads a client certificate fails and keeps the node's.
func TestClientCertRefusedAsNode(t *testing.T) {
	ca, err := certgen.NewCA("role test CA")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.IssueClient("alice", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	nodeLeaf, err := ca.IssueNode("n0", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := ca.Issue("old", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.IssueNode("n1", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := certgen.WriteFiles(dir, ca, map[string]*certgen.Leaf{"alice": client, "n0": nodeLeaf, "old": plain, "n1": other}); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	args := func(name string) []string {
		return []string{"--name", "n0", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--metrics-addr", "",
			"--tls-cert", filepath.Join(dir, certgen.CertFile(name)), "--tls-key", filepath.Join(dir, certgen.KeyFile(name)), "--tls-ca", caFile}
	}

	// Refused before anything starts; a questd that did start would serve
	// until ctx ends, and then exit 0.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args("alice"), envOf(nil), &stdout, &stderr)
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	prefix := `questd: --tls-cert "` + filepath.Join(dir, "alice.pem") + `": `
	if code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], prefix) ||
		!strings.Contains(lines[0], "client certificate (questrt://client/alice)") || stdout.Len() != 0 {
		t.Errorf("client certificate: exit %d, stderr %q, stdout %q; want exit 2 and one line starting %q naming questrt://client/alice", code, stderr.String(), stdout.String(), prefix)
	}

	// Another node's certificate (its peers would refuse the node as an
	// impostor): refused the same way, naming both names.
	stdout.Reset()
	stderr.Reset()
	code = run(ctx, args("n1"), envOf(nil), &stdout, &stderr)
	lines = strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	prefix = `questd: --tls-cert "` + filepath.Join(dir, "n1.pem") + `": `
	if code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], prefix) ||
		!strings.Contains(lines[0], `node "n1"'s certificate (questrt://node/n1), and this node is --name "n0"`) || stdout.Len() != 0 {
		t.Errorf("another node's certificate: exit %d, stderr %q, stdout %q; want exit 2 and one line starting %q naming n1 and n0", code, stderr.String(), stdout.String(), prefix)
	}

	for _, name := range []string{"n0", "old"} {
		cfg, err := loadConfig(args(name), envOf(nil), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if err := checkTLSFiles(cfg); err != nil {
			t.Errorf("certificate %s: %v", name, err)
		}
	}

	// SIGHUP: the node's files replaced by the client's fail the reload
	// and the node's certificate stays.
	rl, err := newCertReloader("n0", filepath.Join(dir, "n0.pem"), filepath.Join(dir, "n0.key"), caFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range [][2]string{{"alice.pem", "n0.pem"}, {"alice.key", "n0.key"}} {
		b, err := os.ReadFile(filepath.Join(dir, f[0]))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f[1]), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := rl.reload(); err == nil || !strings.Contains(err.Error(), "questrt://client/alice") {
		t.Errorf("reload with a client certificate: %v, want a refusal naming questrt://client/alice", err)
	}
	if got := rl.leaf().Subject.CommonName; got != "n0" {
		t.Errorf("after the refused reload the certificate is %q's, want n0's", got)
	}
}
