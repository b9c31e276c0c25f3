package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// benchBadFlag is one flag value a benchmark must refuse: exit 2, one stderr
// line that contains want, nothing on stdout, no panic, and fast (before
// any allocation or measurement).
type benchBadFlag struct {
	args []string
	want string
}

// benchNumericBadFlags returns, for each numeric flag, its value at 0, -1 and
// a huge number (lists get the bad value after a good one).
func benchNumericBadFlags(flags map[string]string) []benchBadFlag {
	var out []benchBadFlag
	for flag, good := range flags {
		for _, v := range []string{"0", "-1", "99999999999", "1099511627776"} {
			val := v
			if good != "" {
				val = good + "," + v
			}
			out = append(out, benchBadFlag{[]string{flag, val}, flag})
		}
	}
	return out
}

// checkBenchBadFlags runs every case of bad after cmd and checks that it is a
// fast one-line usage error.
func checkBenchBadFlags(t *testing.T, cmd []string, bad []benchBadFlag) {
	t.Helper()
	for _, c := range bad {
		args := append(append([]string{}, cmd...), c.args...)
		var code int
		var stdout, stderr string
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%v: panic: %v", args, p)
				}
			}()
			// A cancelled context: a configuration that is not refused
			// starts and fails with exit 1, not with the refusal.
			code, stdout, stderr = runCLICancelled(t, args...)
		}()
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2, one stderr line containing %q and no stdout", args, code, stdout, stderr, c.want)
		}
	}
}

// TestBenchAttentionBadFlags: every numeric flag at 0, -1 and huge values
// is a one-line usage error (the context 1e8 crashed the Go runtime out
// of memory; zeros and negatives reached the benchmark).
func TestBenchAttentionBadFlags(t *testing.T) {
	bad := benchNumericBadFlags(map[string]string{
		"--context": "4096", "--budget": "2048", "--batch": "1",
		"--page-size": "", "--q-heads": "", "--kv-heads": "", "--head-dim": "", "--iters": "",
	})
	bad = append(bad,
		benchBadFlag{[]string{"--context", "100000000"}, "does not fit in memory"},
		benchBadFlag{[]string{"--context", "100000000", "--max-memory", "100GiB"}, "--context 100000000"},
		benchBadFlag{[]string{"--context", "1073741824", "--page-size", "1", "--batch", "4"}, "--batch"},
		benchBadFlag{[]string{"--batch", "4096"}, "does not fit in memory"},
		benchBadFlag{[]string{"--head-dim", "4096", "--kv-heads", "1024", "--q-heads", "1024"}, "does not fit in memory"},
		benchBadFlag{[]string{"--budget", "15"}, "--budget"},
		benchBadFlag{[]string{"--q-heads", "6", "--kv-heads", "4"}, "--kv-heads"},
		benchBadFlag{[]string{"--max-memory", "-2"}, "max-memory"},
		benchBadFlag{[]string{"--max-memory", "99999PiB"}, "max-memory"},
		benchBadFlag{[]string{"--max-memory", "1KiB"}, "memory limit"},
		benchBadFlag{[]string{"--context", "abc"}, "--context"},
		benchBadFlag{[]string{"--head-dim", "99999999999999999999"}, "head-dim"},
		benchBadFlag{[]string{"--kv-cache-dtype", "f32"}, "--kv-cache-dtype needs --backend cuda (the CPU backend stores float32)"},
		benchBadFlag{[]string{"--backend", "cpu", "--kv-cache-dtype", "bf16"}, "--kv-cache-dtype needs --backend cuda"},
		benchBadFlag{[]string{"--kv-cache-dtype", "fp8"}, `--kv-cache-dtype "fp8": want f32, f16 or bf16 (fp8: bench decode only)`},
		benchBadFlag{[]string{"--cuda-kernels", "attend=x"}, "--cuda-kernels needs --backend cuda"},
	)
	checkBenchBadFlags(t, []string{"bench", "attention"}, bad)
}

type benchAttentionLine struct {
	Context      int     `json:"context"`
	PageSize     int     `json:"page_size"`
	Budget       int     `json:"budget"`
	Pages        int     `json:"pages"`
	KPages       int     `json:"k_pages"`
	BudgetCapped bool    `json:"budget_capped"`
	DenseUS      float64 `json:"dense_us"`
	QuestUS      float64 `json:"quest_us"`
	PhasedUS     float64 `json:"phased_us"`
	ScoreUS      float64 `json:"score_us"`
	TopKUS       float64 `json:"topk_us"`
	AttendUS     float64 `json:"attend_us"`
	RhoFormula   float64 `json:"rho_formula"`
	RhoMeasured  float64 `json:"rho_measured"`
}

// TestBenchAttentionTiny: a tiny CPU run prints valid JSON lines whose
// phase times are not 0 (they were 0 since the fused step), and a budget
// above the context is capped, says so, and keeps rho_formula <= 1 + 1/S.
func TestBenchAttentionTiny(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "attention", "--context", "1024", "--budget", "128,4096",
		"--q-heads", "4", "--kv-heads", "2", "--head-dim", "32", "--iters", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got %q", out)
	}
	var rs []benchAttentionLine
	for _, l := range lines {
		var r benchAttentionLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		rs = append(rs, r)
	}
	r := rs[0]
	if r.Budget != 128 || r.BudgetCapped || r.Pages != 64 || r.KPages != 8 {
		t.Errorf("first line: %+v", r)
	}
	for name, v := range map[string]float64{"dense_us": r.DenseUS, "quest_us": r.QuestUS, "phased_us": r.PhasedUS,
		"score_us": r.ScoreUS, "topk_us": r.TopKUS, "attend_us": r.AttendUS} {
		if !(v > 0) {
			t.Errorf("%s = %v, want > 0: %s", name, v, lines[0])
		}
	}
	r = rs[1]
	if r.Budget != 4096 || !r.BudgetCapped || r.KPages != r.Pages || r.RhoFormula > 1+1.0/16 || r.RhoMeasured != 1 {
		t.Errorf("budget above the context: %s", lines[1])
	}
	if !strings.Contains(stderr, "K capped at P = 64 pages") {
		t.Errorf("the table does not say the budget was capped:\n%s", stderr)
	}
}

// benchStreamRecorder is a stdout that records, at each Write, what stderr held
// then.
type benchStreamRecorder struct {
	stderr *bytes.Buffer
	writes []string // what each Write wrote
	before []string // stderr at that Write
}

func (w *benchStreamRecorder) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	w.before = append(w.before, w.stderr.String())
	return len(p), nil
}

func runBenchStreaming(t *testing.T, args ...string) *benchStreamRecorder {
	t.Helper()
	var stderr bytes.Buffer
	w := &benchStreamRecorder{stderr: &stderr}
	if code := run(context.Background(), args, w, &stderr); code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
	}
	for i, s := range w.writes {
		if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") || !json.Valid([]byte(s)) {
			t.Errorf("write %d is not one JSON line: %q", i, s)
		}
	}
	return w
}

// TestBenchAttentionStreams: each line is written, whole, as soon as its
// configuration is measured (before the next one is set up), with
// progress on stderr, --json or not.
func TestBenchAttentionStreams(t *testing.T) {
	for _, extra := range [][]string{nil, {"--json"}} {
		args := append([]string{"bench", "attention", "--context", "512,1024", "--budget", "64",
			"--q-heads", "4", "--kv-heads", "2", "--head-dim", "16", "--iters", "1"}, extra...)
		w := runBenchStreaming(t, args...)
		if len(w.writes) != 2 {
			t.Fatalf("%v: %d writes, want 2: %q", extra, len(w.writes), w.writes)
		}
		if !strings.Contains(w.before[0], "filling 1 x 512 tokens") || strings.Contains(w.before[0], "filling 1 x 1024 tokens") {
			t.Errorf("%v: the first line came after the second configuration started; stderr then:\n%s", extra, w.before[0])
		}
		if !strings.Contains(w.before[1], "filling 1 x 1024 tokens") {
			t.Errorf("%v: no progress on stderr before the second line:\n%s", extra, w.before[1])
		}
	}
}
