package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/internal/testcert"
)

// TestTLSFileErrors: questd run with a TLS file it cannot use (missing,
// a directory, unreadable, too large, not PEM, a certificate that does
// not parse, a key that is not the certificate's, a CA without a
// certificate; for gRPC's --tls-* and the completions API's
// --http-tls-*) exits 2 with one line on stderr that names the flag at
// fault and its file, and logs nothing (it stops before the logger and
// before anything listens). The same flags with the good files pass the
// check, so each failure is the file's.
func TestTLSFileErrors(t *testing.T) {
	ca := testcert.NewCA(t, "files CA")
	other := testcert.NewCA(t, "other CA")
	dir := t.TempDir()
	file := func(name string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certPEM, keyPEM := ca.IssuePEM(t, "node")
	_, otherKey := other.IssuePEM(t, "other")
	good := map[string]string{"tls-cert": file("node.pem", certPEM), "tls-key": file("node.key", keyPEM), "tls-ca": file("ca.pem", ca.PEM)}
	httpGood := map[string]string{"http-tls-cert": good["tls-cert"], "http-tls-key": good["tls-key"]}
	missing := filepath.Join(dir, "missing.pem")
	garbage := file("garbage.pem", []byte("not PEM at all\n"))
	badDER := file("baddr.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")}))
	big := file("big.pem", bytes.Repeat([]byte("A"), 2<<20))
	wrongKey := file("other.key", otherKey)
	unreadable := file("unreadable.pem", certPEM)
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	_, readErr := os.ReadFile(unreadable) // root reads it anyway

	args := func(files map[string]string, extra ...string) []string {
		a := []string{"--name", "tlsfiles", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--metrics-addr", ""}
		for f, p := range files {
			a = append(a, "--"+f, p)
		}
		return append(a, extra...)
	}
	with := func(flag, path string) map[string]string {
		m := map[string]string{}
		for f, p := range good {
			m[f] = p
		}
		m[flag] = path
		return m
	}
	httpArgs := []string{"--insecure", "--model", filepath.Join(dir, "model"), "--http-addr", "127.0.0.1:0"}
	httpWith := func(flag, path string) []string {
		a := slicesClone(httpArgs)
		for f, p := range httpGood {
			if f == flag {
				p = path
			}
			a = append(a, "--"+f, p)
		}
		return a
	}
	type tcase struct {
		name, flag, path, why string
		args                  []string
	}
	cases := []tcase{
		{"missing cert", "tls-cert", missing, "no such file or directory", nil},
		{"cert is a directory", "tls-cert", dir, "is a directory", nil},
		{"cert too large", "tls-cert", big, "more than the 1.0 MiB", nil},
		{"cert not PEM", "tls-cert", garbage, "no PEM certificate in it", nil},
		{"cert does not parse", "tls-cert", badDER, "does not parse", nil},
		{"missing key", "tls-key", missing, "no such file or directory", nil},
		{"key not PEM", "tls-key", garbage, "PEM data", nil},
		{"key of another certificate", "tls-key", wrongKey, "does not match", nil},
		{"missing CA", "tls-ca", missing, "no such file or directory", nil},
		{"CA not PEM", "tls-ca", garbage, "no PEM certificate in it", nil},
		{"CA too large", "tls-ca", big, "more than the 1.0 MiB", nil},
		{"missing HTTP cert", "http-tls-cert", missing, "no such file or directory", httpWith("http-tls-cert", missing)},
		{"HTTP key of another certificate", "http-tls-key", wrongKey, "does not match", httpWith("http-tls-key", wrongKey)},
	}
	if readErr != nil {
		cases = append(cases, tcase{"cert unreadable", "tls-cert", unreadable, "permission denied", nil})
	}
	for _, tc := range cases {
		a := tc.args
		if a == nil {
			a = args(with(tc.flag, tc.path))
		}
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), a, envOf(nil), &stdout, &stderr)
		lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
		prefix := `questd: --` + tc.flag + ` "` + tc.path + `": `
		if code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], prefix) || !strings.Contains(lines[0], tc.why) || stdout.Len() != 0 {
			t.Errorf("%s: exit %d, stderr %q, stdout %q; want exit 2 and one line starting %q that says %q", tc.name, code, stderr.String(), stdout.String(), prefix, tc.why)
		}
	}

	// The good files pass the check (run would go on to serve).
	for _, a := range [][]string{args(good), append(slicesClone(httpArgs), "--http-tls-cert", httpGood["http-tls-cert"], "--http-tls-key", httpGood["http-tls-key"])} {
		cfg, err := loadConfig(a, envOf(nil), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%q: %v", a, err)
		}
		if err := checkTLSFiles(cfg); err != nil {
			t.Errorf("good files %q: %v", a, err)
		}
	}
}

func slicesClone(a []string) []string { return append([]string(nil), a...) }
