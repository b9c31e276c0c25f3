package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// exampleCase is the repository's example replay case.
const exampleCase = "../../examples/replay/case.json"

// replayFlagCase is one command line and the exit status it must give.
type replayFlagCase struct {
	args []string
	code int
}

// checkReplayRuns runs each command line: bad ones (exit 2) print exactly
// one stderr line and nothing on stdout; good ones (exit 0) print JSON.
func checkReplayRuns(t *testing.T, cases []replayFlagCase) {
	t.Helper()
	for _, tc := range cases {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.args, code, tc.code, stderr)
			continue
		}
		switch code {
		case 2:
			if stdout != "" || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%q: want one stderr line and no stdout, got %.200q / %q", tc.args, stdout, stderr)
			}
		case 0:
			if !json.Valid([]byte(stdout)) {
				t.Errorf("%q: stdout is not JSON: %.200q", tc.args, stdout)
			}
		}
	}
}

const replayHuge = "9223372036854775807"

// TestReplayNumericFlags: every numeric replay flag at 0, -1, 1 and huge
// values: a usage error (exit 2, one line) or a result, never a panic.
func TestReplayNumericFlags(t *testing.T) {
	in := []string{"replay", "--in", exampleCase}
	with := func(args ...string) []string { return append(append([]string(nil), in...), args...) }
	checkReplayRuns(t, []replayFlagCase{
		{with("--cp", "0"), 2},
		{with("--cp", "-1"), 2},
		{with("--cp", "1"), 0},
		{with("--cp", "16"), 0}, // one page per rank
		{with("--cp", "17"), 2}, // more ranks than pages
		{with("--cp", replayHuge), 2},
		{with("--cp", "99999999999999999999"), 2},
		{with("--tp", "0"), 2},
		{with("--tp", "-1"), 2},
		{with("--tp", "1"), 0},
		{with("--tp", "2"), 0},
		{with("--tp", replayHuge), 2},
		{with("--max-memory", "0"), 0},  // the memory available now
		{with("--max-memory", "-1"), 0}, // no check
		{with("--max-memory", "1"), 2},  // one byte
		{with("--max-memory", "-2"), 2},
		{with("--max-memory", "1000PiB"), 0},
		{with("--max-memory", "9999PiB"), 2},
		{with("--max-memory", "1e30"), 2},
	})
}

// TestReplayGenFlags: every generate flag at 0, -1, 1 and huge values.
// Oversize geometries are refused by the memory preflight before
// anything is allocated.
func TestReplayGenFlags(t *testing.T) {
	gen := func(args ...string) []string { return append([]string{"replay", "gen"}, args...) }
	checkReplayRuns(t, []replayFlagCase{
		{gen(), 0},
		{gen("--tokens", "0"), 2},
		{gen("--tokens", "-1"), 2},
		{gen("--tokens", "1"), 0},
		{gen("--tokens", replayHuge), 2},
		{gen("--q-heads", "0"), 2},
		{gen("--q-heads", "-1"), 2},
		{gen("--q-heads", "1", "--kv-heads", "1"), 0},
		{gen("--q-heads", "1"), 2}, // not a multiple of the 2 KV heads
		{gen("--q-heads", replayHuge, "--kv-heads", "1"), 2},
		{gen("--kv-heads", "0"), 2},
		{gen("--kv-heads", "-1"), 2},
		{gen("--kv-heads", "1"), 0},
		{gen("--kv-heads", replayHuge), 2},
		{gen("--head-dim", "0"), 2},
		{gen("--head-dim", "-1"), 2},
		{gen("--head-dim", "1"), 0},
		{gen("--head-dim", replayHuge), 2},
		{gen("--page-size", "0"), 2},
		{gen("--page-size", "-1"), 2},
		{gen("--page-size", "1"), 0},
		{gen("--page-size", replayHuge), 2},                         // above the budget
		{gen("--page-size", replayHuge, "--budget", replayHuge), 2}, // its replay would not fit
		{gen("--budget", "0"), 2},
		{gen("--budget", "-1"), 2},
		{gen("--budget", "1"), 2},        // below one page
		{gen("--budget", replayHuge), 2}, // above its range
		{gen("--budget", "16777216"), 0}, // K = 2^20 pages: every page read
		{gen("--sink-pages", "0"), 0},
		{gen("--sink-pages", "-1"), 2},
		{gen("--sink-pages", "1"), 0},
		{gen("--sink-pages", "4"), 0}, // K = 64/16 = 4 forced pages
		{gen("--sink-pages", "5"), 2},
		{gen("--sink-pages", replayHuge), 2},
		{gen("--local-pages", "0"), 0},
		{gen("--local-pages", "-1"), 2},
		{gen("--local-pages", "1"), 0},
		{gen("--local-pages", "4"), 0},
		{gen("--local-pages", "5"), 2},
		{gen("--local-pages", replayHuge), 2},
		{gen("--sink-pages", "2", "--local-pages", "2"), 0},
		{gen("--sink-pages", "3", "--local-pages", "3"), 2}, // before: 6 pages read per head with K = 4
		{gen("--sink-pages", replayHuge, "--local-pages", replayHuge), 2},
		{gen("--seed", "0"), 0},
		{gen("--seed", "-1"), 2},
		{gen("--seed", "1"), 0},
		{gen("--seed", "18446744073709551615"), 0},
		{gen("--seed", "18446744073709551616"), 2},
		{gen("--max-memory", "0"), 0},
		{gen("--max-memory", "-1"), 0},
		{gen("--max-memory", "1"), 2},
		{gen("--max-memory", "1000PiB"), 0},
		{gen("--gqa", "mean"), 2},
		{gen("stray"), 2},
	})
}

// TestReplayTooManyCPRanks: more CP ranks than the case has pages is a
// usage error that says the limit (before, --cp 10000 on a one-token case
// gave every rank a pool of the whole sequence: 4 GiB in 9 s).
func TestReplayTooManyCPRanks(t *testing.T) {
	for _, tc := range []struct {
		in, cp, want string
	}{
		{"../../replay/testdata/valid/zero_reference.json", "10000", "--cp 10000: want 1..2"},
		{exampleCase, "10000", "--cp 10000: want 1..16"},
	} {
		code, stdout, stderr := runCLI(t, "replay", "--in", tc.in, "--cp", tc.cp)
		if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s --cp %s: exit %d, stdout %.200q, stderr %q", tc.in, tc.cp, code, stdout, stderr)
		}
	}
}

// TestReplayOversizeCase: a case whose page_size makes its pools and
// buffers too large is refused with one line naming page_size (before:
// exit 1, or a Go runtime out-of-memory crash); so is a normal case under
// a small --max-memory (here by the input bound: the 188 KB example is
// more than 1/32 of 100 KiB).
func TestReplayOversizeCase(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "--in", "../../replay/testdata/huge_page_size.json"},
		{"replay", "--in", "../../replay/testdata/huge_group_page.json"},
		{"replay", "--in", "../../replay/testdata/huge_page_size.json", "--max-memory", "-1"}, // overflows int64: refused even unchecked
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, "page_size") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stdout %.200q, stderr %q", args, code, stdout, stderr)
		}
	}
	code, _, stderr := runCLI(t, "replay", "--in", exampleCase, "--max-memory", "100KiB")
	if code != 2 || !strings.Contains(stderr, "memory limit") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("--max-memory 100KiB: exit %d, stderr %q", code, stderr)
	}
}

// TestReplayOverflowCase: finite inputs whose dot products or value sums
// would overflow float32 are refused at validation with one line (before:
// "json: unsupported value: NaN", exit 1).
func TestReplayOverflowCase(t *testing.T) {
	for _, f := range []string{"dot_overflow.json", "value_sum_overflow.json"} {
		for _, sel := range []string{"quest", "dense"} {
			code, stdout, stderr := runCLI(t, "replay", "--in", "../../replay/testdata/"+f, "--selector", sel)
			if code != 2 || stdout != "" || !strings.Contains(stderr, "float32") || strings.Contains(stderr, "json") || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%s %s: exit %d, stdout %.200q, stderr %q", f, sel, code, stdout, stderr)
			}
		}
	}
	code, stdout, stderr := runCLI(t, "replay", "--in", "../../replay/testdata/valid/at_value_limit.json", "--cp", "2")
	if code != 0 || !json.Valid([]byte(stdout)) {
		t.Errorf("a case at the limit: exit %d, stderr %q", code, stderr)
	}
}

// TestReplayZeroReference: when the dense output is zero and Quest's is
// not, "rel_l2" is null and "abs_l2" holds the error (before: a NaN and
// "json: unsupported value: NaN", exit 1).
func TestReplayZeroReference(t *testing.T) {
	for _, args := range [][]string{nil, {"--cp", "2"}} {
		code, stdout, stderr := runCLI(t, append([]string{"replay", "--in", "../../replay/testdata/valid/zero_reference.json"}, args...)...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, stderr)
		}
		var res map[string]any
		if err := json.Unmarshal([]byte(stdout), &res); err != nil {
			t.Fatal(err)
		}
		if v, ok := res["rel_l2"]; !ok || v != nil {
			t.Errorf("%q: rel_l2 %v (present %v), want null", args, v, ok)
		}
		if res["abs_l2"] != 1.0 {
			t.Errorf("%q: abs_l2 %v, want 1", args, res["abs_l2"])
		}
	}
}

// TestReplayDtypeNeedsCUDA: --kv-cache-dtype on the CPU backend is a usage
// error, as in demo (before, it was ignored).
func TestReplayDtypeNeedsCUDA(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "--in", exampleCase, "--kv-cache-dtype", "f16"},
		{"replay", "--in", exampleCase, "--kv-cache-dtype", "f32", "--backend", "cpu"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, "--kv-cache-dtype needs --backend cuda") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stdout %.200q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// TestReplayExampleRuns: the repository's example case runs on one shard
// and on CP x TP shards, and gives valid result JSON.
func TestReplayExampleRuns(t *testing.T) {
	for _, args := range [][]string{nil, {"--cp", "4", "--tp", "2"}, {"--selector", "dense"}} {
		code, stdout, stderr := runCLI(t, append([]string{"replay", "--in", exampleCase}, args...)...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, stderr)
		}
		var res struct {
			SelectedPages [][]int32 `json:"selected_pages"`
			Pages         int       `json:"pages"`
			RelL2         *float64  `json:"rel_l2"`
		}
		if err := json.Unmarshal([]byte(stdout), &res); err != nil {
			t.Fatal(err)
		}
		if res.Pages != 16 || len(res.SelectedPages) != 4 || res.RelL2 == nil {
			t.Fatalf("%q: unexpected result %s", args, stdout)
		}
	}
}

// TestReplayGenMatchesExample: the generate command documented in
// examples/replay/README.md writes exactly examples/replay/case.json.
func TestReplayGenMatchesExample(t *testing.T) {
	doc, err := os.Open("../../examples/replay/README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer doc.Close()
	var words []string
	sc := bufio.NewScanner(doc)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "go run ./cmd/questctl replay gen ") {
			words = strings.Fields(line)[3:]
			break
		}
	}
	if words == nil {
		t.Fatal("examples/replay/README.md documents no 'go run ./cmd/questctl replay gen' command")
	}
	out := filepath.Join(t.TempDir(), "case.json")
	found := false
	for i, w := range words {
		if w == "--out" && i+1 < len(words) {
			words[i+1], found = out, true
		}
	}
	if !found {
		t.Fatalf("the documented command %q has no --out", words)
	}
	if code, _, stderr := runCLI(t, words...); code != 0 {
		t.Fatalf("%q: exit %d: %s", words, code, stderr)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(exampleCase)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%q writes %d bytes that differ from examples/replay/case.json (%d bytes): regenerate it", words, len(got), len(want))
	}
	// The default flags make the same case, on stdout.
	if code, stdout, _ := runCLI(t, "replay", "gen"); code != 0 || stdout != string(want) {
		t.Fatalf("replay gen with its defaults: exit %d, %d bytes differ from the example", code, len(stdout))
	}
}

// TestReplayFlagMessages: replay's and replay gen's flag errors follow
// the CLI's form "--flag VALUE: want RANGE", with an upper bound (before:
// "--cp 0 and --tp 1 must be positive", "gen: tokens 0 must be positive").
func TestReplayFlagMessages(t *testing.T) {
	in := []string{"replay", "--in", exampleCase}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(in, "--cp", "0"), "questctl replay: --cp 0: want 1..16 "},
		{append(in, "--cp", "-1"), "questctl replay: --cp -1: want 1..16 "},
		{append(in, "--cp", "17"), "questctl replay: --cp 17: want 1..16 "},
		{append(in, "--tp", "0"), "questctl replay: --tp 0: want 1..2, a divisor of the case's kv_heads 2"},
		{append(in, "--tp", "3"), "questctl replay: --tp 3: want 1..2, a divisor of the case's kv_heads 2"},
		{append(in, "--tp", replayHuge), "questctl replay: --tp " + replayHuge + ": want 1..2"},
		{[]string{"replay", "gen", "--tokens", "0"}, "questctl replay gen: --tokens 0: want 1..16777216"},
		{[]string{"replay", "gen", "--tokens", replayHuge}, "questctl replay gen: --tokens " + replayHuge + ": want 1..16777216"},
		{[]string{"replay", "gen", "--q-heads", "0"}, "questctl replay gen: --q-heads 0: want 1..1024"},
		{[]string{"replay", "gen", "--q-heads", "5"}, "questctl replay gen: --q-heads 5: want a multiple of --kv-heads 2, at most 1024"},
		{[]string{"replay", "gen", "--kv-heads", "-1"}, "questctl replay gen: --kv-heads -1: want 1..1024"},
		{[]string{"replay", "gen", "--head-dim", replayHuge}, "questctl replay gen: --head-dim " + replayHuge + ": want 1..4096"},
		{[]string{"replay", "gen", "--page-size", "0"}, "questctl replay gen: --page-size 0: want 1..16777216"},
		{[]string{"replay", "gen", "--budget", "1"}, "questctl replay gen: --budget 1: want 16..16777216"},
		{[]string{"replay", "gen", "--sink-pages", "-1"}, "questctl replay gen: --sink-pages -1: want 0..4"},
		{[]string{"replay", "gen", "--local-pages", "-1"}, "questctl replay gen: --local-pages -1: want 0..4"},
		{[]string{"replay", "gen", "--sink-pages", "3", "--local-pages", "3"}, "questctl replay gen: --sink-pages 3 + --local-pages 3: want at most K = 4 forced pages (--budget 64 / --page-size 16"},
		{[]string{"replay", "gen", "--sink-pages", "100"}, "questctl replay gen: --sink-pages 100 + --local-pages 0: want at most K = 4"},
		{[]string{"replay", "gen", "--gqa", "mean"}, `questctl replay gen: --gqa "mean": want group_max or per_head`},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != 2 || stdout != "" || !strings.HasPrefix(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stdout %.100q, stderr %q; want exit 2 and one line starting %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
}

// TestReplayStdinBounded: a case on stdin is read up to 1/32 of
// --max-memory and refused beyond with one line naming the bound and
// --max-memory, having allocated less than the limit. Before, the whole
// input was read and decoded: 16 MiB of one-number rows cost hundreds of
// MiB, and an endless one crashed the Go runtime out of memory.
func TestReplayStdinBounded(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	done := make(chan struct{})
	go func() { // 16 MiB: '{... "keys":[[[1]' then ",[1]" (ends early when the reader closes)
		defer close(done)
		defer pw.Close()
		if _, err := pw.Write([]byte(`{"page_size":1,"budget_tokens":1,"q_heads":1,"kv_heads":1,"head_dim":1,"keys":[[[1]`)); err != nil {
			return
		}
		buf := bytes.Repeat([]byte(",[1]"), 16<<10)
		for range 256 {
			if _, err := pw.Write(buf); err != nil {
				return
			}
		}
	}()
	stdin := os.Stdin
	os.Stdin = pr
	defer func() { os.Stdin = stdin }()
	var code int
	var stdout, stderr string
	got := allocated(func() { code, stdout, stderr = runCLI(t, "replay", "--in", "-", "--max-memory", "64MiB") })
	pr.Close()
	<-done
	want := "questctl replay case: case file is larger than 2097152 bytes (1/32 of the 64.0 MiB memory limit"
	if code != 2 || stdout != "" || !strings.HasPrefix(stderr, want) || !strings.Contains(stderr, "--max-memory") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stdout %.100q, stderr %q; want exit 2 and one line starting %q", code, stdout, stderr, want)
	}
	if got > 64<<20 {
		t.Fatalf("allocated %d MiB under --max-memory 64MiB", got>>20)
	}
	t.Logf("allocated %.1f MiB before refusing", float64(got)/(1<<20))
}

// allocated returns the bytes f allocates on the heap (freed or not).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestReplayStrictCase: null values, field names in another case and
// duplicate fields are refused with one line naming the field (before,
// each ran: null read as 0, "Page_Size" overrode page_size, the last
// duplicate won).
func TestReplayStrictCase(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"null_value.json", "query[1][0] is null"},
		{"field_case.json", `unknown field "Page_Size"`},
		{"duplicate_field.json", `duplicate field "page_size"`},
		{"forced_pages_over_budget.json", "sink_pages 3 + local_pages 3 forced pages exceed K = 4"},
		{"huge_forced_pages.json", "sink_pages 9223372036854775807 + local_pages 9223372036854775807 forced pages exceed K = 2"},
	} {
		code, stdout, stderr := runCLI(t, "replay", "--in", "../../replay/testdata/"+tc.file)
		if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s: exit %d, stdout %.100q, stderr %q; want exit 2, one line containing %q", tc.file, code, stdout, stderr, tc.want)
		}
	}
}

// TestReplayOutUncreatable: an --out that cannot be created is bad input,
// exit 2 with one line naming it, for replay as for replay gen (before,
// replay exited 1), and before the run; no file is left behind.
func TestReplayOutUncreatable(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "no-such-dir", "x.json")
	for _, args := range [][]string{
		{"replay", "--in", exampleCase, "--out", bad},
		{"replay", "gen", "--out", bad},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, "--out "+bad+": cannot create it") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stdout %.100q, stderr %q", args, code, stdout, stderr)
		}
	}
	// A run that fails after --out is created (here, cancelled) leaves no
	// file; one that succeeds leaves the result.
	out := filepath.Join(t.TempDir(), "result.json")
	if code, _, stderr := runCLICancelled(t, "replay", "--in", exampleCase, "--out", out); code != 1 {
		t.Fatalf("cancelled: exit %d, want 1: %s", code, stderr)
	}
	if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a failed run left --out %s: %v", out, err)
	}
	if code, _, stderr := runCLI(t, "replay", "--in", exampleCase, "--out", out); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if b, err := os.ReadFile(out); err != nil || !json.Valid(b) {
		t.Fatalf("--out %s: %v", out, err)
	}
}

// TestReplayReplicatedNeedsQuest: replicated selection with the oracle or
// recent selector is refused at any --cp, as demo refuses it (before,
// replay accepted it at --cp 1); quest and dense run.
func TestReplayReplicatedNeedsQuest(t *testing.T) {
	for _, cp := range []string{"1", "2"} {
		for _, sel := range []string{"oracle", "recent"} {
			code, stdout, stderr := runCLI(t, "replay", "--in", exampleCase, "--cp", cp, "--selection", "replicated", "--selector", sel)
			want := "questctl replay: --selection replicated: want --selector quest or dense, not " + sel + "\n"
			if code != 2 || stdout != "" || stderr != want {
				t.Errorf("--cp %s --selector %s: exit %d, stdout %.100q, stderr %q, want %q", cp, sel, code, stdout, stderr, want)
			}
		}
		for _, sel := range []string{"quest", "dense"} {
			if code, _, stderr := runCLI(t, "replay", "--in", exampleCase, "--cp", cp, "--selection", "replicated", "--selector", sel); code != 0 {
				t.Errorf("--cp %s --selector %s: exit %d: %s", cp, sel, code, stderr)
			}
		}
	}
}

// TestReplayAddrConnectBound: a node that accepts connections but never
// answers (as a TLS node does to a plaintext client) fails the command
// after the connect bound and the probe, not after the whole --timeout.
func TestReplayAddrConnectBound(t *testing.T) {
	addr := silentAddr(t)
	start := time.Now()
	code, _, stderr := runCLI(t, "replay", "--addr", addr, "--in", "../../examples/replay/case.json", "--timeout", "60s")
	took := time.Since(start)
	if code == 0 || !strings.Contains(stderr, addr) {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if took > connectTimeout+8*time.Second {
		t.Fatalf("took %v with --timeout 60s: the connect bound is %v", took, connectTimeout)
	}
	t.Logf("failed after %v: %s", took.Round(time.Millisecond), strings.TrimSpace(stderr))
}
