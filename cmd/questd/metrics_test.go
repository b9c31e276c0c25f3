package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/buildinfo"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// smallNode is a one-node questd on free loopback ports with a small
// geometry: layer 0 dense, layer 1 sparse (6 pages of 4 tokens a head).
// Its membership probes (150 ms, 100 ms timeout, suspicion x4: 600 ms
// with three nodes) let a node starved on the loaded 2-core CI machine
// live, and still declare a killed one dead in about a second.
var smallNode = []string{"--plaintext", "--name", "m0", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0",
	"--metrics-addr", "127.0.0.1:0", "--layers", "2", "--q-heads", "8", "--kv-heads", "4", "--head-dim", "16",
	"--page-size", "4", "--capacity-pages", "128", "--budget-tokens", "24", "--dense-layers", "1", "--max-memory", "none",
	"--drain-timeout", "1s", "--probe-interval", "150ms", "--probe-timeout", "100ms", "--suspicion-mult", "4", "--gossip-interval", "50ms"}

// httpGet returns the status and body of url (no keep-alive: nothing
// lingers for goleak).
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	r, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return r.StatusCode, string(b)
}

// scrape parses the exposition of /metrics at addr.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpGet(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return mf
}

// metric returns the metric of family name with exactly labels (name=value
// pairs), failing the test when there is none.
func metric(t *testing.T, mf map[string]*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	t.Helper()
	f, ok := mf[name]
	if !ok {
		t.Fatalf("no metric family %s", name)
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel())*2 != len(labels) {
			continue
		}
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
			}
			if !found {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no %s%v in %v", name, labels, f.GetMetric())
	return nil
}

// TestServeMetrics runs questd's serve path: the ready line names the
// metrics server; steps through client show in /metrics (phase
// histograms, steps by kind and code, pages read vs dense, the node's
// state, build info, Go and process metrics); /healthz and /readyz
// answer 200; the gRPC health service says SERVING; a signal drains and
// serve returns nil.
func TestServeMetrics(t *testing.T) {
	cfg, err := load(t, nil, smallNode...)
	if err != nil {
		t.Fatal(err)
	}
	ready, ctx, stop := runServe(t, cfg)
	for _, k := range []string{"event", "name", "grpc", "gossip", "metrics"} {
		if ready[k] == "" {
			t.Errorf("ready line %v lacks %q", ready, k)
		}
	}
	maddr := ready["metrics"]

	if code, _ := httpGet(t, "http://"+maddr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code, _ := httpGet(t, "http://"+maddr+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz while serving: %d", code)
	}
	cc, err := grpc.NewClient(ready["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hr, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health while serving: %v, %v", hr.GetStatus(), err)
	}

	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	c, err := client.Dial(dctx, ready["grpc"], client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := c.Geometry()
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	kv, qd := g.KVHeads*g.HeadDim, g.QHeads*g.HeadDim
	var seqs []string
	for range 2 {
		id, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		for l := range g.Layers {
			if err := c.Append(ctx, id, l, vec(60*kv), vec(60*kv)); err != nil {
				t.Fatal(err)
			}
		}
		seqs = append(seqs, id)
	}
	var read, total int64
	count := func(plans []plan.Plan) {
		for _, p := range plans {
			read += int64(p.Reads() * g.KVHeads)
			total += int64(p.Pages * g.KVHeads)
		}
	}
	const steps = 5
	for i := range steps {
		items := []client.Item{{Seq: seqs[0], Q: vec(qd)}, {Seq: seqs[1], Q: vec(qd)}}
		if i%2 == 0 {
			items[0].K, items[0].V = vec(kv), vec(kv)
		}
		res, err := c.Step(ctx, 1, items, client.StepOptions{})
		if err != nil {
			t.Fatal(err)
		}
		count(res.Plans)
	}
	// One Decode of both layers (kind "steps").
	res, err := c.Decode(ctx, 0, 2, []client.Item{{Seq: seqs[1], Q: vec(qd)}}, client.StepOptions{},
		func(layer int, items []client.Item, r *client.StepResult) error {
			count(r.Plans)
			items[0].Q = vec(qd)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	count(res.Plans)
	// A step that fails in the coordinator: its second item is unknown.
	inst, _, _ := strings.Cut(seqs[0], ".")
	if _, err := c.Step(ctx, 1, []client.Item{{Seq: seqs[0], Q: vec(qd)}, {Seq: inst + ".999", Q: vec(qd)}}, client.StepOptions{}); err == nil {
		t.Fatal("a step with an unknown sequence succeeded")
	}
	if read == 0 || read >= total {
		t.Fatalf("the test's steps read %d of %d pages: want sparse reads", read, total)
	}

	mf := scrape(t, maddr)
	for _, phase := range []string{"score", "topk", "exchange", "attend", "merge", "total"} {
		h := metric(t, mf, "questrt_step_phase_seconds", "phase", phase).GetHistogram()
		if h.GetSampleCount() != steps+1 {
			t.Errorf("questrt_step_phase_seconds{phase=%q} count %d, want %d (the successful steps)", phase, h.GetSampleCount(), steps+1)
		}
		if phase == "total" && h.GetSampleSum() <= 0 {
			t.Errorf("total phase sum %v", h.GetSampleSum())
		}
	}
	for _, w := range []struct {
		kind, code string
		n          float64
	}{{"step", "OK", steps}, {"steps", "OK", 1}, {"step", "NotFound", 1}} {
		if got := metric(t, mf, "questrt_steps_total", "kind", w.kind, "code", w.code).GetCounter().GetValue(); got != w.n {
			t.Errorf("questrt_steps_total{kind=%q,code=%q} = %v, want %v", w.kind, w.code, got, w.n)
		}
	}
	if got := metric(t, mf, "questrt_pages_read_total").GetCounter().GetValue(); got != float64(read) {
		t.Errorf("questrt_pages_read_total = %v, want %d", got, read)
	}
	if got := metric(t, mf, "questrt_pages_total").GetCounter().GetValue(); got != float64(total) {
		t.Errorf("questrt_pages_total = %v, want %d", got, total)
	}
	gauge := func(name string, labels ...string) float64 {
		return metric(t, mf, name, labels...).GetGauge().GetValue()
	}
	if got := gauge("questrt_sequences"); got != 2 {
		t.Errorf("questrt_sequences = %v, want 2", got)
	}
	if c, h := gauge("questrt_grids", "role", "coordinated"), gauge("questrt_grids", "role", "hosted"); c != 1 || h != 1 {
		t.Errorf("questrt_grids coordinated %v, hosted %v: want 1 and 1", c, h)
	}
	if u, f := gauge("questrt_pages", "state", "used"), gauge("questrt_pages", "state", "free"); u <= 0 || u+f != float64(cfg.hostPages()) {
		t.Errorf("questrt_pages used %v, free %v: want used > 0 and used+free = %d", u, f, cfg.hostPages())
	}
	// Offload off: every used page of the hosted shard is on the device
	// (2 sequences of 60 or 63 tokens: 15 and 16 pages of 4 tokens).
	if d, h := gauge("questrt_tier_pages", "tier", "device"), gauge("questrt_tier_pages", "tier", "host"); d != 31 || h != 0 {
		t.Errorf("questrt_tier_pages device %v, host %v: want 31 and 0 (offload off)", d, h)
	}
	if got := gauge("questrt_members_up"); got != 1 {
		t.Errorf("questrt_members_up = %v, want 1", got)
	}
	bi := buildinfo.Read()
	if got := gauge("questrt_build_info", "version", bi.Version, "revision", bi.Rev(), "goversion", bi.GoVersion); got != 1 {
		t.Errorf("questrt_build_info = %v", got)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := mf[name]; !ok {
			t.Errorf("no %s (Go and process collectors)", name)
		}
	}

	if err := stop(); err != nil {
		t.Fatalf("serve after the signal: %v", err)
	}
	// The metrics server is gone with the node.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	if r, err := hc.Get("http://" + maddr + "/healthz"); err == nil {
		r.Body.Close()
		t.Errorf("/healthz after serve returned: %d", r.StatusCode)
	}
}

// TestServeMetricsOffload: with --device-budget-pages below the pages the
// appends fill, questrt_tier_pages shows the hosted shard's pages split
// between the device pool (at most the budget) and the host tier, before
// and after steps that read them back.
func TestServeMetricsOffload(t *testing.T) {
	const budget = 8
	args := append(append([]string(nil), smallNode...), "--device-budget-pages", strconv.Itoa(budget), "--eviction", "score")
	cfg, err := load(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	ready, ctx, stop := runServe(t, cfg)
	maddr := ready["metrics"]
	tiers := func() (float64, float64) {
		mf := scrape(t, maddr)
		return metric(t, mf, "questrt_tier_pages", "tier", "device").GetGauge().GetValue(),
			metric(t, mf, "questrt_tier_pages", "tier", "host").GetGauge().GetValue()
	}
	if d, h := tiers(); d != 0 || h != 0 {
		t.Errorf("before any grid: device %v, host %v pages, want 0 and 0", d, h)
	}

	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	c, err := client.Dial(dctx, ready["grpc"], client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := c.Geometry()
	rng := rand.New(rand.NewPCG(3, 4))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	kv, qd := g.KVHeads*g.HeadDim, g.QHeads*g.HeadDim
	var seqs []string
	for range 2 {
		id, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		for l := range g.Layers {
			if err := c.Append(ctx, id, l, vec(60*kv), vec(60*kv)); err != nil {
				t.Fatal(err)
			}
		}
		seqs = append(seqs, id)
	}
	// 2 sequences of 60 tokens: 30 pages of 4 tokens on the one rank.
	const used = 30
	check := func(when string) {
		t.Helper()
		d, h := tiers()
		if d <= 0 || d > budget || h <= 0 || d+h != used {
			t.Errorf("%s: questrt_tier_pages device %v, host %v: want device in (0, %d], host > 0, %d in all", when, d, h, budget, used)
		}
	}
	check("after the appends")
	for range 3 {
		items := []client.Item{{Seq: seqs[0], Q: vec(qd)}, {Seq: seqs[1], Q: vec(qd)}}
		if _, err := c.Step(ctx, 1, items, client.StepOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	check("after the steps")
	// The offload counters: the steps read more pages than the device
	// pool holds (budget 8 of 30), so some were missing and brought in,
	// and the appends evicted dirty pages (written back). Bytes in count
	// the steps' and the appends' reads of whole payloads.
	mf := scrape(t, maddr)
	val := func(name string, labels ...string) float64 {
		return metric(t, mf, name, labels...).GetCounter().GetValue()
	}
	hit, miss := val("questrt_offload_recall_pages_total", "result", "hit"), val("questrt_offload_recall_pages_total", "result", "miss")
	in, out := val("questrt_offload_bytes_total", "direction", "in"), val("questrt_offload_bytes_total", "direction", "out")
	dirty := val("questrt_offload_evictions_total", "kind", "dirty")
	pb := float64(payloadBytes(cfg))
	if miss <= 0 || hit <= 0 || in < miss*pb || int64(in)%int64(pb) != 0 || out <= 0 || out != dirty*pb {
		t.Errorf("offload counters: hit %v miss %v, bytes in %v out %v (payload %v), dirty evictions %v: want hits and misses, bytes in whole payloads >= misses', bytes out = dirty evictions' payloads", hit, miss, in, out, pb, dirty)
	}
	t.Logf("offload counters: hit %v miss %v, bytes in %v out %v, dirty evictions %v", hit, miss, in, out, dirty)

	if err := stop(); err != nil {
		t.Fatalf("serve after the signal: %v", err)
	}
}

// payloadBytes is one page's K/V over every layer of cfg's geometry
// (float32 on the CPU).
func payloadBytes(cfg Config) int {
	return cfg.Grid.Layers * 2 * cfg.Grid.KVHeads * cfg.Grid.PageSize * cfg.Grid.HeadDim * 4
}

// TestServeNoMetrics: --metrics-addr "" runs no HTTP server and the
// ready line has no "metrics".
func TestServeNoMetrics(t *testing.T) {
	args := append(append([]string(nil), smallNode...), "--metrics-addr", "")
	cfg, err := load(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := serve(ctx, cfg, slog.New(slog.DiscardHandler), pw, prometheus.NewRegistry(), nil)
		pw.Close()
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	cancel()
	go io.Copy(io.Discard, pr)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err != nil || strings.Contains(line, "metrics") || !strings.Contains(line, `"grpc":`) {
		t.Errorf("ready line %q, %v", line, err)
	}
}

// TestServeMetricsAddrInUse: a metrics address that is taken fails serve
// before the node starts, naming the flag.
func TestServeMetricsAddrInUse(t *testing.T) {
	taken := httptest.NewServer(http.NotFoundHandler())
	defer taken.Close()
	args := append(append([]string(nil), smallNode...), "--metrics-addr", strings.TrimPrefix(taken.URL, "http://"))
	cfg, err := load(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = serve(t.Context(), cfg, slog.New(slog.DiscardHandler), &out, prometheus.NewRegistry(), nil)
	if err == nil || err.Error() != "--metrics-addr "+strings.TrimPrefix(taken.URL, "http://")+": address already in use"+inUseHint || out.Len() != 0 {
		t.Errorf("serve on a taken metrics address: %v, stdout %q", err, out.String())
	}
}

// TestReadiness: /readyz is 503 before the node started, 200 while it
// serves, 503 once the drain began (questd's own flag, and node.Stop's);
// /healthz is 200 throughout.
func TestReadiness(t *testing.T) {
	ec := engine.DefaultConfig()
	ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = 2, 8, 4, 16, 4
	ec.CapacityPages = 64
	ec.Policy.PageSize, ec.Policy.BudgetTokens = 4, 24
	ec.MemoryLimit = memlimit.NoLimit
	var st readiness
	h := httpHandler(prometheus.NewRegistry(), st.ready, slog.New(slog.DiscardHandler))
	get := func(path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	check := func(when string, ready int) {
		t.Helper()
		if got := get("/readyz"); got != ready {
			t.Errorf("/readyz %s: %d, want %d", when, got, ready)
		}
		if got := get("/healthz"); got != http.StatusOK {
			t.Errorf("/healthz %s: %d", when, got)
		}
	}
	check("before the node started", http.StatusServiceUnavailable)
	nodes := nodetest.Start(t, "r", 2, ec, nil)
	st.set(nodes[0])
	check("while serving", http.StatusOK)
	st.drain()
	check("once questd began draining", http.StatusServiceUnavailable)

	var st1 readiness
	st1.set(nodes[1])
	if !st1.ready() {
		t.Fatal("node 1 not ready while serving")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := nodes[1].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if st1.ready() || nodes[1].Stats().Serving {
		t.Error("node 1 ready after Stop")
	}
	if get("/metrics") != http.StatusOK {
		t.Error("/metrics of an empty registry")
	}
}

// TestVersionFlag: questd --version prints the version line on stdout and
// exits 0, whatever else is on the command line; QUESTRT_VERSION means
// nothing and a file cannot set it.
func TestVersionFlag(t *testing.T) {
	re := regexp.MustCompile(`^questrt \S+ \(revision \S+, go go\S+\)\n$`)
	for _, args := range [][]string{{"--version"}, {"-version"}, {"--version", "--layers", "0"}} {
		var out, errb bytes.Buffer
		code := run(t.Context(), args, envOf(nil), &out, &errb)
		if code != 0 || errb.Len() != 0 || out.String() != buildinfo.Read().String()+"\n" || !re.MatchString(out.String()) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
		}
	}
	if _, err := load(t, map[string]string{"QUESTRT_VERSION": "true"}, "--plaintext"); err != nil {
		t.Errorf("QUESTRT_VERSION=true: %v (want it ignored)", err)
	}
	p := writeFile(t, "q.yaml", "plaintext: true\nversion: true\n")
	if _, err := load(t, nil, "--config", p); err == nil || !strings.Contains(err.Error(), `key "version"`) {
		t.Errorf("version in the file: %v", err)
	}
	if version != buildinfo.Read().Version {
		t.Errorf("advertised version %q, build info's %q", version, buildinfo.Read().Version)
	}
}

// TestServeMetricsPeerFailure: a step that fails because a peer of its
// grid died counts in questrt_collective_errors_total under that peer's
// name (kind unavailable), not under the coordinator's own; the
// memberlist health score is a gauge in 0..7 that rises on the probes of
// the dead peer this node cannot complete.
func TestServeMetricsPeerFailure(t *testing.T) {
	// A CP 2 grid: rank 0 on m0 (serve, with metrics), rank 1 on m1 (a
	// node in this process, killed below). Failure detection is slow
	// enough (500ms probes, 4 x suspicion) for the step after the kill
	// to reach m1 before the membership declares it dead.
	args := append(append([]string(nil), smallNode...), "--cp", "2", "--probe-interval", "500ms", "--probe-timeout", "200ms", "--suspicion-mult", "4")
	cfg, err := load(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	ready, ctx, stop := runServe(t, cfg)
	defer func() {
		if err := stop(); errors.Is(err, errServeStuck) {
			t.Error(err)
		}
	}()

	peerArgs := append(append([]string(nil), args...), "--name", "m1", "--metrics-addr", "", "--join", ready["gossip"])
	pcfg, err := load(t, nil, peerArgs...)
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	peer, err := node.Start(sctx, node.Config{GRPCAddr: pcfg.Node.GRPCAddr, Member: pcfg.memberConfig(), Engine: pcfg.engineConfig(),
		MaxPages: pcfg.hostPages(), MemoryLimit: pcfg.Capacity.MaxMemory, Plaintext: true, DrainTimeout: time.Second, Version: "test"})
	scancel()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Kill()
	maddr := ready["metrics"]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if metric(t, scrape(t, maddr), "questrt_members_up").GetGauge().GetValue() == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("m0 does not see m1 up")
		}
	}
	score := func() float64 {
		v := metric(t, scrape(t, maddr), "questrt_memberlist_health_score").GetGauge().GetValue()
		if v < 0 || v > 7 {
			t.Fatalf("questrt_memberlist_health_score = %v, want 0..7", v)
		}
		return v
	}
	score()

	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	c, err := client.Dial(dctx, ready["grpc"], client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := c.Geometry()
	rng := rand.New(rand.NewPCG(3, 4))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	kv, qd := g.KVHeads*g.HeadDim, g.QHeads*g.HeadDim
	id, on, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(on, []string{"m0", "m1"}) {
		t.Fatalf("sequence placed on %v, want [m0 m1]", on)
	}
	for l := range g.Layers {
		if err := c.Append(ctx, id, l, vec(60*kv), vec(60*kv)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Step(ctx, 1, []client.Item{{Seq: id, Q: vec(qd)}}, client.StepOptions{}); err != nil {
		t.Fatal(err)
	}
	if f, ok := scrape(t, maddr)["questrt_collective_errors_total"]; ok && len(f.GetMetric()) > 0 {
		t.Fatalf("peer errors before any failure: %v", f.GetMetric())
	}

	peer.Kill()
	_, err = c.Step(ctx, 1, []client.Item{{Seq: id, Q: vec(qd)}}, client.StepOptions{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("step after m1 died: %v, want UNAVAILABLE", err)
	}
	mf := scrape(t, maddr)
	if got := metric(t, mf, "questrt_collective_errors_total", "peer", "m1", "kind", "unavailable").GetCounter().GetValue(); got != 1 {
		t.Errorf(`questrt_collective_errors_total{peer="m1",kind="unavailable"} = %v, want 1`, got)
	}
	for _, m := range mf["questrt_collective_errors_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "peer" && l.GetValue() != "m1" {
				t.Errorf("a peer error blames %s: %v", l.GetValue(), m)
			}
		}
	}
	if got := metric(t, mf, "questrt_steps_total", "kind", "step", "code", "Unavailable").GetCounter().GetValue(); got != 1 {
		t.Errorf(`questrt_steps_total{kind="step",code="Unavailable"} = %v, want 1`, got)
	}
	// m0's probes of m1 fail now, with no third member to vouch for m1:
	// each one raises m0's health score.
	for deadline := time.Now().Add(10 * time.Second); score() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("questrt_memberlist_health_score still 0 after m0's probes of the dead m1")
		}
	}
}
