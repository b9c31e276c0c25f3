package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
)

// addrLine is what the tests read of a bench collective --addr line.
type addrLine struct {
	Kind          string   `json:"kind"`
	Transport     string   `json:"transport"`
	Shards        int      `json:"shards"`
	Processes     int      `json:"processes"`
	Batch         int      `json:"batch"`
	Addr          string   `json:"addr"`
	Nodes         []string `json:"nodes"`
	TLS           *bool    `json:"tls"`
	SelectP50     float64  `json:"select_p50_us"`
	BaselineP50   float64  `json:"baseline_p50_us"`
	SelectBytes   int64    `json:"select_bytes"`
	BaselineBytes int64    `json:"baseline_bytes"`
	MergeBytes    int64    `json:"merge_bytes"`
	Bytes         int64    `json:"bytes"`
	P50           float64  `json:"p50_us"`
	BusBW         float64  `json:"busbw_gbps"`
}

func readAddrLines(t *testing.T, out string) []addrLine {
	t.Helper()
	var lines []addrLine
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var l addrLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// benchCollective runs 'questctl bench collective' in process.
func benchCollective(ctx context.Context, args []string, out, errb *bytes.Buffer) error {
	return runBenchCollective(ctx, args, out, errb)
}

// noBenches fails unless every node of nodes holds no bench rank within
// 10 s.
func noBenches(t *testing.T, nodes []*node.Node) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, nd := range nodes {
		for nd.Stats().Benches != 0 {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
				t.Fatalf("%s still holds %d bench ranks", nd.Name(), nd.Stats().Benches)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// --addr places one rank per node (the node asked first, the others by
// name), runs the same loop over the cluster's streams and prints the
// lines of the local modes: the collective moves the bytes of its
// baseline, and the bytes per step equal those of the same
// configuration on goroutines of one process.
func TestBenchCollectiveAddr(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	nodes := nodetest.Start(t, "a", 3, nodetest.Geometry(1, 1, 0), nil)
	sizes := []string{"--batch", "1,4", "--steps", "20", "--warmup", "2", "--pages", "64", "--k", "8", "--kv-heads", "2", "--q-heads", "4", "--head-dim", "16"}
	code, out, errs := call(benchCollective, append([]string{"--addr", nodes[1].Addr(), "--nodes", "2,3", "--json"}, sizes...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	got := readAddrLines(t, out)
	code, out, errs = call(benchCollective, append([]string{"--shards", "2,3", "--transport", "inproc", "--json"}, sizes...)...)
	if code != 0 {
		t.Fatalf("local: exit %d: %s", code, errs)
	}
	local := readAddrLines(t, out)
	if len(got) != 4 || len(local) != 4 {
		t.Fatalf("%d lines through the cluster, %d in process, want 4 each", len(got), len(local))
	}
	for i, l := range got {
		want := []string{"a1", "a0", "a2"}[:l.Shards]
		if l.Kind != "collective" || l.Transport != "cluster" || l.Processes != l.Shards || l.Addr != nodes[1].Addr() || !slices.Equal(l.Nodes, want) {
			t.Errorf("line %d: %+v, want kind collective, transport cluster, processes = shards, nodes %v", i, l, want)
		}
		if l.TLS == nil || *l.TLS {
			t.Errorf("line %d: tls %v on a plaintext cluster", i, l.TLS)
		}
		if l.SelectP50 <= 0 || l.BaselineP50 <= 0 || l.SelectBytes <= 0 || l.SelectBytes != l.BaselineBytes {
			t.Errorf("line %d: select p50 %v baseline p50 %v, bytes %d baseline %d", i, l.SelectP50, l.BaselineP50, l.SelectBytes, l.BaselineBytes)
		}
		lc := local[i]
		if lc.Shards != l.Shards || lc.Batch != l.Batch || lc.SelectBytes != l.SelectBytes || lc.MergeBytes != l.MergeBytes {
			t.Errorf("line %d: shards %d batch %d moved %d + %d bytes through the cluster, %d + %d in process (shards %d batch %d)",
				i, l.Shards, l.Batch, l.SelectBytes, l.MergeBytes, lc.SelectBytes, lc.MergeBytes, lc.Shards, lc.Batch)
		}
	}

	// A sweep on every node up: sizes 8 to 64, factor 2.
	code, out, errs = call(benchCollective, "--addr", nodes[0].Addr(), "--min-bytes", "8", "--max-bytes", "64", "--factor", "2", "--steps", "10", "--json")
	if code != 0 {
		t.Fatalf("sweep: exit %d: %s", code, errs)
	}
	sw := readAddrLines(t, out)
	var sizes2 []int64
	for _, l := range sw {
		sizes2 = append(sizes2, l.Bytes)
		if l.Kind != "allgather_sweep" || l.Transport != "cluster" || l.Shards != 3 || !slices.Equal(l.Nodes, []string{"a0", "a1", "a2"}) || l.P50 <= 0 || l.BusBW <= 0 {
			t.Errorf("sweep line %+v", l)
		}
	}
	// nccl-tests' sizes: each of the 3 ranks sends size/3 bytes.
	if !slices.Equal(sizes2, []int64{6, 15, 30, 63}) {
		t.Errorf("sweep sizes %v, want 6 15 30 63 (8 16 32 64 in whole thirds)", sizes2)
	}
	noBenches(t, nodes)
}

// A node killed mid-run fails the run with that node named, and the
// others end their ranks: none is held afterwards, and no goroutine is
// left once the nodes stop.
func TestBenchCollectiveAddrNodeKilled(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	nodes := nodetest.Start(t, "k", 3, nodetest.Geometry(1, 1, 0), nil)
	type result struct {
		code       int
		out, errs  string
		afterStart time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		code, out, errs := call(benchCollective, "--addr", nodes[0].Addr(), "--nodes", "3", "--batch", "1", "--steps", "1000000",
			"--warmup", "0", "--pages", "64", "--k", "8", "--kv-heads", "2", "--q-heads", "4", "--head-dim", "16", "--timeout", "60s", "--json")
		done <- result{code, out, errs, time.Since(start)}
	}()
	// Wait until every node runs its rank, then kill the last.
	deadline := time.Now().Add(10 * time.Second)
	for _, nd := range nodes {
		for nd.Stats().Benches != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s holds %d bench ranks, want 1", nd.Name(), nd.Stats().Benches)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond)
	killed := time.Now()
	nodes[2].Kill()
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the run did not end within 20 s of the kill")
	}
	if r.code != 1 || !strings.Contains(r.errs, "node k2 ") || strings.Contains(r.errs, "node k1 ") {
		t.Fatalf("exit %d, stderr %q: want exit 1 naming node k2 (killed), not k1", r.code, r.errs)
	}
	if r.out != "" {
		t.Errorf("stdout %q after a failed run", r.out)
	}
	t.Logf("failed %v after the kill: %s", time.Since(killed).Round(time.Millisecond), strings.TrimSpace(r.errs))
	noBenches(t, nodes[:2])
}

// Bad sweeps and sizes, and more ranks than nodes, are refused (exit 2)
// before anything runs: no node ever holds a bench rank.
func TestBenchCollectiveAddrRefused(t *testing.T) {
	nodes := nodetest.Start(t, "r", 3, nodetest.Geometry(1, 1, 0), nil)
	addr := nodes[0].Addr()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--min-bytes", "8", "--max-bytes", "64", "--factor", "1"}, "--factor 1: want 2 to 1024"},
		{[]string{"--min-bytes", "0", "--max-bytes", "64"}, "--min-bytes 0: want 1 to"},
		{[]string{"--min-bytes", "8", "--max-bytes", "2G"}, "--max-bytes 2147483648: want 1 to 1073741824"},
		{[]string{"--min-bytes", "64", "--max-bytes", "8"}, "--min-bytes 64: want 1 to 8 (--max-bytes)"},
		{[]string{"--nodes", "4"}, "4 nodes: want 2 to the 3 nodes up"},
		{[]string{"--nodes", "1"}, "--nodes 1: want 2 to 64"},
		{[]string{"--nodes", "3", "--pages", "2", "--k", "1"}, "--nodes 3: more ranks than the 2 pages"},
		{[]string{"--shards", "2"}, "--shards: not with --addr"},
		{[]string{"--transport", "grpc"}, "--transport: not with --addr"},
		{[]string{"--timeout", "11m"}, "--timeout 11m0s: with --addr, want a positive duration of at most 10m0s"},
	} {
		code, out, errs := call(benchCollective, append([]string{"--addr", addr, "--steps", "5", "--json"}, c.args...)...)
		if code != 2 || out != "" || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q: want exit 2 and %q", c.args, code, out, errs, c.want)
		}
	}
	noBenches(t, nodes)
}
