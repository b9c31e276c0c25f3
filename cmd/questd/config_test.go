package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// envOf returns a getenv over m.
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// writeFile writes a file under t.TempDir and returns its path.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// load runs loadConfig with env and no stdout expected.
func load(t *testing.T, env map[string]string, args ...string) (Config, error) {
	t.Helper()
	var out bytes.Buffer
	c, err := loadConfig(args, envOf(env), &out)
	if out.Len() > 0 {
		t.Errorf("loadConfig(%q) wrote %q to stdout", args, out.String())
	}
	return c, err
}

// TestDefaults: the flags' defaults are the documented ones (literals
// here, not the code's constants).
func TestDefaults(t *testing.T) {
	var c Config
	fs, _ := newFlagSet(&c, "host-1")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	want := Config{
		Name: "host-1", GRPCAddr: "127.0.0.1:7070", Advertise: "", GossipAddr: "127.0.0.1:7946", Join: nil,
		ClusterLabel: "questrt", GossipKeyFile: "", Plaintext: false, TLSCert: "", TLSKey: "", TLSCA: "",
		Layers: 4, QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16, CP: 1, TP: 1, CapacityPages: 1024, BlockPages: 64,
		BudgetTokens: 2048, SinkPages: 0, LocalPages: 1, DenseLayers: 2,
		GQA: plan.GroupMax, Selector: plan.Quest, Selection: plan.Exact,
		Backend: "cpu", KVCacheDType: plan.BFloat16,
		MaxPages: 0, MaxMemory: 0, DeviceBudgetPages: 0, Eviction: pagestore.EvictLRU, PrefetchPages: 0, PrefetchCrossLayer: false,
		DataDir: "", Durability: pagestore.SyncOnWrite, SyncInterval: time.Second,
		StepTimeout: 2 * time.Second, ProbeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond, SuspicionMult: 4,
		GossipInterval: 200 * time.Millisecond, DeadNodeReclaim: 5 * time.Second, DrainTimeout: 10 * time.Second, GridIdle: time.Minute,
		MetricsAddr: "127.0.0.1:9464", LogLevel: slog.LevelInfo, LogFormat: "text", ReadyFile: "", ConfigFile: "",
		Model: "", HTTPAddr: "", ModelName: "", MaxRunning: 16, MaxQueued: 64, PrefillChunk: 512, ServePages: 4096, MonitorQueue: 64, RequestHistory: 64,
		ServeLayout: "local", ServeCP: 1, ServeTP: 1, ServePolicyGrids: 2,
		HTTPMaxConns: 256, HTTPReadHeaderTimeout: 5 * time.Second, HTTPIdleTimeout: 60 * time.Second,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if c.hostPages() != 8192 {
		t.Errorf("hostPages() = %d, want 8192", c.hostPages())
	}

	// Through loadConfig: the defaults but TLS are a valid node, named
	// after the host.
	got, err := load(t, nil, "--plaintext")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want.Name, want.Plaintext = host, true
	if !reflect.DeepEqual(got, want) {
		t.Errorf("loadConfig(--plaintext):\n got %+v\nwant %+v", got, want)
	}
	// Without --plaintext, the defaults lack TLS files.
	if _, err := load(t, nil); err == nil || !strings.HasPrefix(err.Error(), `--tls-cert "": `) {
		t.Errorf("no TLS and no --plaintext: err %v", err)
	}
}

// TestPrecedence: flags over the environment over the file over the
// defaults, each layer winning where it is the highest one set.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "questd.yaml", `
layers: 6          # file only
head-dim: 64       # file, env
page-size: 32      # file, env, flag
join: [a:1, b:2]   # file, env (a list is replaced, not appended)
block-pages: 8     # file, flag
plaintext: true
`)
	env := map[string]string{
		"QUESTRT_CONFIG":    file,
		"QUESTRT_HEAD_DIM":  "96",
		"QUESTRT_PAGE_SIZE": "8",
		"QUESTRT_JOIN":      "c:3",
		"QUESTRT_TP":        "2",        // env only
		"QUESTRT_MODELS":    "/nowhere", // not a flag: ignored
	}
	c, err := load(t, env, "--page-size", "64", "--block-pages", "4", "--cp", "3")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []struct {
		name      string
		got, want any
	}{
		{"layers (file)", c.Layers, 6},
		{"head-dim (env over file)", c.HeadDim, 96},
		{"page-size (flag over env and file)", c.PageSize, 64},
		{"join (env replaces file)", c.Join, []string{"c:3"}},
		{"block-pages (flag over file)", c.BlockPages, 4},
		{"tp (env)", c.TP, 2},
		{"cp (flag)", c.CP, 3},
		{"q-heads (default)", c.QHeads, 32},
		{"plaintext (file)", c.Plaintext, true},
		{"config (env)", c.ConfigFile, file},
	} {
		if !reflect.DeepEqual(g.got, g.want) {
			t.Errorf("%s = %v, want %v", g.name, g.got, g.want)
		}
	}

	// --config wins over QUESTRT_CONFIG; the file's list is used as given.
	other := writeFile(t, "other.yaml", "layers: 7\njoin:\n  - x:1\n  - y:2\nplaintext: true\n")
	c, err = load(t, map[string]string{"QUESTRT_CONFIG": file}, "--config", other)
	if err != nil {
		t.Fatal(err)
	}
	if c.Layers != 7 || !slices.Equal(c.Join, []string{"x:1", "y:2"}) {
		t.Errorf("--config over QUESTRT_CONFIG: layers %d, join %q", c.Layers, c.Join)
	}

	// Flags of a list append: repeated and comma-separated.
	c, err = load(t, nil, "--plaintext", "--join", "a:1", "--join", "b:2,c:3")
	if err != nil || !slices.Equal(c.Join, []string{"a:1", "b:2", "c:3"}) {
		t.Errorf("--join twice: %q, %v", c.Join, err)
	}
	// An empty environment variable is ignored.
	c, err = load(t, map[string]string{"QUESTRT_LAYERS": "", "QUESTRT_PLAINTEXT": "true"})
	if err != nil || c.Layers != 4 || !c.Plaintext {
		t.Errorf("empty QUESTRT_LAYERS: layers %d, plaintext %v, %v", c.Layers, c.Plaintext, err)
	}
}

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
	if c.Name != "n-1" || c.GRPCAddr != "10.0.0.5:7070" || c.MaxMemory != 0 || c.Selection != plan.Union ||
		c.LogLevel != slog.LevelDebug || c.DrainTimeout != time.Minute || !slices.Equal(c.Join, []string{"10.0.0.6:7946"}) {
		t.Errorf("all kinds: %+v", c)
	}
}

// TestEnvNames: QUESTRT_ + upper-case flag name with '-' as '_', for
// every flag; getenv is asked for nothing else.
func TestEnvNames(t *testing.T) {
	for name, want := range map[string]string{
		"grpc-addr": "QUESTRT_GRPC_ADDR", "kv-heads": "QUESTRT_KV_HEADS", "tls-ca": "QUESTRT_TLS_CA",
		"max-memory": "QUESTRT_MAX_MEMORY", "cp": "QUESTRT_CP", "gossip-key-file": "QUESTRT_GOSSIP_KEY_FILE",
	} {
		if got := envName(name); got != want {
			t.Errorf("envName(%q) = %q, want %q", name, got, want)
		}
	}
	var asked []string
	getenv := func(k string) (string, bool) {
		asked = append(asked, k)
		switch k {
		case "QUESTRT_GRPC_ADDR":
			return "127.0.0.2:0", true
		case "QUESTRT_GOSSIP_ADDR":
			return "127.0.0.2:0", true
		case "QUESTRT_MAX_MEMORY":
			return "none", true
		case "QUESTRT_PLAINTEXT":
			return "1", true
		case "QUESTRT_LOG_FORMAT":
			return "json", true
		}
		return "", false
	}
	c, err := loadConfig(nil, getenv, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if c.GRPCAddr != "127.0.0.2:0" || c.GossipAddr != "127.0.0.2:0" || c.MaxMemory != -1 || !c.Plaintext || c.LogFormat != "json" {
		t.Errorf("from env: %+v", c)
	}
	var c0 Config
	fs, _ := newFlagSet(&c0, "h")
	var want []string
	fs.VisitAll(func(f *flag.Flag) {
		if !cliOnly(f.Name) { // the command line only
			want = append(want, envName(f.Name))
		}
	})
	slices.Sort(asked)
	slices.Sort(want) // flag order is not env-name order ("devices" vs "device-budget-pages")
	if !slices.Equal(asked, want) {
		t.Errorf("getenv asked for %q, want exactly %q", asked, want)
	}
	// A bad value names the variable.
	_, err = load(t, map[string]string{"QUESTRT_LAYERS": "four", "QUESTRT_PLAINTEXT": "true"})
	if err == nil || err.Error() != `QUESTRT_LAYERS "four": not an integer` {
		t.Errorf("bad env value: %v", err)
	}
}

// TestValidateNamesFlag: every validation error starts with the flag it
// is about, in the form `--flag "value": why`.
func TestValidateNamesFlag(t *testing.T) {
	keyFile := func(n int) string {
		return writeFile(t, "gossip.key", base64.StdEncoding.EncodeToString(make([]byte, n))+"\n")
	}
	for _, tc := range []struct {
		args []string
		want string // prefix of the error
	}{
		{[]string{"--name", ""}, `--name "": `},
		{[]string{"--name", "a b"}, `--name "a b": `},
		{[]string{"--grpc-addr", "7070"}, `--grpc-addr "7070": want host:port`},
		{[]string{"--grpc-addr", "localhost:7070"}, `--grpc-addr "localhost:7070": host "localhost" is not an IP address`},
		{[]string{"--grpc-addr", "127.0.0.1:70000"}, `--grpc-addr "127.0.0.1:70000": port`},
		{[]string{"--grpc-addr", "0.0.0.0:7070"}, `--grpc-addr "0.0.0.0:7070": listens on every interface: set --advertise`},
		{[]string{"--grpc-addr", ":7070"}, `--grpc-addr ":7070": listens on every interface`},
		{[]string{"--advertise", "node-1"}, `--advertise "node-1": not an IP address`},
		{[]string{"--advertise", "::"}, `--advertise "::": unspecified`},
		{[]string{"--gossip-addr", "x:1"}, `--gossip-addr "x:1": host "x" is not an IP address`},
		{[]string{"--grpc-addr", "10.0.0.5:7070"}, `--gossip-addr "127.0.0.1:7946": binds 127.0.0.1 but the node advertises 10.0.0.5`},
		{[]string{"--advertise", "10.0.0.5"}, `--grpc-addr "127.0.0.1:7070": binds a loopback address, which other nodes cannot reach at --advertise 10.0.0.5`},
		{[]string{"--advertise", "10.0.0.5", "--grpc-addr", "0.0.0.0:7070"}, `--gossip-addr "127.0.0.1:7946": binds a loopback address`},
		{[]string{"--join", "10.0.0.6"}, `--join "10.0.0.6": want host:port`},
		{[]string{"--join", "10.0.0.6:0"}, `--join "10.0.0.6:0": port`},
		{[]string{"--cluster-label", strings.Repeat("l", 256)}, `--cluster-label "` + strings.Repeat("l", 256) + `": 256 bytes, limit 255`},
		{[]string{"--gossip-key-file", keyFile(20)}, `--gossip-key-file "`},
		{[]string{"--gossip-key-file", writeFile(t, "bad.key", "not base64!\n")}, `--gossip-key-file "`},
		{[]string{"--tls-cert", "c.pem"}, `--insecure "true": conflicts with --tls-cert "c.pem"`},
		{[]string{"--layers", "0"}, `--layers "0": must be at least 1`},
		{[]string{"--q-heads", "0"}, `--q-heads "0": must be at least 1`},
		{[]string{"--kv-heads", "-1"}, `--kv-heads "-1": must be at least 1`},
		{[]string{"--head-dim", "0"}, `--head-dim "0": `},
		{[]string{"--page-size", "0"}, `--page-size "0": `},
		{[]string{"--cp", "0"}, `--cp "0": `},
		{[]string{"--tp", "0"}, `--tp "0": `},
		{[]string{"--capacity-pages", "0"}, `--capacity-pages "0": `},
		{[]string{"--capacity-pages", "4294967296"}, `--capacity-pages "4294967296": more than`},
		{[]string{"--block-pages", "0"}, `--block-pages "0": `},
		{[]string{"--kv-heads", "6", "--q-heads", "30", "--tp", "4"}, `--kv-heads "6": not divisible by --tp 4`},
		{[]string{"--q-heads", "30"}, `--q-heads "30": not a multiple of --kv-heads 8`},
		{[]string{"--budget-tokens", "8"}, `--budget-tokens "8": below one page (--page-size 16)`},
		{[]string{"--sink-pages", "-1"}, `--sink-pages "-1": `},
		{[]string{"--local-pages", "-1"}, `--local-pages "-1": `},
		{[]string{"--sink-pages", "500"}, `--sink-pages "500": plus --local-pages 1 forced pages exceed K = 128 pages`},
		{[]string{"--budget-tokens", "32", "--local-pages", "3"}, `--sink-pages "0": plus --local-pages 3 forced pages exceed K = 2 pages`},
		{[]string{"--dense-layers", "-1"}, `--dense-layers "-1": `},
		{[]string{"--gqa", "wide"}, `--gqa "wide": `},
		{[]string{"--selector", "best"}, `--selector "best": `},
		{[]string{"--selection", "some"}, `--selection "some": `},
		{[]string{"--selection", "replicated", "--selector", "recent"}, `--selection "replicated": needs --selector quest or dense`},
		{[]string{"--max-pages", "-1"}, `--max-pages "-1": `},
		{[]string{"--max-pages", "100"}, `--max-pages "100": below --capacity-pages 1024`},
		{[]string{"--max-memory", "lots"}, `--max-memory "lots": not a size`},
		{[]string{"--backend", "gpu"}, `--backend "gpu": want cpu or cuda`},
		{[]string{"--devices", "0,1"}, `--devices "0,1": needs --backend cuda`},
		{[]string{"--backend", "cuda", "--devices", "0,x"}, `--devices "0,x": "x" is not a GPU ordinal`},
		{[]string{"--backend", "cuda", "--devices", "-1"}, `--devices "-1": "-1" is not a GPU ordinal`},
		{[]string{"--kv-cache-dtype", "fp4"}, `--kv-cache-dtype "fp4": `},
		{[]string{"--kv-cache-dtype", "f16"}, `--kv-cache-dtype "f16": needs --backend cuda`},
		{[]string{"--device-budget-pages", "-1"}, `--device-budget-pages "-1": must not be negative`},
		{[]string{"--device-budget-pages", "1025"}, `--device-budget-pages "1025": above --capacity-pages 1024`},
		{[]string{"--device-budget-pages", "x"}, `--device-budget-pages "x": not an integer`},
		{[]string{"--eviction", "fifo"}, `--eviction "fifo": want lru or score`},
		{[]string{"--eviction="}, `--eviction "": want lru or score`},
		{[]string{"--device-budget-pages", "64", "--prefetch-pages", "-1"}, `--prefetch-pages "-1": must not be negative`},
		{[]string{"--device-budget-pages", "64", "--prefetch-pages", "2000"}, `--prefetch-pages "2000": above --capacity-pages 1024`},
		{[]string{"--prefetch-pages", "8"}, `--prefetch-pages "8": needs --device-budget-pages`},
		{[]string{"--device-budget-pages", "64", "--prefetch-cross-layer"}, `--prefetch-cross-layer "true": needs --prefetch-pages`},
		{[]string{"--prefetch-cross-layer=maybe"}, `--prefetch-cross-layer "maybe": not true or false`},
		{[]string{"--step-timeout", "0s"}, `--step-timeout "0s": must be positive`},
		{[]string{"--step-timeout", "soon"}, `--step-timeout "soon": not a duration such as 2s`},
		{[]string{"--probe-interval", "-1s"}, `--probe-interval "-1s": must be positive`},
		{[]string{"--probe-timeout", "0s"}, `--probe-timeout "0s": `},
		{[]string{"--probe-timeout", "1s"}, `--probe-timeout "1s": must be below --probe-interval 1s`},
		{[]string{"--suspicion-mult", "0"}, `--suspicion-mult "0": `},
		{[]string{"--gossip-interval", "0s"}, `--gossip-interval "0s": `},
		{[]string{"--drain-timeout", "-1s"}, `--drain-timeout "-1s": must not be negative`},
		{[]string{"--metrics-addr", "9464"}, `--metrics-addr "9464": want host:port`},
		{[]string{"--metrics-addr", "localhost:9464"}, `--metrics-addr "localhost:9464": host "localhost" is not an IP address`},
		{[]string{"--metrics-addr", "127.0.0.1:99999"}, `--metrics-addr "127.0.0.1:99999": port`},
		{[]string{"--log-level", "trace"}, `--log-level "trace": want debug, info, warn or error`},
		{[]string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"--layers", "x"}, `--layers "x": not an integer`},
		{[]string{"--layers", "99999999999999999999"}, `--layers "99999999999999999999": too large for an integer`},
		{[]string{"--plaintext=maybe"}, `--plaintext "maybe": not true or false`},
		{[]string{"--no-such"}, `unknown flag --no-such`},
		{[]string{"stray"}, `unexpected arguments ["stray"]`},
	} {
		args := append([]string{"--plaintext"}, tc.args...)
		_, err := load(t, nil, args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: err %v, want one line starting %q", tc.args, err, tc.want)
		}
	}

	// TLS is all or nothing without --plaintext.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, `--tls-cert "": mutual TLS needs`},
		{[]string{"--tls-cert", "c.pem"}, `--tls-key "": mutual TLS needs`},
		{[]string{"--tls-cert", "c.pem", "--tls-key", "k.pem"}, `--tls-ca "": mutual TLS needs`},
		{[]string{"--tls-key", "k.pem", "--tls-ca", "ca.pem"}, `--tls-cert "": `},
	} {
		_, err := load(t, nil, tc.args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.args, err, tc.want)
		}
	}
	if c, err := load(t, nil, "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"); err != nil || c.Plaintext {
		t.Errorf("all three TLS files: %v", err)
	}

	// A value from the environment or the file says where it came from.
	_, err := load(t, map[string]string{"QUESTRT_KV_HEADS": "6", "QUESTRT_TP": "4"}, "--plaintext", "--q-heads", "36")
	if err == nil || err.Error() != `--kv-heads "6": not divisible by --tp 4 (set by QUESTRT_KV_HEADS)` {
		t.Errorf("from env: %v", err)
	}
	p := writeFile(t, "q.yaml", "plaintext: true\n\nlayers: 0\n")
	_, err = load(t, nil, "--config", p)
	if err == nil || err.Error() != `--layers "0": must be at least 1 (set by `+p+` line 3)` {
		t.Errorf("from file: %v", err)
	}
}

// TestGossipKeys: the key file holds base64 keys, one per line, the
// first encrypting; they reach the member config.
func TestGossipKeys(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 16)
	p := writeFile(t, "gossip.key", "# current first\n"+base64.StdEncoding.EncodeToString(k1)+"\n\n"+base64.StdEncoding.EncodeToString(k2)+"\n")
	c, err := load(t, nil, "--plaintext", "--gossip-key-file", p)
	if err != nil {
		t.Fatal(err)
	}
	if m := c.memberConfig(); !reflect.DeepEqual(m.SecretKeys, [][]byte{k1, k2}) {
		t.Errorf("secret keys %x", m.SecretKeys)
	}
	for _, text := range []string{"", "# none\n"} {
		_, err := load(t, nil, "--plaintext", "--gossip-key-file", writeFile(t, "k", text))
		if err == nil || !strings.Contains(err.Error(), "no key") {
			t.Errorf("key file %q: %v", text, err)
		}
	}
}

// TestHelp: --help and -h print the usage on stdout, with what questd
// does, the precedence rule and every flag with its default and variable.
func TestHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var out bytes.Buffer
		_, err := loadConfig([]string{arg}, envOf(nil), &out)
		if !errors.Is(err, errHelp) {
			t.Fatalf("%s: err %v, want errHelp", arg, err)
		}
		help := out.String()
		for _, w := range []string{
			"Usage: questd", "node daemon", "health", `{"event":"ready","name":`, "SIGTERM", "exits 0",
			"Precedence: flags, then the environment, then the file, then the defaults",
			"(default 127.0.0.1:7070)", "(default 2s)", "(default auto)", "(default group_max)", "(default 1024)",
		} {
			if !strings.Contains(help, w) {
				t.Errorf("%s: usage lacks %q", arg, w)
			}
		}
		var c Config
		fs, groups := newFlagSet(&c, "h")
		var grouped []string
		for _, g := range groups {
			grouped = append(grouped, g.names...)
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.Contains(help, "\n  --"+f.Name+" ") && !strings.Contains(help, "\n  --"+f.Name+"\n") {
				t.Errorf("%s: usage lacks --%s", arg, f.Name)
			}
			if cliOnly(f.Name) {
				if strings.Contains(help, "env "+envName(f.Name)) {
					t.Errorf("%s: usage names %s, which is not read", arg, envName(f.Name))
				}
			} else if !strings.Contains(help, "env "+envName(f.Name)+"\n") {
				t.Errorf("%s: usage lacks %s", arg, envName(f.Name))
			}
			if !slices.Contains(grouped, f.Name) {
				t.Errorf("--%s is in no usage section", f.Name)
			}
		})
	}
}

// TestMemberConfig: the node's membership config carries the flags, is
// valid, and its detection bound is the one documented on Config.
func TestMemberConfig(t *testing.T) {
	c, err := load(t, nil, "--plaintext", "--name", "n1", "--grpc-addr", "10.0.0.5:7070", "--gossip-addr", ":0",
		"--join", "10.0.0.6:7946", "--cluster-label", "lab", "--probe-interval", "100ms", "--probe-timeout", "50ms",
		"--suspicion-mult", "2", "--gossip-interval", "20ms")
	if err != nil {
		t.Fatal(err)
	}
	m := c.memberConfig()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if m.Name != "n1" || m.BindAddr != "0.0.0.0" || m.BindPort != 0 || m.AdvertiseAddr != "10.0.0.5" ||
		!slices.Equal(m.Join, []string{"10.0.0.6:7946"}) || m.Label != "lab" || len(m.SecretKeys) != 0 ||
		m.ProbeInterval != 100*time.Millisecond || m.ProbeTimeout != 50*time.Millisecond || m.SuspicionMult != 2 ||
		m.GossipInterval != 20*time.Millisecond {
		t.Errorf("member config %+v", m)
	}
	if m.DeadRetention != cluster.DefaultMemberConfig().DeadRetention {
		t.Errorf("unexposed fields must keep cluster's defaults")
	}

	c, err = load(t, nil, "--plaintext", "--advertise", "192.0.2.1", "--grpc-addr", "192.0.2.1:7070", "--gossip-addr", "0.0.0.0:7946")
	if err != nil {
		t.Fatal(err)
	}
	m = c.memberConfig()
	if m.BindAddr != "0.0.0.0" || m.BindPort != 7946 || m.AdvertiseAddr != "192.0.2.1" || c.advertiseHost() != "192.0.2.1" {
		t.Errorf("defaults with --advertise: %+v", m)
	}
	if got := m.DetectionBound(3); got != 9800*time.Millisecond {
		t.Errorf("DetectionBound(3) with the default timings = %v, documented 9.8s", got)
	}
}

// TestEngineConfig: the engine config carries the geometry, grid, policy
// and mode, and is valid.
func TestEngineConfig(t *testing.T) {
	c, err := load(t, nil, "--plaintext", "--layers", "3", "--q-heads", "16", "--kv-heads", "4", "--head-dim", "64",
		"--page-size", "8", "--cp", "2", "--tp", "2", "--capacity-pages", "256", "--block-pages", "16",
		"--budget-tokens", "512", "--sink-pages", "1", "--local-pages", "2", "--dense-layers", "1",
		"--gqa", "per_head", "--selector", "dense", "--selection", "replicated", "--max-memory", "8GiB", "--step-timeout", "3s")
	if err != nil {
		t.Fatal(err)
	}
	e := c.engineConfig()
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	want := plan.Policy{PageSize: 8, BudgetTokens: 512, SinkPages: 1, LocalPages: 2, DenseLayers: 1, GQA: plan.PerHead, Selector: plan.Dense}
	if e.Layers != 3 || e.QHeads != 16 || e.KVHeads != 4 || e.HeadDim != 64 || e.PageSize != 8 || e.CP != 2 || e.TP != 2 ||
		e.CapacityPages != 256 || e.BlockPages != 16 || !reflect.DeepEqual(e.Policy, want) || e.Selection != plan.Replicated ||
		e.MemoryLimit != 8<<30 || e.StepTimeout != 3*time.Second {
		t.Errorf("engine config %+v", e)
	}
	if e.DeviceBudgetPages != 0 || e.Eviction != pagestore.EvictLRU || e.PrefetchPages != 0 || e.PrefetchCrossLayer {
		t.Errorf("offload is on by default: %+v", e)
	}
}

// TestEngineConfigOffload: the offload flags, from each source, reach the
// engine config and its worker config (what travels to the grid's
// nodes), which validate.
func TestEngineConfigOffload(t *testing.T) {
	check := func(c Config) {
		t.Helper()
		e := c.engineConfig()
		if err := e.Validate(); err != nil {
			t.Fatal(err)
		}
		if e.DeviceBudgetPages != 64 || e.Eviction != pagestore.EvictScore || e.PrefetchPages != 8 || !e.PrefetchCrossLayer {
			t.Errorf("engine config offload: budget %d, eviction %v, prefetch %d, cross-layer %v", e.DeviceBudgetPages, e.Eviction, e.PrefetchPages, e.PrefetchCrossLayer)
		}
		w := e.WorkerConfig()
		if w.DeviceBudgetPages != 64 || w.Eviction != pagestore.EvictScore || w.PrefetchPages != 8 || !w.PrefetchCrossLayer {
			t.Errorf("worker config offload: %+v", w)
		}
	}
	c, err := load(t, nil, "--plaintext", "--device-budget-pages", "64", "--eviction", "score", "--prefetch-pages", "8", "--prefetch-cross-layer")
	if err != nil {
		t.Fatal(err)
	}
	check(c)
	c, err = load(t, map[string]string{"QUESTRT_DEVICE_BUDGET_PAGES": "64", "QUESTRT_EVICTION": "score",
		"QUESTRT_PREFETCH_PAGES": "8", "QUESTRT_PREFETCH_CROSS_LAYER": "true"}, "--plaintext")
	if err != nil {
		t.Fatal(err)
	}
	check(c)
	p := writeFile(t, "offload.yaml", "plaintext: true\ndevice-budget-pages: 64\neviction: score\nprefetch-pages: 8\nprefetch-cross-layer: true\n")
	c, err = load(t, nil, "--config", p)
	if err != nil {
		t.Fatal(err)
	}
	check(c)
	// A value from the file names the file.
	p = writeFile(t, "bad.yaml", "plaintext: true\nprefetch-pages: 8\n")
	if _, err := load(t, nil, "--config", p); err == nil || err.Error() != `--prefetch-pages "8": needs --device-budget-pages (prefetch needs offload) (set by `+p+` line 2)` {
		t.Errorf("prefetch without a budget from the file: %v", err)
	}
}

// TestMetricsAddr: --metrics-addr defaults to 127.0.0.1:9464, takes any
// IP or empty host and port 0, and "" on the command line or in the file
// disables the server (an empty environment variable is ignored, as for
// every flag).
func TestMetricsAddr(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, nil, "127.0.0.1:9464"},
		{nil, []string{"--metrics-addr", "0.0.0.0:9100"}, "0.0.0.0:9100"},
		{nil, []string{"--metrics-addr", ":0"}, ":0"},
		{nil, []string{"--metrics-addr", "[::1]:9464"}, "[::1]:9464"},
		{nil, []string{"--metrics-addr", ""}, ""},
		{nil, []string{"--metrics-addr="}, ""},
		{map[string]string{"QUESTRT_METRICS_ADDR": "127.0.0.2:1"}, nil, "127.0.0.2:1"},
		{map[string]string{"QUESTRT_METRICS_ADDR": ""}, nil, "127.0.0.1:9464"},
		{map[string]string{"QUESTRT_METRICS_ADDR": "127.0.0.2:1"}, []string{"--metrics-addr", ""}, ""},
		{nil, []string{"--config", writeFile(t, "m.yaml", "metrics-addr: \"\"\n")}, ""},
		{nil, []string{"--config", writeFile(t, "m.yaml", "metrics-addr: 127.0.0.3:9\n")}, "127.0.0.3:9"},
	} {
		c, err := load(t, tc.env, append([]string{"--plaintext"}, tc.args...)...)
		if err != nil || c.MetricsAddr != tc.want {
			t.Errorf("env %v, args %q: metrics-addr %q, %v; want %q", tc.env, tc.args, c.MetricsAddr, err, tc.want)
		}
	}
	_, err := load(t, map[string]string{"QUESTRT_METRICS_ADDR": "nowhere"}, "--plaintext")
	if err == nil || err.Error() != `--metrics-addr "nowhere": want host:port (set by QUESTRT_METRICS_ADDR)` {
		t.Errorf("bad QUESTRT_METRICS_ADDR: %v", err)
	}
}

// TestFlagAliases: --tensor-parallel-size and --decode-context-parallel-size
// (vLLM's names) set --tp and --cp, and --plaintext sets --insecure, from
// every source at the flag's precedence whichever name each source uses;
// two names with different values in one environment or file conflict;
// --print-config prints the flags' own names only.
func TestFlagAliases(t *testing.T) {
	grid := func(t *testing.T, env map[string]string, args ...string) (int, int) {
		t.Helper()
		c, err := load(t, env, append([]string{"--plaintext"}, args...)...)
		if err != nil {
			t.Fatalf("env %v args %q: %v", env, args, err)
		}
		return c.CP, c.TP
	}
	for _, tc := range []struct {
		name           string
		env            map[string]string
		file           string
		args           []string
		wantCP, wantTP int
	}{
		{"flags", nil, "", []string{"--tensor-parallel-size", "2", "--decode-context-parallel-size", "3"}, 3, 2},
		{"the last name given wins", nil, "", []string{"--tp", "4", "--tensor-parallel-size=2", "--decode-context-parallel-size", "3", "--cp", "5"}, 5, 2},
		{"alias flag over env", map[string]string{"QUESTRT_TP": "4", "QUESTRT_CP": "5"}, "", []string{"--tensor-parallel-size", "2", "--decode-context-parallel-size", "3"}, 3, 2},
		{"flag over alias env", map[string]string{"QUESTRT_TENSOR_PARALLEL_SIZE": "4"}, "", []string{"--tp", "2"}, 1, 2},
		{"alias env", map[string]string{"QUESTRT_TENSOR_PARALLEL_SIZE": "2", "QUESTRT_DECODE_CONTEXT_PARALLEL_SIZE": "3"}, "", nil, 3, 2},
		{"alias env over file", map[string]string{"QUESTRT_TENSOR_PARALLEL_SIZE": "2"}, "tp: 4\ncp: 3\n", nil, 3, 2},
		{"env over alias file", map[string]string{"QUESTRT_TP": "2"}, "tensor-parallel-size: 4\ndecode-context-parallel-size: 3\n", nil, 3, 2},
		{"alias flag over file", nil, "tp: 4\n", []string{"--tensor-parallel-size", "2"}, 1, 2},
		{"both env names, one value", map[string]string{"QUESTRT_TP": "2", "QUESTRT_TENSOR_PARALLEL_SIZE": "02"}, "", nil, 1, 2},
		{"both keys, one value", nil, "tp: 2\ntensor-parallel-size: 2\n", nil, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, "q.yaml", tc.file)}, args...)
			}
			if cp, tp := grid(t, tc.env, args...); cp != tc.wantCP || tp != tc.wantTP {
				t.Errorf("cp %d tp %d, want %d and %d", cp, tp, tc.wantCP, tc.wantTP)
			}
		})
	}

	// --plaintext on the command line wins over QUESTRT_INSECURE, as
	// --insecure would.
	if c, err := load(t, map[string]string{"QUESTRT_INSECURE": "false"}, "--plaintext"); err != nil || !c.Plaintext {
		t.Errorf("--plaintext over QUESTRT_INSECURE=false: plaintext %v, %v", c.Plaintext, err)
	}
	if c, err := load(t, map[string]string{"QUESTRT_PLAINTEXT": "true"}, "--insecure=false", "--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a"); err != nil || c.Plaintext {
		t.Errorf("--insecure=false over QUESTRT_PLAINTEXT=true: plaintext %v, %v", c.Plaintext, err)
	}

	// Conflicts and errors name both sources, or the one that set it.
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		want       string
	}{
		{"two env names", "", map[string]string{"QUESTRT_TP": "2", "QUESTRT_TENSOR_PARALLEL_SIZE": "4"},
			`QUESTRT_TENSOR_PARALLEL_SIZE "4" and QUESTRT_TP "2": the same setting (--tp); set one`},
		{"two keys", "tp: 2\ntensor-parallel-size: 4\n", nil, `line 2: key "tensor-parallel-size": the same setting as "tp" on line 1 (--tp), with another value; give one`},
		{"a bad alias value", "", map[string]string{"QUESTRT_DECODE_CONTEXT_PARALLEL_SIZE": "x"}, `QUESTRT_DECODE_CONTEXT_PARALLEL_SIZE "x": not an integer`},
		{"an invalid value by alias", "", map[string]string{"QUESTRT_TENSOR_PARALLEL_SIZE": "0"}, "(set by QUESTRT_TENSOR_PARALLEL_SIZE)"},
		{"an invalid value by alias key", "decode-context-parallel-size: 0\n", nil, "line 1)"},
	} {
		args := []string{"--plaintext"}
		if tc.file != "" {
			args = append(args, "--config", writeFile(t, "c.yaml", tc.file))
		}
		if _, err := load(t, tc.env, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}

	// --print-config: the flags' own names, which read back the same.
	var out bytes.Buffer
	if _, err := loadConfig([]string{"--plaintext", "--tensor-parallel-size", "2", "--decode-context-parallel-size", "3", "--print-config"}, envOf(nil), &out); err != errPrinted {
		t.Fatal(err)
	}
	printed := out.String()
	for _, w := range []string{"\ncp: 3\n", "\ntp: 2\n", "\ninsecure: true\n"} {
		if !strings.Contains(printed, w) {
			t.Errorf("--print-config lacks %q:\n%s", w, printed)
		}
	}
	for alias := range flagAliases {
		if strings.Contains(printed, "\n"+alias+":") {
			t.Errorf("--print-config prints the alias %s:\n%s", alias, printed)
		}
	}
	if c, err := load(t, nil, "--config", writeFile(t, "p.yaml", printed)); err != nil || c.CP != 3 || c.TP != 2 {
		t.Errorf("printed config read back: cp %d tp %d, %v", c.CP, c.TP, err)
	}
}
