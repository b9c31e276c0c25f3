package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeFileErrors: questd run with a --model or --chat-template it
// cannot use (missing, a directory without config.json, a template that
// is a directory) exits 2 with one line on stderr that names the flag
// and its path and says why, before anything starts, as for the TLS and
// secret files (TestSecretFileErrors).
func TestServeFileErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	model := filepath.Join(dir, "model")
	if err := os.Mkdir(model, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flag, path, why string
		args            []string
	}{
		{"model", missing, "no such file or directory", nil},
		{"model", dir, "config.json: no such file or directory", nil},
		{"chat-template", missing, "no such file or directory", []string{"--model", model}},
		{"chat-template", dir, "is a directory", []string{"--model", model}},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--insecure", "--name", "s0", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0",
			"--metrics-addr", "", "--http-addr", "127.0.0.1:0", "--" + tc.flag, tc.path}, tc.args...)
		code := run(t.Context(), args, envOf(nil), &stdout, &stderr)
		lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
		prefix := `questd: --` + tc.flag + ` "` + tc.path + `": `
		if code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], prefix) || !strings.Contains(lines[0], tc.why) || stdout.Len() != 0 {
			t.Errorf("--%s %s: exit %d, stderr %q, stdout %q; want exit 2 and one line starting %q that says %q",
				tc.flag, filepath.Base(tc.path), code, stderr.String(), stdout.String(), prefix, tc.why)
		}
	}
}
