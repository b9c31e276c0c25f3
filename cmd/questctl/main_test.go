package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/replay"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	c := replay.Generate(replay.GenConfig{Tokens: 100, PageSize: 16, BudgetTokens: 32, QHeads: 4, KVHeads: 2, HeadDim: 8, Seed: 3})
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(dir, "case.json")
	if err := os.WriteFile(in, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	outFile := filepath.Join(dir, "result.json")
	for _, sel := range []string{"quest", "oracle", "recent", "dense"} {
		code, _, stderr := runCLI(t, "replay", "--in", in, "--selector", sel, "--out", outFile)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", sel, code, stderr)
		}
		b, err := os.ReadFile(outFile)
		if err != nil {
			t.Fatal(err)
		}
		var res replay.Result
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		if res.Selector != sel || len(res.SelectedPages) != 4 || len(res.Output) != 4 || res.Pages != 7 {
			t.Fatalf("%s: unexpected result %+v", sel, res)
		}
		// K = 2 pages with the format's default local 0.
		want := 2
		if sel == "dense" {
			want = 7
		}
		if len(res.SelectedPages[0]) != want {
			t.Fatalf("%s: %d pages selected, want %d", sel, len(res.SelectedPages[0]), want)
		}
	}
}

func TestReplayBadInputExitsTwo(t *testing.T) {
	bad, err := filepath.Glob("../../replay/testdata/*.json")
	if err != nil || len(bad) == 0 {
		t.Fatal("no bad replay files")
	}
	for _, f := range append(bad, "does-not-exist.json") {
		code, stdout, stderr := runCLI(t, "replay", "--in", f)
		if code != 2 {
			t.Errorf("%s: exit %d, want 2", f, code)
		}
		if stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s: want one stderr line and no stdout, got %q / %q", f, stdout, stderr)
		}
	}
}

// TestDemoBackendErrors: the demo's backend flags fail fast with a usage
// error (exit 2, one line): --device-resident or --kv-cache-dtype without
// cuda, an unknown backend. (cmd_nocuda_test.go adds cuda in a CPU build.)
func TestDemoBackendErrors(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--device-resident"},
		{"demo", "--kv-cache-dtype", "f16"},
		{"demo", "--backend", "tpu"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// TestReplayDeviceResidentNeedsCUDA: --device-resident on the CPU backend
// is a usage error (exit 2, one line) before any file is read.
func TestReplayDeviceResidentNeedsCUDA(t *testing.T) {
	code, stdout, stderr := runCLI(t, "replay", "--in", "does-not-exist.json", "--device-resident")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "--device-resident needs --backend cuda") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestUsage(t *testing.T) {
	cases := []struct {
		args []string
		code int
	}{
		{nil, 2},
		{[]string{"frobnicate"}, 2},
		{[]string{"help"}, 0},
		{[]string{"demo", "--help"}, 0},
		{[]string{"demo", "--context", "-5"}, 2},
		{[]string{"demo", "--selector", "h2o"}, 2},
		{[]string{"demo", "--q-heads", "6", "--kv-heads", "4"}, 2},
		{[]string{"replay"}, 2},
		{[]string{"replay", "--in", "x", "--selector", "h2o"}, 2},
		{[]string{"bench"}, 2},
		{[]string{"bench", "attention", "--context", "12,abc"}, 2},
		{[]string{"bench", "attention", "--backend", "tpu"}, 2},
		{[]string{"bench", "attention", "--help"}, 0},
		{[]string{"devices"}, 0},
		{[]string{"devices", "--help"}, 0},
		{[]string{"replay", "--in", "x", "--backend", "tpu"}, 2},
	}
	for _, c := range cases {
		if code, _, stderr := runCLI(t, c.args...); code != c.code {
			t.Errorf("%v: exit %d, want %d (%s)", c.args, code, c.code, stderr)
		}
	}
}

func TestDemoSmall(t *testing.T) {
	code, out, stderr := runCLI(t, "demo", "--context", "2048", "--steps", "4", "--layers", "3", "--dense-layers", "1",
		"--q-heads", "8", "--kv-heads", "2", "--head-dim", "32", "--budget", "256", "--mentions", "8", "--needles", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"prefill:", "speedup", "mass recall", "formula"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}

func TestBenchAttentionSmall(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "attention", "--context", "4096", "--budget", "256,512", "--q-heads", "8", "--kv-heads", "2", "--head-dim", "32", "--iters", "2", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got %q", out)
	}
	for _, l := range lines {
		var r map[string]any
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"context", "page_size", "budget", "dense_us", "quest_us", "score_us", "topk_us", "attend_us", "bytes_read", "bytes_dense", "rho_formula"} {
			if _, ok := r[k]; !ok {
				t.Errorf("JSON line lacks %q: %s", k, l)
			}
		}
		// 4096 tokens = 256 pages; K = budget/16; rho = 1/16 + K/256.
		k := r["budget"].(float64) / 16
		if want := 1.0/16 + k/256; r["rho_formula"].(float64) != want {
			t.Errorf("rho_formula %v, want %v", r["rho_formula"], want)
		}
	}
}

func TestReplayShardedCommand(t *testing.T) {
	dir := t.TempDir()
	c := replay.Generate(replay.GenConfig{Tokens: 500, PageSize: 16, BudgetTokens: 64, QHeads: 8, KVHeads: 4, HeadDim: 8, Seed: 4})
	raw, _ := json.Marshal(c)
	in := filepath.Join(dir, "case.json")
	if err := os.WriteFile(in, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	code, single, stderr := runCLI(t, "replay", "--in", in)
	if code != 0 {
		t.Fatal(stderr)
	}
	var want replay.Result
	json.Unmarshal([]byte(single), &want)
	for _, args := range [][]string{
		{"--cp", "3", "--tp", "2", "--selection", "exact"},
		{"--cp", "2", "--tp", "4", "--selection", "replicated", "--placement", "contiguous"},
	} {
		code, out, stderr := runCLI(t, append([]string{"replay", "--in", in}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		var got replay.Result
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		for h := range want.SelectedPages {
			if fmt.Sprint(got.SelectedPages[h]) != fmt.Sprint(want.SelectedPages[h]) {
				t.Fatalf("%v head %d: %v, single shard %v", args, h, got.SelectedPages[h], want.SelectedPages[h])
			}
		}
	}
	for _, args := range [][]string{{"--tp", "3"}, {"--cp", "0"}, {"--selection", "all"}, {"--placement", "random"}} {
		if code, _, _ := runCLI(t, append([]string{"replay", "--in", in}, args...)...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func TestBenchCollectiveSmall(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "collective", "--shards", "2,3", "--batch", "1", "--steps", "20", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines: %q", out)
	}
	for _, l := range lines {
		var r map[string]any
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"shards", "batch", "select_p50_us", "select_p95_us", "select_p99_us", "merge_p50_us", "merge_p99_us"} {
			if _, ok := r[k]; !ok {
				t.Errorf("line lacks %q: %s", k, l)
			}
		}
	}
}

func TestDemoSharded(t *testing.T) {
	code, out, stderr := runCLI(t, "demo", "--context", "2048", "--steps", "2", "--layers", "2", "--dense-layers", "1",
		"--q-heads", "8", "--kv-heads", "4", "--head-dim", "16", "--budget", "256", "--mentions", "8", "--needles", "2", "--cp", "3", "--tp", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "cp 3 x tp 2") || !strings.Contains(out, "of the Quest step time") {
		t.Fatalf("demo output:\n%s", out)
	}
}

func TestBenchSelectionSmall(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "selection", "--cp", "2", "--context", "4096", "--budget", "256",
		"--q-heads", "8", "--kv-heads", "2", "--head-dim", "32", "--steps", "3", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines (exact, union, replicated): %q", out)
	}
	for _, l := range lines {
		var r struct {
			Selection  string  `json:"selection"`
			SamePages  float64 `json:"same_pages_as_exact"`
			MassRecall float64 `json:"mass_recall"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		// Exact and replicated select the same pages by construction.
		if (r.Selection == "exact" || r.Selection == "replicated") && r.SamePages != 1 {
			t.Errorf("%s: same pages as exact %v, want 1", r.Selection, r.SamePages)
		}
		if r.MassRecall <= 0 || r.MassRecall > 1 {
			t.Errorf("%s: mass recall %v", r.Selection, r.MassRecall)
		}
	}
	if code, _, _ := runCLI(t, "bench", "selection", "--selection", "all"); code != 2 {
		t.Error("bad mode accepted")
	}
}
