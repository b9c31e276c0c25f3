package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchSelectionBadFlags: every numeric flag at 0, -1 and huge values
// is a one-line usage error (--kv-heads 0 and --page-size 0 divided by
// zero, --head-dim -1 panicked in make, huge contexts ran out of memory).
func TestBenchSelectionBadFlags(t *testing.T) {
	bad := benchNumericBadFlags(map[string]string{
		"--cp": "2", "--context": "", "--budget": "", "--page-size": "", "--q-heads": "",
		"--kv-heads": "", "--head-dim": "", "--steps": "",
	})
	bad = append(bad,
		benchBadFlag{[]string{"--kv-heads", "0"}, "--kv-heads 0:"},
		benchBadFlag{[]string{"--page-size", "0"}, "--page-size 0:"},
		benchBadFlag{[]string{"--head-dim", "-1"}, "--head-dim -1:"},
		benchBadFlag{[]string{"--context", "100000000"}, "does not fit in memory"},
		benchBadFlag{[]string{"--context", "100000000", "--max-memory", "100GiB"}, "--context 100000000"},
		benchBadFlag{[]string{"--steps", "1000000", "--head-dim", "4096", "--q-heads", "1024", "--kv-heads", "1024"}, "does not fit in memory"},
		benchBadFlag{[]string{"--budget", "15"}, "--budget"},
		benchBadFlag{[]string{"--q-heads", "6", "--kv-heads", "4"}, "--kv-heads"},
		benchBadFlag{[]string{"--max-memory", "-2"}, "max-memory"},
		benchBadFlag{[]string{"--max-memory", "99999PiB"}, "max-memory"},
		benchBadFlag{[]string{"--max-memory", "1KiB"}, "memory limit"},
		benchBadFlag{[]string{"--cp", "2,x"}, "--cp"},
		benchBadFlag{[]string{"--selection", "all"}, "--selection"},
		benchBadFlag{[]string{"--steps", "99999999999999999999"}, "steps"},
	)
	checkBenchBadFlags(t, []string{"bench", "selection"}, bad)
}

type benchSelectionLine struct {
	CP       int     `json:"cp"`
	Mode     string  `json:"selection"`
	StepUS   float64 `json:"step_us"`
	ScoreUS  float64 `json:"score_us"`
	SelectUS float64 `json:"select_us"`
	MergeUS  float64 `json:"merge_us"`
	Steps    int     `json:"steps"`
}

// TestBenchSelectionTiny: a tiny run prints one valid JSON line per
// (cp, mode) with non-zero phase times, under a small --max-memory.
func TestBenchSelectionTiny(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "selection", "--cp", "2", "--context", "1024", "--budget", "128",
		"--q-heads", "4", "--kv-heads", "2", "--head-dim", "16", "--steps", "2", "--json", "--max-memory", "64MiB")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 JSON lines, got %q", out)
	}
	for i, l := range lines {
		var r benchSelectionLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		if want := []string{"exact", "union", "replicated"}[i]; r.CP != 2 || r.Mode != want || r.Steps != 2 {
			t.Errorf("line %d: %s, want cp 2 %s", i, l, want)
		}
		if !(r.StepUS > 0 && r.ScoreUS > 0 && r.MergeUS > 0) || (r.Mode == "exact" && !(r.SelectUS > 0)) {
			t.Errorf("zero phase time: %s", l)
		}
	}
}

// TestBenchSelectionStreams: each (cp, mode) line is written, whole, as
// soon as it is measured, before the next engine is set up, with progress
// on stderr, --json or not.
func TestBenchSelectionStreams(t *testing.T) {
	for _, extra := range [][]string{nil, {"--json"}} {
		args := append([]string{"bench", "selection", "--cp", "2,3", "--selection", "exact,union", "--context", "512",
			"--budget", "64", "--q-heads", "4", "--kv-heads", "2", "--head-dim", "16", "--steps", "1"}, extra...)
		w := runBenchStreaming(t, args...)
		if len(w.writes) != 4 {
			t.Fatalf("%v: %d writes, want 4: %q", extra, len(w.writes), w.writes)
		}
		for i, cfg := range []string{"cp 2 exact", "cp 2 union", "cp 3 exact", "cp 3 union"} {
			if !strings.Contains(w.before[i], "bench selection: "+cfg+": filling") {
				t.Errorf("%v: line %d (%s) before its setup was reported:\n%s", extra, i, cfg, w.before[i])
			}
			if n := strings.Count(w.before[i], ": filling"); n != i+1 {
				t.Errorf("%v: line %d (%s) written after %d setups:\n%s", extra, i, cfg, n, w.before[i])
			}
		}
	}
}
