package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// passkeyText is the passkey prompt of TestServeCompletions; its greedy
// completion is the pass key.
const passkeyText = "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. " +
	"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " +
	"The pass key is 48213. Remember it. 48213 is the pass key. " +
	"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " +
	"What is the pass key? The pass key is "

// gauge is the value of the gauge name{labels} on the metrics server at
// addr.
func gauge(t *testing.T, addr, name string, labels ...string) float64 {
	t.Helper()
	return metric(t, scrape(t, addr), name, labels...).GetGauge().GetValue()
}

// waitGauges waits (10 s at most) until ok holds.
func waitGauges(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s", what)
		}
	}
}

// TestServeClusterLayout: questd --serve-layout cluster --serve-cp 2 on
// a 2-node cluster of real questd serve paths serves the completions API
// with attention through the node's coordinator: the greedy passkey
// completion is the in-process engine's (the pass key, as in
// TestServeCompletions), the grid's ranks are hosted on both nodes and
// the steps count in the coordinator's metrics; a stream cancelled
// mid-stream, whose pages are on both nodes, frees them on both.
func TestServeClusterLayout(t *testing.T) {
	v1 := passkeyModel(t)
	peer, err := load(t, nil, append(append([]string(nil), smallNode...), "--name", "m1")...)
	if err != nil {
		t.Fatal(err)
	}
	pready, _, pstop := runServe(t, peer)
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--join", pready["gossip"],
		"--model", v1, "--http-addr", "127.0.0.1:0", "--max-running", "4", "--budget-tokens", "512",
		"--serve-layout", "cluster", "--serve-cp", "2", "--serve-capacity-pages", "256",
		// The prefix cache would keep the prompt's full pages on the grid
		// (completion's TestClusterPrefixCache* cover it): off, so that the
		// cancelled stream below leaves no pages on either node.
		"--prefix-caching=false")...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	m0, m1 := ready["metrics"], pready["metrics"]
	waitGauges(t, "two members up", func() bool { return gauge(t, m0, "questrt_members_up") == 2 })

	base := "http://" + ready["http"]
	req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": passkeyText, "max_tokens": 5, "temperature": 0})
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(req)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
			PagesTotal       int `json:"pages_total"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) != 1 || out.Choices[0].Text != "48213" {
		t.Fatalf("completion: %d %s (%v)", resp.StatusCode, b, err)
	}
	if out.Usage.CompletionTokens != 5 || out.Usage.PagesTotal == 0 {
		t.Errorf("usage %+v", out.Usage)
	}
	if g := gauge(t, m0, "questrt_grids", "role", "coordinated"); g != 1 {
		t.Errorf("m0 coordinates %v grids, want 1", g)
	}
	for _, addr := range []string{m0, m1} {
		if g := gauge(t, addr, "questrt_grids", "role", "hosted"); g != 1 {
			t.Errorf("node at %s hosts %v grids, want the served grid's rank", addr, g)
		}
	}
	// 4 decode steps, one coordinator step of every layer each (the
	// step seam: one plan per token), and no step per layer.
	mf := scrape(t, m0)
	if n := metric(t, mf, "questrt_steps_total", "kind", "steps", "code", "OK").GetCounter().GetValue(); n != 4 {
		t.Errorf("m0 coordinated %v multi-layer steps, want 4 (one per decode token)", n)
	}
	for _, m := range mf["questrt_steps_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "kind" && l.GetValue() == "step" && m.GetCounter().GetValue() > 0 {
				t.Errorf("m0 coordinated one-layer steps: %v", m)
			}
		}
	}

	// A stream cancelled mid-stream.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ = json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": passkeyText, "max_tokens": 400, "temperature": 0, "stream": true})
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(string(req)))
	hr.Header.Set("Content-Type", "application/json")
	sresp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	if sresp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(sresp.Body)
		t.Fatalf("stream: %d %s", sresp.StatusCode, b)
	}
	sc := bufio.NewScanner(sresp.Body)
	for chunks := 0; chunks < 3; {
		if !sc.Scan() {
			t.Fatalf("the stream ended after %d chunks: %v", chunks, sc.Err())
		}
		if strings.HasPrefix(sc.Text(), "data: ") {
			chunks++
		}
	}
	for _, addr := range []string{m0, m1} {
		if p := gauge(t, addr, "questrt_tier_pages", "tier", "device"); p == 0 {
			t.Errorf("node at %s: no pages in use mid-stream", addr)
		}
	}
	cancel()
	waitGauges(t, "the cancelled stream's pages freed on both nodes", func() bool {
		return gauge(t, m0, "questrt_tier_pages", "tier", "device") == 0 && gauge(t, m1, "questrt_tier_pages", "tier", "device") == 0 &&
			gauge(t, m0, "questrt_sequences") == 0
	})
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	if err := stop(); err != nil {
		t.Errorf("serve m0 after the signal: %v", err)
	}
	if err := pstop(); err != nil {
		t.Errorf("serve m1 after the signal: %v", err)
	}
}

// TestServeLayoutFlags: the layout flags are checked with the flag
// named, and a grid the model cannot take fails at start naming it.
func TestServeLayoutFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--serve-layout", "remote"}, "--serve-layout"},
		{[]string{"--serve-layout", "cluster"}, "--serve-layout"},
		{[]string{"--serve-cp", "2"}, "--serve-cp"},
		{[]string{"--serve-tp", "2"}, "--serve-cp 1 x --serve-tp 2"},
		{[]string{"--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-cp", "0"}, "--serve-cp"},
		{[]string{"--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-tp", "65"}, "--serve-tp"},
		{[]string{"--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster", "--serve-policy-grids", "-1"}, "--serve-policy-grids"},
		{[]string{"--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster", "--serve-grid-retries", "-1"}, "--serve-grid-retries"},
		{[]string{"--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster", "--serve-grid-retry-wait", "-1s"}, "--serve-grid-retry-wait"},
		// 9000 pages per rank on a node of 8 x 1024.
		{[]string{"--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster", "--serve-capacity-pages", "9000"}, "--serve-capacity-pages"},
		{[]string{"--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster", "--serve-capacity-pages", "4096", "--max-pages", "4100", "--monitor-rate", "0.1"}, "--max-pages 4100"},
		{[]string{"--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "device"}, "needs --backend cuda"},
		{[]string{"--serve-layout", "device"}, "--serve-layout"},
	} {
		_, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
	for _, layout := range []string{"local", "cluster"} {
		cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", passkeyModel(t), "--http-addr", "127.0.0.1:0",
			"--serve-layout", layout, "--serve-tp", "3", "--serve-capacity-pages", "256")...)
		if err != nil {
			t.Fatal(err)
		}
		err = serve(t.Context(), cfg, slog.New(slog.DiscardHandler), io.Discard, prometheus.NewRegistry(), nil)
		if err == nil || !strings.Contains(err.Error(), "--serve-tp 3") || !strings.Contains(err.Error(), "tp 3 does not divide the model's 2 KV heads") {
			t.Errorf("--serve-layout %s --serve-tp 3: %v", layout, err)
		}
	}
}

// TestServePolicyGridsFlag: --serve-policy-grids is the serve package's
// bound on the grids of requests' own quest options (default 2).
func TestServePolicyGridsFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 2},
		{[]string{"--serve-policy-grids", "0"}, 0},
		{[]string{"--serve-policy-grids", "5"}, 5},
	} {
		cfg, err := load(t, nil, append([]string{"--insecure", "--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if sc := cfg.serveConfig(nil); sc.PolicyGrids != c.want {
			t.Errorf("%v: serve config PolicyGrids %d, want %d", c.args, sc.PolicyGrids, c.want)
		}
	}
}

// TestServeGridRetriesFlags: --serve-grid-retries and
// --serve-grid-retry-wait are the serve package's GridRetries and
// GridRetryWait (defaults 1 and 10s).
func TestServeGridRetriesFlags(t *testing.T) {
	for _, c := range []struct {
		args    []string
		retries int
		wait    time.Duration
	}{
		{nil, 1, 10 * time.Second},
		{[]string{"--serve-grid-retries", "0"}, 0, 10 * time.Second},
		{[]string{"--serve-grid-retries", "3", "--serve-grid-retry-wait", "2s"}, 3, 2 * time.Second},
	} {
		cfg, err := load(t, nil, append([]string{"--insecure", "--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if sc := cfg.serveConfig(nil); sc.GridRetries != c.retries || sc.GridRetryWait != c.wait {
			t.Errorf("%v: serve config GridRetries %d, GridRetryWait %v; want %d, %v", c.args, sc.GridRetries, sc.GridRetryWait, c.retries, c.wait)
		}
	}
}

// TestServeClusterFollowFlags: --serve-cluster-wait and
// --serve-cluster-resize are the serve package's ClusterWait and
// ClusterResize (defaults 30s and 2s), --help shows them with their
// defaults, and negative or too long ones are refused, naming the flag.
func TestServeClusterFollowFlags(t *testing.T) {
	for _, c := range []struct {
		args         []string
		wait, resize time.Duration
	}{
		{nil, 30 * time.Second, 2 * time.Second},
		{[]string{"--serve-cluster-wait", "0", "--serve-cluster-resize", "0"}, 0, 0},
		{[]string{"--serve-cluster-wait", "2m", "--serve-cluster-resize", "500ms"}, 2 * time.Minute, 500 * time.Millisecond},
	} {
		cfg, err := load(t, nil, append([]string{"--insecure", "--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if sc := cfg.serveConfig(nil); sc.ClusterWait != c.wait || sc.ClusterResize != c.resize {
			t.Errorf("%v: serve config ClusterWait %v, ClusterResize %v; want %v, %v", c.args, sc.ClusterWait, sc.ClusterResize, c.wait, c.resize)
		}
	}
	for _, args := range [][]string{{"--serve-cluster-wait", "-1s"}, {"--serve-cluster-resize", "-1s"}, {"--serve-cluster-wait", "2h"}} {
		_, err := load(t, nil, append([]string{"--insecure", "--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: err %v, want a refusal naming %s", args, err, args[0])
		}
	}
	var out bytes.Buffer
	if _, err := loadConfig([]string{"--help"}, envOf(nil), &out); !errors.Is(err, errHelp) {
		t.Fatal(err)
	}
	for _, w := range []string{"--serve-cluster-wait", "(default 30s)", "--serve-cluster-resize", "shrink as they leave", "--serve-cluster-wait for the nodes"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("--help lacks %q", w)
		}
	}
}

// TestServeClusterPoolFromNodes: with --serve-layout cluster and no
// --serve-capacity-pages, the pool per rank is sized from the free
// pages the nodes advertise: a node of --max-pages 3000 serving a
// --serve-cp 2 grid with --serve-policy-grids 1 beside a peer of 1700
// has 4 ranks to place, which get 1000 pages each (3 + 1 pools; at 1001,
// 2 + 1; the serving node alone would give 750; 16 requests of
// --max-model-len 2048 would take 4096), and a request runs on the grid
// placed at that pool.
func TestServeClusterPoolFromNodes(t *testing.T) {
	v1 := passkeyModel(t)
	peer, err := load(t, nil, append(append([]string(nil), smallNode...), "--name", "m1", "--max-pages", "1700")...)
	if err != nil {
		t.Fatal(err)
	}
	pready, _, pstop := runServe(t, peer)
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--join", pready["gossip"], "--max-pages", "3000",
		"--model", v1, "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster", "--serve-cp", "2", "--serve-policy-grids", "1",
		"--max-model-len", "2048", "--budget-tokens", "512", "--prefix-caching=false")...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	m0 := ready["metrics"]
	if g := gauge(t, m0, "questrt_serve_pages", "state", "capacity"); g != 1000 {
		t.Errorf("serving pool %v pages per rank, want 1000 from the nodes' 3000 and 1700 free pages", g)
	}
	req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": passkeyText, "max_tokens": 5, "temperature": 0})
	resp, err := http.Post("http://"+ready["http"]+"/v1/completions", "application/json", strings.NewReader(string(req)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "48213") {
		t.Errorf("completion on the grid of 1000-page pools: %d %s", resp.StatusCode, b)
	}
	// The grid's two ranks took 1000 pages each: 3000 + 1700 - 2000
	// free on the nodes, as m0 advertises them.
	waitGauges(t, "the grid's pools reserved", func() bool {
		return gauge(t, m0, "questrt_pages", "state", "free")+gauge(t, pready["metrics"], "questrt_pages", "state", "free") == 2700
	})
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	if err := stop(); err != nil {
		t.Errorf("serve m0 after the signal: %v", err)
	}
	if err := pstop(); err != nil {
		t.Errorf("serve m1 after the signal: %v", err)
	}
}

// TestServeClusterPoolFollowsNodes: the pool sized from the nodes
// follows them (--serve-cluster-resize): a --serve-cp 2 grid with
// --serve-policy-grids 1 on nodes of 3000 and 1700 pages gets 1000 pages
// per rank; a third node of 3000 joins and, once the first grid closed
// idle (--grid-idle-timeout), the pool grows to 1500 (2 + 1 + 2 pools of
// 1500 for the 4 ranks) and a request runs on it; the third node leaves
// and the pool shrinks back to 1000; questrt_serve_pool_resizes_total
// counts both.
func TestServeClusterPoolFollowsNodes(t *testing.T) {
	v1 := passkeyModel(t)
	peer, err := load(t, nil, append(append([]string(nil), smallNode...), "--name", "m1", "--max-pages", "1700")...)
	if err != nil {
		t.Fatal(err)
	}
	pready, _, pstop := runServe(t, peer)
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--join", pready["gossip"], "--max-pages", "3000",
		"--model", v1, "--http-addr", "127.0.0.1:0", "--serve-layout", "cluster", "--serve-cp", "2", "--serve-policy-grids", "1",
		"--max-model-len", "2048", "--max-running", "64", "--budget-tokens", "512", "--prefix-caching=false",
		"--serve-cluster-resize", "100ms", "--grid-idle-timeout", "300ms")...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	m0 := ready["metrics"]
	if g := gauge(t, m0, "questrt_serve_pages", "state", "capacity"); g != 1000 {
		t.Errorf("serving pool %v pages per rank, want 1000 from the nodes' 3000 and 1700 free pages", g)
	}
	complete := func(what string) {
		t.Helper()
		req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": passkeyText, "max_tokens": 5, "temperature": 0})
		resp, err := http.Post("http://"+ready["http"]+"/v1/completions", "application/json", strings.NewReader(string(req)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "48213") {
			t.Errorf("completion %s: %d %s", what, resp.StatusCode, b)
		}
	}
	complete("on the first grid")
	third, err := load(t, nil, append(append([]string(nil), smallNode...), "--name", "m2", "--join", pready["gossip"], "--max-pages", "3000")...)
	if err != nil {
		t.Fatal(err)
	}
	_, _, tstop := runServe(t, third)
	waitGauges(t, "the pool grown to 1500 pages", func() bool { return gauge(t, m0, "questrt_serve_pages", "state", "capacity") == 1500 })
	complete("on the grown pool")
	if err := tstop(); err != nil {
		t.Errorf("serve m2 after the signal: %v", err)
	}
	waitGauges(t, "the pool shrunk back to 1000 pages", func() bool { return gauge(t, m0, "questrt_serve_pages", "state", "capacity") == 1000 })
	if g := metric(t, scrape(t, m0), "questrt_serve_pool_resizes_total").GetCounter().GetValue(); g != 2 {
		t.Errorf("questrt_serve_pool_resizes_total %v, want 2", g)
	}
	complete("on the shrunk pool")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	if err := stop(); err != nil {
		t.Errorf("serve m0 after the signal: %v", err)
	}
	if err := pstop(); err != nil {
		t.Errorf("serve m1 after the signal: %v", err)
	}
}
