package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretFileErrors: questd run with a --gossip-key-file or
// --token-file it cannot use (missing, a directory, unreadable, empty,
// not base64, a token with a space inside) exits 2 with one line on
// stderr that names the flag and its file and says why, and writes
// nothing else, as for the TLS files (TestTLSFileErrors).
func TestSecretFileErrors(t *testing.T) {
	dir := t.TempDir()
	file := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing")
	empty := file("empty", "")
	unreadable := file("unreadable", "secret\n")
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	_, readErr := os.ReadFile(unreadable) // root reads it anyway
	type tcase struct{ flag, path, why string }
	cases := []tcase{
		{"gossip-key-file", missing, "no such file or directory"},
		{"gossip-key-file", dir, "is a directory"},
		{"gossip-key-file", empty, "no key in the file"},
		{"gossip-key-file", file("notb64", "# a key\nnot base64!\n"), "line 2: not base64"},
		{"token-file", missing, "no such file or directory"},
		{"token-file", dir, "is a directory"},
		{"token-file", empty, "empty: want one token"},
		{"token-file", file("spaced", "two words\n"), "no spaces"},
	}
	if readErr != nil {
		cases = append(cases, tcase{"gossip-key-file", unreadable, "permission denied"}, tcase{"token-file", unreadable, "permission denied"})
	}
	for _, tc := range cases {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), []string{"--insecure", "--name", "s0", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0",
			"--metrics-addr", "", "--" + tc.flag, tc.path}, envOf(nil), &stdout, &stderr)
		lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
		prefix := `questd: --` + tc.flag + ` "` + tc.path + `": `
		if code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], prefix) || !strings.Contains(lines[0], tc.why) || stdout.Len() != 0 {
			t.Errorf("--%s %s: exit %d, stderr %q, stdout %q; want exit 2 and one line starting %q that says %q",
				tc.flag, filepath.Base(tc.path), code, stderr.String(), stdout.String(), prefix, tc.why)
		}
	}
}
