package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/identity"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
)

// readCert parses the PEM certificate in path.
func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		t.Fatalf("%s: no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mustTLS runs 'questctl tls ARGS' and fails the test unless it exits 0.
func mustTLS(t *testing.T, args ...string) {
	t.Helper()
	if code, _, stderr := runCLI(t, append([]string{"tls"}, args...)...); code != 0 {
		t.Fatalf("tls %q: exit %d: %s", args, code, stderr)
	}
}

// TestTLSCommand: 'questctl tls ca', 'node' and 'client' write
// certificates that verify against the CA for the uses they are for,
// carry the role asked for (read back with internal/identity) and the
// --host SANs, with keys 0600, certificates 0644 and a new directory
// 0700; nothing is replaced without --force (exit 2, the files as they
// were), and --force replaces.
func TestTLSCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	out := filepath.Join(t.TempDir(), "node-files")
	mustTLS(t, "ca", "--dir", dir, "--days", "30")
	mustTLS(t, "node", "n-0", "--dir", dir, "--host", "n-0.example, 10.1.2.3", "--days", "10")
	mustTLS(t, "node", "--dir", dir, "n-1", "--out", out) // NAME after the flags, default hosts
	mustTLS(t, "client", "alice", "--dir", dir)

	ca := readCert(t, filepath.Join(dir, "ca.pem"))
	if !ca.IsCA {
		t.Fatal("ca.pem is not a CA")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, tc := range []struct {
		path  string
		want  identity.Identity
		dns   []string
		ips   []string
		usage x509.ExtKeyUsage
		days  int
	}{
		{filepath.Join(dir, "n-0.pem"), identity.Identity{Role: identity.Node, Name: "n-0"}, []string{"n-0.example"}, []string{"10.1.2.3"}, x509.ExtKeyUsageServerAuth, 10},
		{filepath.Join(out, "n-1.pem"), identity.Identity{Role: identity.Node, Name: "n-1"}, []string{"localhost"}, []string{"127.0.0.1", "::1"}, x509.ExtKeyUsageServerAuth, 365},
		{filepath.Join(dir, "alice.pem"), identity.Identity{Role: identity.Client, Name: "alice"}, nil, nil, x509.ExtKeyUsageClientAuth, 365},
	} {
		c := readCert(t, tc.path)
		if id, err := identity.Of(c); err != nil || id != tc.want {
			t.Errorf("%s: identity %+v (%v), want %+v", tc.path, id, err, tc.want)
		}
		for _, u := range []x509.ExtKeyUsage{tc.usage, x509.ExtKeyUsageClientAuth} {
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
				t.Errorf("%s: does not verify against ca.pem for %v: %v", tc.path, u, err)
			}
		}
		var ips []string
		for _, ip := range c.IPAddresses {
			ips = append(ips, ip.String())
		}
		if !slices.Equal(c.DNSNames, tc.dns) || !slices.Equal(ips, tc.ips) {
			t.Errorf("%s: SANs %q %q, want %q %q", tc.path, c.DNSNames, ips, tc.dns, tc.ips)
		}
		// Never after the CA (30 days), else --days (with 5 min of skew).
		days := min(tc.days, 30)
		if got := c.NotAfter.Sub(c.NotBefore).Hours() / 24; got < float64(days)-0.01 || got > float64(days)+0.01 {
			t.Errorf("%s: valid %.3f days, want %d", tc.path, got, days)
		}
	}
	if _, err := readCert(t, filepath.Join(dir, "n-0.pem")).Verify(x509.VerifyOptions{Roots: roots, DNSName: "n-0.example"}); err != nil {
		t.Errorf("n-0 for its --host name: %v", err)
	}
	for path, want := range map[string]os.FileMode{
		dir: 0o700, out: 0o700, filepath.Join(dir, "ca.key"): 0o600, filepath.Join(dir, "ca.pem"): 0o644,
		filepath.Join(dir, "n-0.key"): 0o600, filepath.Join(out, "n-1.key"): 0o600, filepath.Join(dir, "alice.key"): 0o600,
		filepath.Join(dir, "n-0.pem"): 0o644,
	} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode().Perm(), err, want)
		}
	}
	// A key is the certificate's.
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, "alice.pem"), filepath.Join(dir, "alice.key")); err != nil {
		t.Errorf("alice's key pair: %v", err)
	}

	old, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	oldKey, _ := os.ReadFile(filepath.Join(dir, "n-0.key"))
	for _, args := range [][]string{{"ca", "--dir", dir}, {"node", "n-0", "--dir", dir}, {"client", "alice", "--dir", dir}} {
		code, stdout, stderr := runCLI(t, append([]string{"tls"}, args...)...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, "--force") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("tls %q again: exit %d, stdout %q, stderr %q; want exit 2 naming --force", args, code, stdout, stderr)
		}
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); !bytes.Equal(now, old) {
		t.Error("a refused 'tls ca' changed ca.pem")
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "n-0.key")); !bytes.Equal(now, oldKey) {
		t.Error("a refused 'tls node' changed n-0.key")
	}
	mustTLS(t, "node", "n-0", "--dir", dir, "--force")
	if now, _ := os.ReadFile(filepath.Join(dir, "n-0.key")); bytes.Equal(now, oldKey) {
		t.Error("'tls node --force' kept the old key")
	}
	if fi, err := os.Stat(filepath.Join(dir, "n-0.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("n-0.key after --force: %v, %v", fi.Mode(), err)
	}
}

// TestTLSCommandFile: --file BASE writes OUT/BASE.pem and OUT/BASE.key
// for NAME (the role's URI SAN names NAME, not BASE) and nothing under
// NAME, from a CA directory that is read-only as a Kubernetes Secret
// mount is (files 0440, directory 0500), which is how an init container
// uses it.
func TestTLSCommandFile(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca")
	mustTLS(t, "ca", "--dir", ca)
	for _, f := range []string{"ca.pem", "ca.key"} {
		if err := os.Chmod(filepath.Join(ca, f), 0o440); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(ca, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(ca, 0o700) })
	out := t.TempDir()
	mustTLS(t, "node", "questd-1", "--dir", ca, "--out", out, "--file", "node", "--host", "questd-1.questd-peers,10.0.0.7")
	c := readCert(t, filepath.Join(out, "node.pem"))
	if id, err := identity.Of(c); err != nil || id != (identity.Identity{Role: identity.Node, Name: "questd-1"}) {
		t.Errorf("node.pem: identity %+v (%v), want node questd-1", id, err)
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(out, "node.pem"), filepath.Join(out, "node.key")); err != nil {
		t.Errorf("node.pem and node.key: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(out, "node.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node.key: %v (%v), want mode 0600", fi, err)
	}
	es, _ := os.ReadDir(out)
	if len(es) != 2 {
		t.Errorf("out holds %d files, want node.pem and node.key only", len(es))
	}
	// Again with --force (an init container that runs again in the same
	// pod): a new key.
	old, _ := os.ReadFile(filepath.Join(out, "node.key"))
	mustTLS(t, "node", "questd-1", "--dir", ca, "--out", out, "--file", "node", "--force")
	if now, _ := os.ReadFile(filepath.Join(out, "node.key")); bytes.Equal(now, old) {
		t.Error("--force kept the old key")
	}
}

// TestTLSCommandBadInput: bad input is one line on stderr, exit 2, and
// writes nothing.
func TestTLSCommandBadInput(t *testing.T) {
	dir := t.TempDir()
	mustTLS(t, "ca", "--dir", dir)
	notCA := t.TempDir()
	mustTLS(t, "client", "c", "--dir", dir, "--out", notCA)
	// A directory whose ca.pem is a leaf, with that leaf's key.
	b, _ := os.ReadFile(filepath.Join(notCA, "c.pem"))
	k, _ := os.ReadFile(filepath.Join(notCA, "c.key"))
	os.WriteFile(filepath.Join(notCA, "ca.pem"), b, 0o644)
	os.WriteFile(filepath.Join(notCA, "ca.key"), k, 0o600)
	before := func() []string {
		var names []string
		for _, d := range []string{dir, notCA} {
			es, _ := os.ReadDir(d)
			for _, e := range es {
				names = append(names, d+"/"+e.Name())
			}
		}
		return names
	}
	was := before()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "want ca, node or client"},
		{[]string{"server", "x"}, "unknown subcommand"},
		{[]string{"ca"}, "--dir is required"},
		{[]string{"ca", "--dir", dir, "--days", "0"}, "--days 0"},
		{[]string{"ca", "--dir", dir, "--days", "3651"}, "--days 3651"},
		{[]string{"ca", "--dir", dir, "extra"}, "unexpected arguments"},
		{[]string{"node", "--dir", dir}, "NAME"},
		{[]string{"node", "n"}, "--dir is required"},
		{[]string{"node", "ca", "--dir", dir}, `NAME "ca"`},
		{[]string{"node", ".n", "--dir", dir}, `NAME ".n"`},
		{[]string{"node", "a/b", "--dir", dir}, `NAME "a/b"`},
		{[]string{"node", `a\b`, "--dir", dir}, `NAME`},
		{[]string{"node", "a b", "--dir", dir}, `NAME`},
		{[]string{"node", strings.Repeat("n", 254), "--dir", dir}, `NAME`},
		{[]string{"node", "n", "m", "--dir", dir}, "unexpected arguments"},
		{[]string{"node", "n", "--dir", dir, "--host", "under_score"}, "--host"},
		{[]string{"node", "n", "--dir", dir, "--host", " , "}, "--host"},
		{[]string{"node", "n", "--dir", filepath.Join(dir, "none")}, "tls ca --dir"},
		{[]string{"node", "n", "--dir", notCA}, "not a CA"},
		{[]string{"client", "c", "--dir", dir, "--host", "x"}, "unknown flag --host"},
		{[]string{"client", "c", "--dir", dir, "--days", "-1"}, "--days -1"},
		{[]string{"node", "n", "--dir", dir, "--file", "ca"}, `--file "ca"`},
		{[]string{"node", "n", "--dir", dir, "--file", "../x"}, `--file "../x"`},
		{[]string{"client", "c", "--dir", dir, "--file", ".c"}, `--file ".c"`},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"tls"}, tc.args...)...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("tls %q: exit %d, stdout %q, stderr %q; want exit 2 with %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
	if now := before(); !slices.Equal(now, was) {
		t.Errorf("refused commands wrote files: %q, was %q", now, was)
	}
}

// TestTLSCommandCluster: certificates made with 'questctl tls' run a
// two-node cluster with mutual TLS that requires roles
// (RequireCertRoles): the nodes admit each other (status shows none
// refused; a CP-2 replay through the first opens a grid on the second,
// through its worker API, and gives the in-process result), and the client certificate reaches the client API
// through --tls-dir.
func TestTLSCommandCluster(t *testing.T) {
	dir := t.TempDir()
	mustTLS(t, "ca", "--dir", dir)
	mustTLS(t, "client", "client", "--dir", dir)
	for i := range 2 {
		mustTLS(t, "node", fmt.Sprintf("s%d", i), "--dir", dir)
	}
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, filepath.Join(dir, "ca.pem")))
	nodes := nodetest.Start(t, "s", 2, engine.DefaultConfig(), func(i int, c *node.Config) {
		name := fmt.Sprintf("s%d", i)
		kp, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		c.Plaintext, c.RequireCertRoles = false, true
		c.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{kp},
			RootCAs: roots, ClientCAs: roots, ClientAuth: tls.RequireAndVerifyClientCert}
	})
	addr := nodes[0].Addr()
	if code, out, stderr := runCLI(t, "status", "--addr", addr, "--tls-dir", dir); code != 0 || !strings.Contains(out, "node s0") || strings.Contains(out, "refused") {
		t.Errorf("status --tls-dir: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	code, local, stderr := runCLI(t, "replay", "--in", exampleCase, "--cp", "2")
	if code != 0 {
		t.Fatalf("replay in process: exit %d: %s", code, stderr)
	}
	code, remote, stderr := runCLI(t, "replay", "--in", exampleCase, "--cp", "2", "--addr", addr, "--tls-dir", dir)
	if code != 0 || remote != local {
		t.Errorf("replay through the cluster: exit %d, stderr %q; same result as in process: %v", code, stderr, remote == local)
	}
	if st := nodes[1].Stats(); st.GridsHosted == 0 {
		t.Errorf("s1 hosts no grid after the CP-2 replay: %+v", st)
	}
}
