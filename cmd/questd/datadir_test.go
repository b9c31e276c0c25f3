package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogDataDir: the start-up lines about --data-dir name the
// coordinators whose grids persisted there, and warn when none is this
// node's own (a node restarted under another --name).
func TestLogDataDir(t *testing.T) {
	dir := t.TempDir()
	for _, g := range []string{"grids/alpha/shape.0", "grids/alpha/shape.1", "grids/beta/shape.0"} {
		if err := os.MkdirAll(filepath.Join(dir, g), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		dir, name string
		want      []string
		warn      bool
	}{
		{t.TempDir(), "alpha", []string{"nothing persisted yet"}, false},
		{dir, "alpha", []string{"persisted grids found", "alpha:2", "beta:1"}, false},
		{dir, "gamma", []string{"persisted grids found", "no grid of this node's own coordinator", "name=gamma"}, true},
	} {
		var b bytes.Buffer
		logDataDir(c.dir, c.name, slog.New(slog.NewTextHandler(&b, nil)))
		out := b.String()
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("name %s: log %q lacks %q", c.name, out, w)
			}
		}
		if strings.Contains(out, "level=WARN") != c.warn {
			t.Errorf("name %s: warning %v, want %v:\n%s", c.name, !c.warn, c.warn, out)
		}
	}
}
