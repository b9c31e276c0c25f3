//go:build unix

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// The fake questd: with QUESTCTL_FAKE_QUESTD=1 the test binary runs as a
// questd that keeps questd's command-line contract (flags, ready line,
// SIGTERM) and serves a Decode/Status whose members are the fake nodes
// that have started, each recorded as NAME.json in $QUESTCTL_FAKE_DIR.
//
// Faults, by node name: QUESTCTL_FAKE_EXIT=NAME:CODE exits with CODE
// before it is ready; QUESTCTL_FAKE_MUTE=NAME never prints its ready
// line; QUESTCTL_FAKE_STAY=NAME ignores SIGTERM and SIGINT. A file
// quit-NAME in the directory makes NAME exit with the status it holds.
const (
	fakeEnv     = "QUESTCTL_FAKE_QUESTD"
	fakeDirEnv  = "QUESTCTL_FAKE_DIR"
	fakeExitEnv = "QUESTCTL_FAKE_EXIT"
	fakeMuteEnv = "QUESTCTL_FAKE_MUTE"
	fakeStayEnv = "QUESTCTL_FAKE_STAY"

	// questctlMainArg as the first argument makes the test binary run
	// as questctl: questctlMainArg up --nodes 2 ...
	questctlMainArg = "questctl-main"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == questctlMainArg {
		os.Exit(run(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
	if os.Getenv(fakeEnv) == "1" {
		os.Exit(fakeQuestd(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeRecord is what a fake node tells the test about itself.
type fakeRecord struct {
	Name   string   `json:"name"`
	PID    int      `json:"pid"`
	GRPC   string   `json:"grpc"`
	Gossip string   `json:"gossip"`
	Join   string   `json:"join"`
	CP     int      `json:"cp"`
	TP     int      `json:"tp"`
	Layers int      `json:"layers"`
	Args   []string `json:"args"`
	// Procs is the node's GOMAXPROCS environment variable.
	Procs string `json:"procs"`
}

func fakeQuestd(args []string) int {
	fs := flag.NewFlagSet("questd", flag.ContinueOnError)
	name := fs.String("name", "", "")
	grpcAddr := fs.String("grpc-addr", "", "")
	gossipAddr := fs.String("gossip-addr", "", "")
	_ = fs.String("metrics-addr", "", "")
	join := fs.String("join", "", "")
	var insecure bool
	fs.BoolVar(&insecure, "insecure", false, "")
	fs.BoolVar(&insecure, "plaintext", false, "")
	tlsCert := fs.String("tls-cert", "", "")
	tlsKey := fs.String("tls-key", "", "")
	tlsCA := fs.String("tls-ca", "", "")
	tokenFile := fs.String("token-file", "", "")
	gossipKey := fs.String("gossip-key-file", "", "")
	cp := fs.Int("cp", 1, "")
	tp := fs.Int("tp", 1, "")
	layers := fs.Int("layers", 1, "")
	modelDir := fs.String("model", "", "")
	httpAddr := fs.String("http-addr", "", "")
	_ = fs.String("data-dir", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// As questd: --insecure, or all three TLS files, not both.
	tlsFiles := *tlsCert != "" && *tlsKey != "" && *tlsCA != ""
	someTLS := *tlsCert != "" || *tlsKey != "" || *tlsCA != ""
	if *name == "" || *grpcAddr == "" || *gossipAddr == "" || insecure == someTLS || someTLS != tlsFiles || fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "fake questd: bad command line %q\n", args)
		return 2
	}
	var srvOpts []grpc.ServerOption
	if tlsFiles {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		b, err := os.ReadFile(*tlsCA)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(b) {
			fmt.Fprintf(os.Stderr, "fake questd: --tls-ca %q: %v\n", *tlsCA, err)
			return 1
		}
		srvOpts = append(srvOpts, grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13,
			Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})))
	}
	if *gossipKey != "" {
		// As questd: a key file others may read is refused.
		if fi, err := os.Stat(*gossipKey); err != nil || fi.Mode().Perm()&0o077 != 0 {
			fmt.Fprintf(os.Stderr, "fake questd: --gossip-key-file %q: %v (mode %v)\n", *gossipKey, err, fi.Mode())
			return 1
		}
	}
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		want := "Bearer " + strings.TrimSpace(string(b))
		srvOpts = append(srvOpts, grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if md, _ := metadata.FromIncomingContext(ctx); !slices.Contains(md.Get("authorization"), want) {
				return nil, grpcstatus.Error(codes.Unauthenticated, "fake questd: no bearer token")
			}
			return h(ctx, req)
		}))
	}
	dir := os.Getenv(fakeDirEnv)
	is := func(env string) (string, bool) {
		v, rest, _ := strings.Cut(os.Getenv(env), ":")
		return rest, v == *name
	}
	fmt.Fprintf(os.Stderr, "fake questd %s starting\n", *name)
	rec := fakeRecord{Name: *name, PID: os.Getpid(), Join: *join, CP: *cp, TP: *tp, Layers: *layers, Args: args, Procs: os.Getenv("GOMAXPROCS")}
	if code, ok := is(fakeExitEnv); ok {
		writeRecord(dir, rec)
		n, _ := strconv.Atoi(code)
		return n
	}
	lis, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	gossip, err := net.Listen("tcp", *gossipAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer gossip.Close()
	rec.GRPC, rec.Gossip = lis.Addr().String(), gossip.Addr().String()
	srv := grpc.NewServer(srvOpts...)
	decodev1.RegisterDecodeServer(srv, &fakeDecode{reply: func() *decodev1.StatusReply { return fakeMembers(dir, rec) }})
	go srv.Serve(lis)
	defer srv.Stop()
	writeRecord(dir, rec)

	ctx := context.Background()
	if _, ok := is(fakeStayEnv); ok {
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
	} else {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
		defer stop()
	}
	var httpLis string
	if *modelDir != "" {
		// As questd --model: the API's /v1/models on --http-addr.
		hl, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/models" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, filepath.Base(*modelDir))
		})}
		go hs.Serve(hl)
		defer hs.Close()
		httpLis = hl.Addr().String()
	}
	if _, ok := is(fakeMuteEnv); !ok {
		line, _ := json.Marshal(readyLine{Event: "ready", Name: *name, GRPC: rec.GRPC, Gossip: rec.Gossip, HTTP: httpLis})
		fmt.Printf("%s\n", line)
	}
	fmt.Println("a stray stdout line")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "fake questd %s: leaving", *name) // no newline: flushed by questctl
			return 0
		case <-tick.C:
			if b, err := os.ReadFile(filepath.Join(dir, "quit-"+*name)); err == nil {
				n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				return n
			}
		}
	}
}

// writeRecord writes rec as NAME.json in dir, atomically.
func writeRecord(dir string, rec fakeRecord) {
	b, _ := json.Marshal(rec)
	tmp := filepath.Join(dir, rec.Name+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err == nil {
		os.Rename(tmp, filepath.Join(dir, rec.Name+".json"))
	}
}

// readRecords reads the fake nodes' records in dir, by name.
func readRecords(dir string) map[string]fakeRecord {
	recs := map[string]fakeRecord{}
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, f := range files {
		var r fakeRecord
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &r) == nil {
			recs[r.Name] = r
		}
	}
	return recs
}

// fakeMembers is the fake node self's Status: every node in dir, alive.
func fakeMembers(dir string, self fakeRecord) *decodev1.StatusReply {
	r := &decodev1.StatusReply{
		Node: self.Name, Version: "fake",
		Config:  &workerv1.GridConfig{Layers: uint32(self.Layers), Cp: uint32(self.CP), Tp: uint32(self.TP), Mode: "exact"},
		Devices: []*decodev1.Device{{Kind: "cpu", Name: "fake"}},
	}
	recs := readRecords(dir)
	names := make([]string, 0, len(recs))
	for n := range recs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r.Members = append(r.Members, &decodev1.Member{Name: n, State: "alive", GrpcAddr: recs[n].GRPC, Version: "fake", TotalPages: 64, FreePages: 64})
	}
	r.View = uint64(len(r.Members))
	return r
}

// upRun is a questctl up running in the background.
type upRun struct {
	cancel         context.CancelFunc
	stdout, stderr *syncBuffer
	done           chan int
}

// fakeCluster makes the fake questd the one up runs (through --questd)
// and returns the nodes' shared directory.
func fakeCluster(t *testing.T) (dir, questd string) {
	t.Helper()
	dir = t.TempDir()
	t.Setenv(fakeEnv, "1")
	t.Setenv(fakeDirEnv, dir)
	// A -race binary sleeps a second on exit by default; the fake nodes
	// need not.
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return dir, exe
}

func startUp(t *testing.T, args ...string) *upRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	u := &upRun{cancel: cancel, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan int, 1)}
	go func() { u.done <- run(ctx, append([]string{"up"}, args...), u.stdout, u.stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-u.done:
		case <-time.After(30 * time.Second):
			t.Error("questctl up did not return 30s after its context was cancelled")
		}
	})
	return u
}

// waitUp waits until up has printed "cluster up" and returns its stdout.
func (u *upRun) waitUp(t *testing.T) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(u.stdout.String(), "cluster up: ") {
		select {
		case code := <-u.done:
			u.done <- code
			t.Fatalf("up exited %d before the cluster was up; stdout %q, stderr:\n%s", code, u.stdout, u.stderr)
		case <-deadline:
			t.Fatalf("no cluster after 30s; stdout %q, stderr:\n%s", u.stdout, u.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return u.stdout.String()
}

// wait waits for up to return and gives its exit status.
func (u *upRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-u.done:
		u.done <- code // for the cleanup
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("questctl up did not return; stderr:\n%s", u.stderr)
		return -1
	}
}

var nodeLineRE = regexp.MustCompile(`^(\S+) grpc=(\S+) gossip=(\S+)(?: metrics=\S+)? pid=(\d+)$`)

type upLine struct {
	name, grpc, gossip string
	pid                int
}

var completionsLineRE = regexp.MustCompile(`^completions: (http://\S+/v1) \(model (\S+) on (\S+)\)$`)

var connectLineRE = regexp.MustCompile(`^connect: questctl status --addr (\S+)(?: --tls-dir (\S+))?( --token-file \S+)?$`)

func parseUpLines(t *testing.T, out string) []upLine {
	t.Helper()
	var nodes []upLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if m := nodeLineRE.FindStringSubmatch(l); m != nil {
			pid, _ := strconv.Atoi(m[4])
			nodes = append(nodes, upLine{m[1], m[2], m[3], pid})
		} else if !strings.HasPrefix(l, "cluster up: ") && !strings.HasPrefix(l, "serving: ") && !connectLineRE.MatchString(l) && !completionsLineRE.MatchString(l) {
			t.Errorf("unexpected stdout line %q", l)
		}
	}
	return nodes
}

// connectLine returns the address and TLS directory of up's connect
// line (and fails the test without one).
func connectLine(t *testing.T, out string) (addr, dir string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if m := connectLineRE.FindStringSubmatch(l); m != nil {
			return m[1], m[2]
		}
	}
	t.Fatalf("no connect line in stdout:\n%s", out)
	return "", ""
}

// assertGone fails unless no process has pid.
func assertGone(t *testing.T, name string, pid int) {
	t.Helper()
	if pid <= 0 {
		t.Errorf("%s: no pid", name)
		return
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("%s (pid %d) still exists after up returned: kill 0: %v", name, pid, err)
	}
}

// TestUpThreeNodes: up starts three nodes with mutual TLS (its own CA,
// each node its own certificate), node 0 first and the others joining
// it, prints them once each sees all three alive with the command that
// reaches them; status --tls-dir against one lists three alive members
// and a plaintext status is refused with a hint; cancelling stops and
// reaps them all and removes the temporary TLS directory.
func TestUpThreeNodes(t *testing.T) {
	dir, questd := fakeCluster(t)
	u := startUp(t, "--nodes", "3", "--cp", "3", "--tp", "1", "--questd", questd, "--timeout", "20s", "--", "--layers", "2")
	out := u.waitUp(t)
	nodes := parseUpLines(t, out)
	if len(nodes) != 3 || !strings.HasSuffix(out, "cluster up: 3 nodes\n") {
		t.Fatalf("stdout:\n%s", out)
	}
	addr, tlsDir := connectLine(t, out)
	if addr != nodes[0].grpc || !strings.Contains(u.stderr.String(), "questctl up: mutual TLS: CA, node and client certificates (valid 7 days), gossip key gossip.key in "+tlsDir+" (removed when up exits; --keep-tls-dir keeps it)\n") {
		t.Errorf("connect line: addr %s (node-0 %s), dir %s; stderr:\n%s", addr, nodes[0].grpc, tlsDir, u.stderr)
	}
	recs := readRecords(dir)
	for i, n := range nodes {
		r := recs[n.name]
		if n.name != fmt.Sprintf("node-%d", i) || n.pid != r.PID || n.grpc != r.GRPC || n.gossip != r.Gossip {
			t.Errorf("line %+v, the node says %+v", n, r)
		}
		wantJoin := nodes[0].gossip
		if i == 0 {
			wantJoin = ""
		}
		tlsArgs := []string{"--tls-cert", filepath.Join(tlsDir, n.name+".pem"), "--tls-key", filepath.Join(tlsDir, n.name+".key"),
			"--tls-ca", filepath.Join(tlsDir, "ca.pem")}
		if !slices.Contains(r.Args, filepath.Join(tlsDir, "gossip.key")) || !slices.Contains(r.Args, "--gossip-key-file") {
			t.Errorf("%s was started without --gossip-key-file %s: %q", n.name, filepath.Join(tlsDir, "gossip.key"), r.Args)
		}
		if r.Join != wantJoin || r.CP != 3 || r.TP != 1 || r.Layers != 2 || slices.Contains(r.Args, "--insecure") ||
			!strings.Contains(strings.Join(r.Args, " "), strings.Join(tlsArgs, " ")) {
			t.Errorf("%s was started with %q", n.name, r.Args)
		}
		if fi, err := os.Stat(filepath.Join(tlsDir, n.name+".key")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s.key: %v, %v", n.name, fi.Mode(), err)
		}
	}
	if s := u.stderr.String(); !strings.Contains(s, "node-2: fake questd node-2 starting\n") || !strings.Contains(s, "node-1: a stray stdout line\n") {
		t.Errorf("stderr lacks the nodes' prefixed output:\n%s", s)
	}

	code, st, stderr := runCLI(t, "status", "--addr", nodes[1].grpc, "--tls-dir", tlsDir)
	if code != 0 || !strings.Contains(st, "members: 3 (3 alive)") || !strings.Contains(st, "node node-1 ") || !strings.Contains(st, "cp 3 x tp 1, layers 2") {
		t.Errorf("status: exit %d, stderr %q, stdout:\n%s", code, stderr, st)
	}
	code, st, stderr = runCLI(t, "status", "--addr", nodes[1].grpc, "--timeout", "3s")
	if code != 1 || st != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "cannot reach questd at "+nodes[1].grpc) ||
		!strings.Contains(stderr, "plaintext was refused") || !strings.Contains(stderr, "--tls-dir DIR") {
		t.Errorf("plaintext status against the TLS cluster: exit %d, stdout %q, stderr %q", code, st, stderr)
	}
	code, st, stderr = runCLI(t, "status", "--addr", nodes[2].grpc, "--json", "--tls-dir", tlsDir)
	var reply decodev1.StatusReply
	if code != 0 || protojson.Unmarshal([]byte(st), &reply) != nil {
		t.Fatalf("status --json: exit %d, stderr %q, stdout %q", code, stderr, st)
	}
	alive := 0
	for _, m := range reply.GetMembers() {
		if m.GetState() == "alive" {
			alive++
		}
	}
	if alive != 3 {
		t.Errorf("status --json: %d alive: %v", alive, &reply)
	}

	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Errorf("up exited %d after the cancel; stderr:\n%s", code, u.stderr)
	}
	for _, n := range nodes {
		assertGone(t, n.name, n.pid)
	}
	if s := u.stderr.String(); !strings.Contains(s, "stopping 3 node(s)") || !strings.Contains(s, "node-0: fake questd node-0: leaving\n") || strings.Contains(s, "killed") {
		t.Errorf("stderr:\n%s", s)
	}
	if _, err := os.Stat(tlsDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the temporary TLS directory %s outlived up: %v", tlsDir, err)
	}
}

// TestUpInsecure: --insecure, and its alias --plaintext, run the nodes
// with questd --insecure and make no certificates: no connect line, and
// a plaintext status works; --plaintext=false is TLS.
func TestUpInsecure(t *testing.T) {
	for _, flag := range []string{"--insecure", "--plaintext", "--plaintext=true", "--insecure=false", "--plaintext=false"} {
		t.Run(flag, func(t *testing.T) {
			dir, questd := fakeCluster(t)
			u := startUp(t, "--nodes", "2", "--questd", questd, flag)
			out := u.waitUp(t)
			nodes := parseUpLines(t, out)
			tlsMode := strings.HasSuffix(flag, "=false")
			if len(nodes) != 2 || !strings.Contains(out, "connect: questctl status --addr ") || strings.Contains(out, "--tls-dir") != tlsMode || strings.Contains(u.stderr.String(), "mutual TLS") != tlsMode {
				t.Fatalf("%s: stdout:\n%s\nstderr:\n%s", flag, out, u.stderr)
			}
			for _, r := range readRecords(dir) {
				if slices.Contains(r.Args, "--insecure") == tlsMode || slices.Contains(r.Args, "--tls-cert") != tlsMode || slices.Contains(r.Args, "--gossip-key-file") != tlsMode {
					t.Errorf("%s: %s was started with %q", flag, r.Name, r.Args)
				}
			}
			args := []string{"status", "--addr", nodes[0].grpc}
			if tlsMode {
				_, tlsDir := connectLine(t, out)
				args = append(args, "--tls-dir", tlsDir)
			}
			if code, st, stderr := runCLI(t, args...); code != 0 || !strings.Contains(st, "members: 2 (2 alive)") {
				t.Errorf("%s: %q: exit %d, stderr %q, stdout:\n%s", flag, args, code, stderr, st)
			}
			u.cancel()
			if code := u.wait(t); code != 0 {
				t.Errorf("exit %d", code)
			}
		})
	}
}

// TestUpNodeProcs: --node-procs P starts every node with GOMAXPROCS=P;
// without it (or with auto) each of the 2 nodes gets half this host's
// CPUs (at least 1); with 0 the nodes get up's own environment's.
func TestUpNodeProcs(t *testing.T) {
	auto := strconv.Itoa(max(1, runtime.NumCPU()/2))
	for _, procs := range []string{"", "auto", "0", "1", "3"} {
		t.Run("procs="+procs, func(t *testing.T) {
			dir, questd := fakeCluster(t)
			args := []string{"--nodes", "2", "--questd", questd, "--insecure"}
			want := auto
			switch procs {
			case "":
			case "0":
				args, want = append(args, "--node-procs", procs), os.Getenv("GOMAXPROCS")
			case "auto":
				args = append(args, "--node-procs", procs)
			default:
				args, want = append(args, "--node-procs", procs), procs
			}
			u := startUp(t, args...)
			if nodes := parseUpLines(t, u.waitUp(t)); len(nodes) != 2 {
				t.Fatalf("%d nodes up, want 2", len(nodes))
			}
			recs := readRecords(dir)
			for _, r := range recs {
				if r.Procs != want {
					t.Errorf("%s: GOMAXPROCS %q, want %q", r.Name, r.Procs, want)
				}
			}
			if len(recs) != 2 {
				t.Errorf("%d nodes recorded, want 2", len(recs))
			}
			u.cancel()
			if code := u.wait(t); code != 0 {
				t.Errorf("exit %d", code)
			}
		})
	}
}

// TestUpTLSDir: --tls-dir writes the certificates there (node keys and
// the client key 0600) and keeps them after up exits, as --keep-tls-dir
// keeps the temporary one; --json names the directory in every object;
// the nodes' --token-file reaches up's own calls and the connect line.
func TestUpTLSDir(t *testing.T) {
	_, questd := fakeCluster(t)
	tlsDir := filepath.Join(t.TempDir(), "tls")
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, "up", "--nodes", "1", "--questd", questd, "--", "--token-file", filepath.Join(t.TempDir(), "none")); code != 2 || !strings.Contains(stderr, "--token-file") {
		t.Errorf("a missing --token-file after --: exit %d, stderr %q", code, stderr)
	}
	// The fake nodes want the token on every call: up's own Status
	// calls carry it, or the cluster would never be up.
	u := startUp(t, "--nodes", "2", "--questd", questd, "--tls-dir", tlsDir, "--", "--token-file="+tok)
	out := u.waitUp(t)
	addr, d := connectLine(t, out)
	if d != tlsDir || strings.Contains(u.stderr.String(), "removed when up exits") || !strings.Contains(out, " --token-file "+tok+"\n") {
		t.Errorf("connect line dir %q, want %q, and --token-file %s; stdout:\n%s\nstderr:\n%s", d, tlsDir, tok, out, u.stderr)
	}
	if code, st, stderr := runCLI(t, "status", "--addr", addr, "--tls-dir", tlsDir, "--token-file", tok); code != 0 || !strings.Contains(st, "members: 2 (2 alive)") {
		t.Errorf("status with the connect line's flags: exit %d, stderr %q, stdout:\n%s", code, stderr, st)
	}
	if code, _, stderr := runCLI(t, "status", "--addr", addr, "--tls-dir", tlsDir); code != 1 || !strings.Contains(stderr, "Unauthenticated") {
		t.Errorf("status without the token: exit %d, stderr %q", code, stderr)
	}
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Errorf("exit %d", code)
	}
	for _, f := range []string{"ca.pem", "node-0.pem", "node-0.key", "node-1.pem", "node-1.key", "client.pem", "client.key", "gossip.key"} {
		fi, err := os.Stat(filepath.Join(tlsDir, f))
		if err != nil {
			t.Errorf("%s after up exited: %v", f, err)
		} else if strings.HasSuffix(f, ".key") && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
	}

	dir2, _ := fakeCluster(t) // a new cluster: the fake nodes see every record of their directory
	u = startUp(t, "--nodes", "1", "--questd", questd, "--keep-tls-dir", "--json")
	lines := strings.Split(strings.TrimSpace(u.waitJSON(t, 1)), "\n")
	var n struct {
		Name   string `json:"name"`
		TLSDir string `json:"tls_dir"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &n); err != nil || n.TLSDir == "" || !strings.Contains(u.stderr.String(), n.TLSDir+" (kept: --keep-tls-dir)") {
		t.Fatalf("--json line %q (%v); stderr:\n%s", lines[0], err, u.stderr)
	}
	t.Cleanup(func() { os.RemoveAll(n.TLSDir) })
	if code, st, stderr := runCLI(t, "status", "--addr", readRecords(dir2)["node-0"].GRPC, "--tls-dir", n.TLSDir); code != 0 || !strings.Contains(st, "node node-0") {
		t.Errorf("status --tls-dir of --json: exit %d, stderr %q", code, stderr)
	}
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Errorf("exit %d", code)
	}
	if _, err := os.Stat(filepath.Join(n.TLSDir, "client.key")); err != nil {
		t.Errorf("--keep-tls-dir: %v", err)
	}
}

// waitJSON waits until up has printed lines lines and returns its stdout.
func (u *upRun) waitJSON(t *testing.T, lines int) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for strings.Count(u.stdout.String(), "\n") < lines {
		select {
		case code := <-u.done:
			u.done <- code
			t.Fatalf("up exited %d; stdout %q, stderr:\n%s", code, u.stdout, u.stderr)
		case <-deadline:
			t.Fatalf("%d lines after 30s; stdout %q, stderr:\n%s", lines, u.stdout, u.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return u.stdout.String()
}

// TestUpJSON: --json prints one object per node and nothing else.
func TestUpJSON(t *testing.T) {
	_, questd := fakeCluster(t)
	u := startUp(t, "--nodes", "2", "--questd", questd, "--json", "--base-name", "q")
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(u.stdout.String(), "\n") < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	lines := strings.Split(strings.TrimSpace(u.stdout.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("stdout %q, stderr:\n%s", u.stdout, u.stderr)
	}
	var pids []int
	for i, l := range lines {
		var n struct {
			Name, GRPC, Gossip string
			PID                int
		}
		if err := json.Unmarshal([]byte(l), &n); err != nil || n.Name != fmt.Sprintf("q-%d", i) || n.GRPC == "" || n.Gossip == "" || n.PID <= 0 {
			t.Errorf("line %q: %+v %v", l, n, err)
		}
		pids = append(pids, n.PID)
	}
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Errorf("exit %d", code)
	}
	for i, pid := range pids {
		assertGone(t, lines[i], pid)
	}
}

// TestUpNodeFailsDuringStartup: a node that exits during start-up fails
// up (exit 1, naming it and its status) and the nodes already started are
// stopped.
func TestUpNodeFailsDuringStartup(t *testing.T) {
	dir, questd := fakeCluster(t)
	t.Setenv(fakeExitEnv, "node-1:3")
	code, stdout, stderr := runCLI(t, "up", "--nodes", "3", "--questd", questd)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if code != 1 || stdout != "" || !regexp.MustCompile(`^questctl up: node-1 \(pid \d+\) exited before it was ready \(exit status 3\); stopped the 2 node\(s\) started$`).MatchString(last) {
		t.Errorf("exit %d, stdout %q, stderr:\n%s", code, stdout, stderr)
	}
	recs := readRecords(dir)
	if _, ok := recs["node-2"]; ok || len(recs) != 2 {
		t.Errorf("nodes started: %v", recs)
	}
	for _, r := range recs {
		assertGone(t, r.Name, r.PID)
	}
}

// TestUpNoReadyLine: a node that never prints its ready line fails up
// within --timeout, and is stopped.
func TestUpNoReadyLine(t *testing.T) {
	dir, questd := fakeCluster(t)
	t.Setenv(fakeMuteEnv, "node-0")
	start := time.Now()
	code, stdout, stderr := runCLI(t, "up", "--nodes", "2", "--questd", questd, "--timeout", "500ms")
	if time.Since(start) > 10*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
	if code != 1 || stdout != "" || !strings.Contains(stderr, "questctl up: cluster not up within --timeout 500ms: node-0 (pid ") || !strings.Contains(stderr, "printed no ready line") {
		t.Errorf("exit %d, stdout %q, stderr:\n%s", code, stdout, stderr)
	}
	// The second node never starts. (The first may be stopped before it
	// recorded its start: on a loaded machine 500 ms can pass before the
	// fake runs at all.)
	recs := readRecords(dir)
	if _, ok := recs["node-1"]; ok || len(recs) > 1 {
		t.Errorf("nodes started: %v", recs)
	}
	for _, r := range recs {
		assertGone(t, r.Name, r.PID)
	}
}

// TestUpNodeExitsByItself: once the cluster is up, a node exiting by
// itself is reported with its status and the others keep running (a
// cluster goes on without a crashed node); a signal then stops them and
// up exits 0, naming the node that had exited.
func TestUpNodeExitsByItself(t *testing.T) {
	dir, questd := fakeCluster(t)
	u := startUp(t, "--nodes", "3", "--questd", questd)
	nodes := parseUpLines(t, u.waitUp(t))
	// Written aside and renamed: the fake polls for the file and must
	// never read it empty (it would exit 0).
	tmp := filepath.Join(dir, "quit.tmp")
	if err := os.WriteFile(tmp, []byte("4"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "quit-node-1")); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("questctl up: node-1 (pid %d) exited by itself (exit status 4); 2 node(s) still running\n", nodes[1].pid)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(u.stderr.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("stderr has no %q:\n%s", want, u.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, n := range []int{0, 2} {
		if err := syscall.Kill(nodes[n].pid, 0); err != nil {
			t.Errorf("%s stopped with node-1: %v", nodes[n].name, err)
		}
	}
	u.cancel()
	if code := u.wait(t); code != 0 || !strings.Contains(u.stderr.String(), "before that 1 node(s) exited by themselves: node-1 (exit status 4)") {
		t.Errorf("exit %d after the signal, want 0 naming node-1:\n%s", code, u.stderr)
	}
	for _, n := range nodes {
		assertGone(t, n.name, n.pid)
	}
}

// TestUpKillsNodesThatDoNotStop: a node that ignores SIGTERM is killed
// after --stop-timeout; --log-dir takes the nodes' stderr.
func TestUpKillsNodesThatDoNotStop(t *testing.T) {
	dir, questd := fakeCluster(t)
	t.Setenv(fakeStayEnv, "node-0")
	logs := filepath.Join(dir, "logs")
	u := startUp(t, "--nodes", "2", "--questd", questd, "--stop-timeout", "300ms", "--log-dir", logs)
	nodes := parseUpLines(t, u.waitUp(t))
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Errorf("exit %d", code)
	}
	if want := fmt.Sprintf("questctl up: node-0 (pid %d) did not stop within 300ms of SIGTERM: killed\n", nodes[0].pid); !strings.Contains(u.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, u.stderr)
	}
	if strings.Contains(u.stderr.String(), "fake questd") {
		t.Errorf("node output on stderr despite --log-dir:\n%s", u.stderr)
	}
	for _, n := range nodes {
		assertGone(t, n.name, n.pid)
		b, err := os.ReadFile(filepath.Join(logs, n.name+".log"))
		if err != nil || !strings.Contains(string(b), "fake questd "+n.name+" starting\n") || !strings.Contains(string(b), "a stray stdout line\n") {
			t.Errorf("%s.log: %q, %v", n.name, b, err)
		}
	}
}

// TestUpMissingQuestd: no questd binary is a one-line usage error.
func TestUpMissingQuestd(t *testing.T) {
	code, stdout, stderr := runCLI(t, "up", "--nodes", "1", "--questd", filepath.Join(t.TempDir(), "questd"))
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, `--questd "`) || !strings.Contains(stderr, "no such file") {
		t.Errorf("--questd missing: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	t.Setenv("PATH", t.TempDir())
	code, stdout, stderr = runCLI(t, "up", "--nodes", "1")
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no questd binary") || !strings.Contains(stderr, "--questd PATH") {
		t.Errorf("no questd anywhere: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestUpUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"up"},
		{"up", "--nodes", "0"},
		{"up", "--nodes", "2", "--cp", "0"},
		{"up", "--nodes", "2", "--timeout", "0s"},
		{"up", "--nodes", "2", "--base-name", "a b"},
		{"up", "--nodes", "2", "stray"},
		{"up", "--nodes", "2", "--", "--name", "x"},
		{"up", "--nodes", "2", "--", "-cp=4"},
		{"up", "--nodes", "2", "--", "--join", "127.0.0.1:1"},
		{"up", "--nodes", "2", "--", "--insecure"},
		{"up", "--nodes", "2", "--", "--plaintext=false"},
		{"up", "--nodes", "2", "--", "--tls-cert", "x.pem"},
		{"up", "--nodes", "2", "--", "--tls-ca=ca.pem"},
		{"up", "--nodes", "2", "--insecure", "--tls-dir", "d"},
		{"up", "--nodes", "2", "--plaintext", "--keep-tls-dir"},
		{"up", "--nodes", "2", "--ca", "ca.pem"},
		{"up", "--nodes", "2", "--http-addr", "127.0.0.1:0"},
		{"up", "--nodes", "2", "--model", "/no/such/dir"},
		{"up", "--nodes", "2", "--model", "up_test.go"},
		{"up", "--nodes", "2", "--model", ".", "--http-addr", "nohost"},
		{"up", "--nodes", "2", "--", "--model", "."},
		{"up", "--nodes", "2", "--", "--http-addr=127.0.0.1:0"},
		{"up", "--nodes", "2", "--", "--data-dir", "d"},
		{"up", "--nodes", "2", "--node-procs", "-1"},
		{"up", "--nodes", "2", "--node-procs", "many"},
		{"up", "--nodes", "2", "--node-cpus", "0,1"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "questctl up: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// TestUpKilledLeavesNoNodes: a questctl up killed with SIGKILL, which it
// cannot catch, leaves no node running (Linux: Pdeathsig).
func TestUpKilledLeavesNoNodes(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux only")
	}
	_, questd := fakeCluster(t)
	cmd := exec.Command(questd, questctlMainArg, "up", "--nodes", "2", "--questd", questd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var nodes []upLine
	timeout := time.After(30 * time.Second)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				break wait
			}
			if strings.HasPrefix(l, "cluster up: ") {
				break wait
			}
			nodes = append(nodes, parseUpLines(t, l)...)
		case <-timeout:
			break wait
		}
	}
	cmd.Process.Kill()
	go func() {
		for range lines {
		}
	}()
	cmd.Wait()
	if len(nodes) != 2 {
		t.Fatalf("nodes %v; stderr:\n%s", nodes, &errb)
	}
	for _, n := range nodes {
		deadline := time.Now().Add(10 * time.Second)
		for running(n.pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if running(n.pid) {
			t.Errorf("%s (pid %d) still runs after questctl was killed", n.name, n.pid)
			syscall.Kill(n.pid, syscall.SIGKILL)
		}
	}
}

// running reports whether pid is a process that has not exited (a zombie
// that init has not reaped yet has exited).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestUpRealQuestd: with the real questd (built here), questctl up
// --nodes 2 runs mutual TLS by default: status with the connect line's
// flags lists both nodes alive, a plaintext status is refused with a
// hint; up --insecure runs a plaintext cluster that a plaintext status
// reaches. The temporary TLS directory is gone once up has returned.
func TestUpRealQuestd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts questd")
	}
	bin := filepath.Join(t.TempDir(), "questd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/questd")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/questd: %v\n%s", err, out)
	}
	small := []string{"--layers", "2", "--q-heads", "8", "--kv-heads", "4", "--head-dim", "16", "--page-size", "4",
		"--capacity-pages", "128", "--budget-tokens", "24", "--dense-layers", "1", "--max-memory", "none", "--drain-timeout", "1s"}
	for _, insecure := range []bool{false, true} {
		name := "tls"
		args := []string{"--nodes", "2", "--questd", bin, "--timeout", "25s", "--stop-timeout", "5s"}
		if insecure {
			name, args = "insecure", append(args, "--insecure")
		}
		t.Run(name, func(t *testing.T) {
			u := startUp(t, append(append(args, "--"), small...)...)
			out := u.waitUp(t)
			nodes := parseUpLines(t, out)
			if len(nodes) != 2 {
				t.Fatalf("stdout:\n%s", out)
			}
			var tlsDir string
			plain := []string{"status", "--addr", nodes[1].grpc, "--timeout", "5s"}
			if insecure {
				if want := "connect: questctl status --addr " + nodes[0].grpc + "\n"; !strings.Contains(out, want) {
					t.Errorf("--insecure: want the line %q in:\n%s", want, out)
				}
				if code, st, stderr := runCLI(t, plain...); code != 0 || !strings.Contains(st, "members: 2 (2 alive)") {
					t.Errorf("plaintext status: exit %d, stderr %q, stdout:\n%s", code, stderr, st)
				}
			} else {
				var addr string
				addr, tlsDir = connectLine(t, out)
				// The connect line's command, as printed.
				if code, st, stderr := runCLI(t, "status", "--addr", addr, "--tls-dir", tlsDir); code != 0 || !strings.Contains(st, "members: 2 (2 alive)") || !strings.Contains(st, "node node-0 ") {
					t.Errorf("status --tls-dir: exit %d, stderr %q, stdout:\n%s", code, stderr, st)
				}
				code, st, stderr := runCLI(t, plain...)
				if code != 1 || st != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "plaintext was refused") || !strings.Contains(stderr, "--tls-dir DIR") {
					t.Errorf("plaintext status against the TLS cluster: exit %d, stdout %q, stderr %q", code, st, stderr)
				} else {
					t.Logf("plaintext status: %s", strings.TrimSpace(stderr))
				}
			}
			u.cancel()
			if code := u.wait(t); code != 0 {
				t.Errorf("up exited %d; stderr:\n%s", code, u.stderr)
			}
			for _, n := range nodes {
				assertGone(t, n.name, n.pid)
			}
			if tlsDir != "" {
				if _, err := os.Stat(tlsDir); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the temporary TLS directory %s outlived up: %v", tlsDir, err)
				}
			}
		})
	}
	// --model: the completions API of the passkey checkpoint on node 0,
	// at the URL up prints; a greedy completion gets the pass key. With
	// --serve-layout cluster --serve-cp 2 the request's pages live on a
	// grid with a rank on each node (each node's /metrics, printed by up,
	// shows it hosting one), and every decode token is one multi-layer
	// step of node 0's coordinator.
	for _, layout := range []string{"local", "cluster"} {
		t.Run("model-"+layout, func(t *testing.T) {
			model := filepath.Join(testModels(t), "passkey-llama-v1")
			args := []string{"--nodes", "2", "--questd", bin, "--timeout", "25s", "--stop-timeout", "5s", "--insecure", "--model", model}
			if layout == "cluster" {
				args = append(args, "--serve-layout", "cluster", "--serve-cp", "2")
			}
			// The serving policy's defaults (the small grid's 4-token pages
			// and 24-token budget would lose the pass key).
			args = append(append(append(args, "--"), small...), "--page-size", "16", "--budget-tokens", "2048", "--dense-layers", "2", "--serve-capacity-pages", "512")
			u := startUp(t, args...)
			out := u.waitUp(t)
			nodes := parseUpLines(t, out)
			var url string
			var metrics []string
			for _, l := range strings.Split(out, "\n") {
				if m := completionsLineRE.FindStringSubmatch(l); m != nil && m[2] == "passkey-llama-v1" && m[3] == "node-0" {
					url = m[1]
				}
				if m := regexp.MustCompile(` metrics=(\S+) `).FindStringSubmatch(l); m != nil {
					metrics = append(metrics, m[1])
				}
			}
			if len(nodes) != 2 || url == "" || len(metrics) != 2 || strings.Contains(out, "serving: ") != (layout == "cluster") {
				t.Fatalf("stdout:\n%s", out)
			}
			prompt := "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. " +
				"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " +
				"The pass key is 48213. Remember it. 48213 is the pass key. " +
				"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " +
				"What is the pass key? The pass key is "
			body, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": prompt, "max_tokens": 5, "temperature": 0})
			resp, err := http.Post(url+"/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), `"text":"48213"`) {
				t.Errorf("POST %s/completions: %s %s", url, resp.Status, b)
			}
			for i, addr := range metrics {
				r, err := http.Get("http://" + addr + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				m, _ := io.ReadAll(r.Body)
				r.Body.Close()
				hosts := strings.Contains(string(m), `questrt_grids{role="hosted"} 1`)
				if hosts != (layout == "cluster") {
					t.Errorf("node %d (%s): hosts a grid %v with --serve-layout %s", i, addr, hosts, layout)
				}
				if layout == "cluster" && i == 0 && !strings.Contains(string(m), `questrt_steps_total{code="OK",kind="steps"} 4`) {
					t.Errorf("node 0: want 4 multi-layer steps (4 decode tokens) in its metrics:\n%s", grepLines(string(m), "questrt_steps_total"))
				}
			}
			u.cancel()
			if code := u.wait(t); code != 0 {
				t.Errorf("up exited %d; stderr:\n%s", code, u.stderr)
			}
			for _, n := range nodes {
				assertGone(t, n.name, n.pid)
			}
		})
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestUpModel: with --model node 0, and no other, is started with
// questd --model DIR --http-addr 127.0.0.1:0 (the directory made
// absolute); once the cluster is up, up prints the API's URL, which
// answers /v1/models with the model; with --json node 0's object has
// "http" and "url", the others none; --http-addr is passed on.
func TestUpModel(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			dir, questd := fakeCluster(t)
			modelDir := filepath.Join(t.TempDir(), "tiny-llama")
			if err := os.Mkdir(modelDir, 0o755); err != nil {
				t.Fatal(err)
			}
			args := []string{"--nodes", "2", "--insecure", "--questd", questd, "--model", modelDir}
			// --http-addr on another loopback address, port 0: passed on
			// (the default is 127.0.0.1:0), and no port picked here that
			// another process could take before the node binds it.
			const host = "127.0.0.2"
			if asJSON {
				l, err := net.Listen("tcp", host+":0")
				if err != nil {
					t.Skipf("cannot listen on %s (needed for a --http-addr other than the default): %v", host, err)
				}
				l.Close()
				args = append(args, "--json", "--http-addr", host+":0")
			}
			u := startUp(t, args...)
			var url, out string
			if asJSON {
				out = u.waitJSON(t, 2)
				var objs []map[string]any
				for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
					var o map[string]any
					if err := json.Unmarshal([]byte(l), &o); err != nil {
						t.Fatalf("line %q: %v", l, err)
					}
					objs = append(objs, o)
				}
				url, _ = objs[0]["url"].(string)
				http0, _ := objs[0]["http"].(string)
				h, port, err := net.SplitHostPort(http0)
				if err != nil || h != host || port == "0" || url != "http://"+http0+"/v1" || objs[1]["http"] != nil || objs[1]["url"] != nil {
					t.Fatalf("--json lines:\n%s", out)
				}
			} else {
				out = u.waitUp(t)
				parseUpLines(t, out)
				for _, l := range strings.Split(out, "\n") {
					if m := completionsLineRE.FindStringSubmatch(l); m != nil {
						url = m[1]
						if m[2] != "tiny-llama" || m[3] != "node-0" {
							t.Errorf("completions line %q", l)
						}
					}
				}
				if url == "" || !strings.HasSuffix(out, "cluster up: 2 nodes\n") {
					t.Fatalf("stdout:\n%s", out)
				}
			}
			resp, err := http.Get(url + "/models")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), `"tiny-llama"`) {
				t.Errorf("GET %s/models: %s %s", url, resp.Status, b)
			}
			recs := readRecords(dir)
			wantAddr := "127.0.0.1:0"
			if asJSON {
				wantAddr = host + ":0"
			}
			if a := strings.Join(recs["node-0"].Args, " "); !strings.Contains(a, "--model "+modelDir+" --http-addr "+wantAddr) {
				t.Errorf("node-0 was started with %q", recs["node-0"].Args)
			}
			if slices.Contains(recs["node-1"].Args, "--model") || slices.Contains(recs["node-1"].Args, "--http-addr") {
				t.Errorf("node-1 was started with %q", recs["node-1"].Args)
			}
			u.cancel()
			if code := u.wait(t); code != 0 {
				t.Errorf("exit %d; stderr:\n%s", code, u.stderr)
			}
		})
	}
}

// TestUpOwnGossipKey: a --gossip-key-file after "--" is the one every
// node gets; up then writes no key of its own.
func TestUpOwnGossipKey(t *testing.T) {
	dir, questd := fakeCluster(t)
	tlsDir := filepath.Join(t.TempDir(), "tls")
	key := filepath.Join(t.TempDir(), "mine.key")
	if err := os.WriteFile(key, []byte("AAAAAAAAAAAAAAAAAAAAAA==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u := startUp(t, "--nodes", "2", "--questd", questd, "--tls-dir", tlsDir, "--", "--gossip-key-file", key)
	u.waitUp(t)
	for name, r := range readRecords(dir) {
		if got := strings.Join(r.Args, " "); strings.Count(got, "--gossip-key-file") != 1 || !strings.Contains(got, "--gossip-key-file "+key) {
			t.Errorf("%s was started with %q: want --gossip-key-file %s once", name, r.Args, key)
		}
	}
	if _, err := os.Stat(filepath.Join(tlsDir, "gossip.key")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("up wrote its own gossip key next to the given one: %v", err)
	}
	if s := u.stderr.String(); strings.Contains(s, "gossip key gossip.key") {
		t.Errorf("stderr names up's own key:\n%s", s)
	}
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Errorf("exit %d", code)
	}
}
