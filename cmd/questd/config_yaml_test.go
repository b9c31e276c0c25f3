package main

import (
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/plan"
)

// TestYAMLStrict: unknown keys and values of the wrong kind are refused,
// naming the file and the key.
func TestYAMLStrict(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string // substrings of the error
	}{
		{"unknown key", "grpc-adr: 127.0.0.1:1\n", []string{`unknown key "grpc-adr"`, "line 1"}},
		{"underscore", "plaintext: true\ngrpc_addr: 127.0.0.1:1\n", []string{`unknown key "grpc_addr"`, "did you mean grpc-addr?", "line 2"}},
		{"string for int", "layers: four\n", []string{`key "layers"`, "want an integer, not a string"}},
		{"sequence for int", "layers: [1, 2]\n", []string{`key "layers"`, "want an integer, not a sequence"}},
		{"float for int", "layers: 1.5\n", []string{`key "layers"`, "want an integer, not a number"}},
		{"yes for bool", "plaintext: yes\n", []string{`key "plaintext"`, "want true or false, not a string"}},
		{"int for duration", "step-timeout: 2\n", []string{`key "step-timeout"`, "want a duration string"}},
		{"scalar for list", "join: a:1\n", []string{`key "join"`, "want a sequence of strings"}},
		{"mapping for string", "name:\n  a: b\n", []string{`key "name"`, "not a mapping"}},
		{"int for string", "name: 123\n", []string{`key "name"`, "want a string, not an integer (quote it)"}},
		{"bad value", "plaintext: true\nlayers: 0x\n", []string{`layers`}},
		{"bad duration", "step-timeout: soon\n", []string{`step-timeout "soon"`}},
		{"bad mode", "gqa: widest\n", []string{`gqa "widest"`, "group_max or per_head"}},
		{"repeated key", "layers: 2\nlayers: 3\n", []string{`key "layers" repeated`, "line 2"}},
		{"config in config", "config: x.yaml\n", []string{`key "config"`}},
		{"not a mapping", "- layers\n", []string{"want a mapping"}},
		{"syntax", "layers: [\n", []string{"--config"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, "q.yaml", tc.yaml)
			_, err := load(t, nil, "--config", p)
			if err == nil {
				t.Fatalf("no error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, `--config "`+p+`": `) {
				t.Errorf("error %q does not name the file", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
		})
	}
	// A missing file, an empty file.
	if _, err := load(t, nil, "--plaintext", "--config", filepath.Join(t.TempDir(), "none.yaml")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
	for _, text := range []string{"", "# nothing\n", "~\n"} {
		if _, err := load(t, nil, "--plaintext", "--config", writeFile(t, "e.yaml", text)); err != nil {
			t.Errorf("file %q: %v", text, err)
		}
	}
	// A wrong kind is refused even for a key the command line overrides.
	p := writeFile(t, "q.yaml", "layers: four\n")
	if _, err := load(t, nil, "--plaintext", "--layers", "3", "--config", p); err == nil {
		t.Errorf("wrong kind under a flag: no error")
	}
	// Every kind of flag has a value the file accepts.
	p = writeFile(t, "all.yaml", `
name: n-1
grpc-addr: 10.0.0.5:7070
advertise: 10.0.0.5
gossip-addr: 0.0.0.0:7946
join: [10.0.0.6:7946]
max-memory: 0
selection: union
log-level: debug
drain-timeout: 1m
plaintext: true
`)
	c, err := load(t, nil, "--config", p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node.Name != "n-1" || c.Node.GRPCAddr != "10.0.0.5:7070" || c.Capacity.MaxMemory != 0 || c.Policy.Selection != plan.Union ||
		c.Log.Level != slog.LevelDebug || c.Node.DrainTimeout != time.Minute || !slices.Equal(c.Membership.Join, []string{"10.0.0.6:7946"}) {
		t.Errorf("all kinds: %+v", c)
	}
}
