package main

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestInsecureFlag: --insecure and its alias --plaintext both select
// plaintext mode, alone or together, on the command line, in the
// environment and in the file; either conflicts with the TLS files.
func TestInsecureFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"--insecure", nil, []string{"--insecure"}},
		{"--plaintext", nil, []string{"--plaintext"}},
		{"both", nil, []string{"--insecure", "--plaintext"}},
		{"QUESTRT_INSECURE", map[string]string{"QUESTRT_INSECURE": "true"}, nil},
		{"QUESTRT_PLAINTEXT", map[string]string{"QUESTRT_PLAINTEXT": "true"}, nil},
		{"file insecure", nil, []string{"--config", writeFile(t, "i.yaml", "insecure: true\n")}},
		{"file both", nil, []string{"--config", writeFile(t, "b.yaml", "insecure: true\nplaintext: true\n")}},
	} {
		c, err := load(t, tc.env, tc.args...)
		if err != nil || !c.Security.Plaintext {
			t.Errorf("%s: plaintext %v, %v", tc.name, c.Security.Plaintext, err)
		}
	}
	for _, alias := range []string{"--insecure", "--plaintext"} {
		_, err := load(t, nil, alias, "--tls-cert", "c.pem")
		if err == nil || !strings.HasPrefix(err.Error(), `--insecure "true": conflicts with --tls-cert "c.pem"`) {
			t.Errorf("%s with --tls-cert: %v", alias, err)
		}
	}
	if _, err := load(t, nil); err == nil || !strings.Contains(err.Error(), "or --insecure to run without TLS") {
		t.Errorf("no TLS: %v", err)
	}
}

// TestWarnInsecure: plaintext mode logs one WARN line saying what is
// exposed; TLS logs none.
func TestWarnInsecure(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	warnInsecure(Config{Security: SecurityConfig{Plaintext: true}, Node: NodeConfig{GRPCAddr: "127.0.0.1:7070"}}, log)
	out := buf.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "level=WARN") ||
		!strings.Contains(out, "gRPC without TLS: anyone who reaches --grpc-addr can") || !strings.Contains(out, "127.0.0.1:7070") {
		t.Errorf("warning %q", out)
	}
	buf.Reset()
	warnInsecure(Config{Security: SecurityConfig{Plaintext: true, Token: "x"}}, log)
	if !strings.Contains(buf.String(), "bearer token") {
		t.Errorf("warning with a token %q", buf.String())
	}
	buf.Reset()
	warnInsecure(Config{Security: SecurityConfig{TLSCert: "c"}}, log)
	if buf.Len() != 0 {
		t.Errorf("TLS logged %q", buf.String())
	}
}

// TestTokenFile: --token-file reads one token, whitespace trimmed; an
// empty, unreadable or malformed file is refused naming the flag (and
// where the flag was set).
func TestTokenFile(t *testing.T) {
	c, err := load(t, nil, "--insecure", "--token-file", writeFile(t, "tok", "  s3cret-1\n\n"))
	if err != nil || c.Security.Token != "s3cret-1" {
		t.Fatalf("token %q, %v", c.Security.Token, err)
	}
	if c, err := load(t, nil, "--insecure"); err != nil || c.Security.Token != "" {
		t.Errorf("no token file: token %q, %v", c.Security.Token, err)
	}
	for _, tc := range []struct {
		name, path, want string
		env              map[string]string
	}{
		{"empty", writeFile(t, "empty", " \n\t\n"), "empty", nil},
		{"missing", filepath.Join(t.TempDir(), "none"), "no such file", nil},
		{"two words", writeFile(t, "two", "a b\n"), "one token", nil},
		{"two lines", writeFile(t, "lines", "a\nb\n"), "one token", nil},
		{"from env", writeFile(t, "e", ""), "(set by QUESTRT_TOKEN_FILE)", map[string]string{}},
	} {
		args := []string{"--insecure", "--token-file", tc.path}
		if tc.env != nil {
			args, tc.env = []string{"--insecure"}, map[string]string{"QUESTRT_TOKEN_FILE": tc.path}
		}
		_, err := load(t, tc.env, args...)
		if err == nil || !strings.HasPrefix(err.Error(), `--token-file "`+tc.path+`": `) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want --token-file ... %s", tc.name, err, tc.want)
		}
	}
}

// TestPrintConfig: --print-config prints the effective configuration
// (flags over environment over file over defaults) as YAML that --config
// reads back to the same configuration, printed the same again; secrets
// are not in it; run exits 0.
func TestPrintConfig(t *testing.T) {
	tok := writeFile(t, "token", "very-secret-token\n")
	key := writeFile(t, "gossip.key", "AAAAAAAAAAAAAAAAAAAAAA==\n")
	file := writeFile(t, "base.yaml", "layers: 6\njoin: [10.0.0.9:7946]\nmax-memory: 8GiB\n")
	env := map[string]string{"QUESTRT_CONFIG": file, "QUESTRT_HEAD_DIM": "64", "QUESTRT_SELECTOR": "oracle", "QUESTRT_TOKEN_FILE": tok}
	args := []string{"--insecure", "--name", "n-1", "--cp", "2", "--kv-heads", "8", "--step-timeout", "1500ms",
		"--log-level", "debug", "--gossip-key-file", key, "--ready-file", "", "--metrics-addr", "", "--cluster-label", "true"}

	print := func(env map[string]string, args ...string) string {
		t.Helper()
		var out bytes.Buffer
		_, err := loadConfig(append(args, "--print-config"), envOf(env), &out)
		if err != errPrinted {
			t.Fatalf("--print-config %q: err %v", args, err)
		}
		return out.String()
	}
	first := print(env, args...)
	for _, w := range []string{"name: n-1\n", "layers: 6\n", "head-dim: 64\n", "cp: 2\n", "selector: oracle\n",
		"max-memory: 8GiB\n", "join:\n  - 10.0.0.9:7946\n", "step-timeout: 1.5s\n", "insecure: true\n",
		"token-file: " + tok + "\n", "metrics-addr: \"\"\n", "cluster-label: \"true\"\n"} {
		if !strings.Contains(first, w) {
			t.Errorf("printed config lacks %q:\n%s", w, first)
		}
	}
	for _, secret := range []string{"very-secret-token", "AAAAAAAA", "\nplaintext:", "\nconfig:", "\nversion:", "\nprint-config:"} {
		if strings.Contains(first, secret) {
			t.Errorf("printed config holds %q:\n%s", secret, first)
		}
	}

	printed := writeFile(t, "printed.yaml", first)
	if second := print(nil, "--config", printed); second != first {
		t.Errorf("round trip differs:\nfirst:\n%s\nsecond:\n%s", first, second)
	}
	want, err := loadConfig(args, envOf(env), new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	got, err := loadConfig([]string{"--config", printed}, envOf(nil), new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	want.ConfigFile, got.ConfigFile = "", ""
	if !reflect.DeepEqual(got, want) {
		t.Errorf("config read back:\n got %+v\nwant %+v", got, want)
	}

	// The defaults round-trip too (an empty list, empty strings).
	def := print(nil, "--insecure")
	if !strings.Contains(def, "join: []\n") {
		t.Errorf("defaults: %s", def)
	}
	if again := print(nil, "--config", writeFile(t, "def.yaml", def)); again != def {
		t.Errorf("defaults round trip differs:\n%s\n%s", def, again)
	}

	// Through run: exit 0, the YAML on stdout; a bad config is still exit 2.
	var out, errw bytes.Buffer
	if code := run(t.Context(), []string{"--insecure", "--print-config"}, envOf(nil), &out, &errw); code != 0 || out.String() != def || errw.Len() != 0 {
		t.Errorf("run --print-config: exit %d, stdout %q, stderr %q", code, out.String(), errw.String())
	}
	if code := run(t.Context(), []string{"--print-config"}, envOf(nil), &out, &errw); code != 2 {
		t.Errorf("run --print-config without TLS or --insecure: exit %d", code)
	}
	// Command line only: not from the environment or the file.
	if _, err := load(t, map[string]string{"QUESTRT_PRINT_CONFIG": "true"}, "--insecure"); err != nil {
		t.Errorf("QUESTRT_PRINT_CONFIG: %v (want ignored)", err)
	}
	if _, err := load(t, nil, "--config", writeFile(t, "p.yaml", "insecure: true\nprint-config: true\n")); err == nil ||
		!strings.Contains(err.Error(), "command line only") {
		t.Errorf("print-config in the file: %v", err)
	}
}
