package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{gen("--budget", "1"), 2}, // below one page
		{gen("--budget", replayHuge), 0},
		{gen("--sink-pages", "0"), 0},
		{gen("--sink-pages", "-1"), 2},
		{gen("--sink-pages", "1"), 0},
		{gen("--sink-pages", replayHuge), 0},
		{gen("--local-pages", "0"), 0},
		{gen("--local-pages", "-1"), 2},
		{gen("--local-pages", "1"), 0},
		{gen("--local-pages", replayHuge), 0},
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
		{"../../replay/testdata/valid/zero_reference.json", "10000", "at most --cp 2"},
		{exampleCase, "10000", "at most --cp 16"},
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
// a small --max-memory.
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

// TestReplayDtypeNeedsCUDA: --dtype on the CPU backend is a usage error,
// as in demo (before, it was ignored).
func TestReplayDtypeNeedsCUDA(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "--in", exampleCase, "--dtype", "f16"},
		{"replay", "--in", exampleCase, "--dtype", "f32", "--backend", "cpu"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, "--dtype needs --backend cuda") || strings.Count(stderr, "\n") != 1 {
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
