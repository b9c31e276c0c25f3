package main

import (
	"bytes"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/offload"
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
		Node: NodeConfig{Name: "host-1", GRPCAddr: "127.0.0.1:7070", Advertise: "", MetricsAddr: "127.0.0.1:9464",
			DrainTimeout: 10 * time.Second, GridIdle: time.Minute, ReadyFile: ""},
		Membership: MembershipConfig{GossipAddr: "127.0.0.1:7946", Join: nil, Label: "questrt", KeyFile: "",
			ProbeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond, SuspicionMult: 4,
			GossipInterval: 200 * time.Millisecond, DeadNodeReclaim: 100 * time.Millisecond},
		Security: SecurityConfig{Plaintext: false, TLSCert: "", TLSKey: "", TLSCA: ""},
		Grid: GridConfig{Layers: 4, Geometry: plan.Geometry{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16},
			CP: 1, TP: 1, CapacityPages: 1024, BlockPages: 64, StepTimeout: 2 * time.Second},
		Policy: PolicyConfig{BudgetTokens: 2048, SinkPages: 0, LocalPages: 1, DenseLayers: 2,
			GQA: plan.GroupMax, Selector: plan.Quest, Selection: plan.Exact},
		Devices:  DeviceConfig{Backend: "cpu", KVCacheDType: plan.BFloat16},
		Capacity: CapacityConfig{MaxPages: 0, MaxMemory: 0},
		Offload:  OffloadConfig{offload.Settings{DeviceBudgetPages: 0, Eviction: pagestore.EvictLRU, PrefetchPages: 0, PrefetchCrossLayer: false}},
		Storage:  StorageConfig{DataDir: "", Durability: pagestore.SyncOnWrite, SyncInterval: time.Second, Verify: pagestore.VerifyOnRead, ScrubRate: pagestore.DefaultScrubRate},
		Serve: ServeConfig{Model: "", Addr: "", ModelName: "", MaxRunning: 16, MaxQueued: 64, PrefillChunk: 512, MaxITLFactor: 2, DevicePrefill: true,
			DefaultMaxTokens: 16, CapacityPages: 0, MemoryFraction: 0.5, GPUMemoryUtilization: 0.9, PrefixCaching: true, GrowReservations: true, MonitorQueue: 64, RequestHistory: 64,
			MaxModelLen: 0, MaxRequestBytes: 32 << 20, RequestTimeout: 30 * time.Minute, SSEKeepAlive: 15 * time.Second, LogStatsInterval: 10 * time.Second,
			Layout: "local", CP: 1, TP: 1, PolicyGrids: 2, GridRetries: 1, GridRetryWait: 10 * time.Second,
			ClusterWait: 30 * time.Second, ClusterResize: 2 * time.Second},
		HTTP:       HTTPConfig{MaxConns: 256, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 60 * time.Second},
		Log:        LogConfig{Level: slog.LevelInfo, Format: "text"},
		ConfigFile: "",
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if d := DefaultConfig("host-1"); !reflect.DeepEqual(d, want) {
		t.Errorf("DefaultConfig:\n got %+v\nwant %+v", d, want)
	}
	for _, g := range []interface{ Validate() error }{
		want.Node, want.Membership, want.Grid, want.Policy, want.Devices, want.Capacity,
		want.Offload, want.Storage, want.Serve, want.HTTP, want.Log,
	} {
		if err := g.Validate(); err != nil {
			t.Errorf("default %T: %v", g, err)
		}
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
	want.Node.Name, want.Security.Plaintext = host, true
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
		{"layers (file)", c.Grid.Layers, 6},
		{"head-dim (env over file)", c.Grid.HeadDim, 96},
		{"page-size (flag over env and file)", c.Grid.PageSize, 64},
		{"join (env replaces file)", c.Membership.Join, []string{"c:3"}},
		{"block-pages (flag over file)", c.Grid.BlockPages, 4},
		{"tp (env)", c.Grid.TP, 2},
		{"cp (flag)", c.Grid.CP, 3},
		{"q-heads (default)", c.Grid.QHeads, 32},
		{"plaintext (file)", c.Security.Plaintext, true},
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
	if c.Grid.Layers != 7 || !slices.Equal(c.Membership.Join, []string{"x:1", "y:2"}) {
		t.Errorf("--config over QUESTRT_CONFIG: layers %d, join %q", c.Grid.Layers, c.Membership.Join)
	}

	// Flags of a list append: repeated and comma-separated.
	c, err = load(t, nil, "--plaintext", "--join", "a:1", "--join", "b:2,c:3")
	if err != nil || !slices.Equal(c.Membership.Join, []string{"a:1", "b:2", "c:3"}) {
		t.Errorf("--join twice: %q, %v", c.Membership.Join, err)
	}
	// An empty environment variable is ignored.
	c, err = load(t, map[string]string{"QUESTRT_LAYERS": "", "QUESTRT_PLAINTEXT": "true"})
	if err != nil || c.Grid.Layers != 4 || !c.Security.Plaintext {
		t.Errorf("empty QUESTRT_LAYERS: layers %d, plaintext %v, %v", c.Grid.Layers, c.Security.Plaintext, err)
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
	if c.Node.GRPCAddr != "127.0.0.2:0" || c.Membership.GossipAddr != "127.0.0.2:0" || c.Capacity.MaxMemory != -1 || !c.Security.Plaintext || c.Log.Format != "json" {
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
		if err != nil || c.Node.MetricsAddr != tc.want {
			t.Errorf("env %v, args %q: metrics-addr %q, %v; want %q", tc.env, tc.args, c.Node.MetricsAddr, err, tc.want)
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
		return c.Grid.CP, c.Grid.TP
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
	if c, err := load(t, map[string]string{"QUESTRT_INSECURE": "false"}, "--plaintext"); err != nil || !c.Security.Plaintext {
		t.Errorf("--plaintext over QUESTRT_INSECURE=false: plaintext %v, %v", c.Security.Plaintext, err)
	}
	if c, err := load(t, map[string]string{"QUESTRT_PLAINTEXT": "true"}, "--insecure=false", "--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a"); err != nil || c.Security.Plaintext {
		t.Errorf("--insecure=false over QUESTRT_PLAINTEXT=true: plaintext %v, %v", c.Security.Plaintext, err)
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
	if c, err := load(t, nil, "--config", writeFile(t, "p.yaml", printed)); err != nil || c.Grid.CP != 3 || c.Grid.TP != 2 {
		t.Errorf("printed config read back: cp %d tp %d, %v", c.Grid.CP, c.Grid.TP, err)
	}
}
