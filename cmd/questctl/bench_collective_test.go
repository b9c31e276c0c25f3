package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
)

// collectiveQuick keeps a wrongly accepted flag from running the full benchmark: the
// flag under test comes after it and wins.
var collectiveQuick = []string{"bench", "collective", "--shards", "2", "--batch", "1", "--steps", "5", "--warmup", "1", "--json"}

// TestBenchCollectiveBadFlags: every numeric flag at 0, -1 and a huge
// value is a usage error (exit 2) of exactly one line on stderr that names
// the flag, with nothing on stdout.
func TestBenchCollectiveBadFlags(t *testing.T) {
	type tc struct {
		args []string
		want string // in the stderr line
	}
	var cases []tc
	ranges := []struct {
		flag string
		min  int // the smallest allowed value
		max  int
	}{
		{"shards", 1, collective.MaxBenchShards},
		{"batch", 1, collective.MaxBenchBatch},
		{"steps", 1, collective.MaxBenchSteps},
		{"warmup", 0, collective.MaxBenchSteps},
		{"kv-heads", 1, collective.MaxBenchHeads},
		{"q-heads", 1, collective.MaxBenchHeads},
		{"head-dim", 1, collective.MaxBenchHeadDim},
		{"k", 1, 8192}, // the default --pages
		{"pages", 1, collective.MaxBenchPages},
	}
	for _, r := range ranges {
		for _, v := range []string{"0", "-1", "100000", "1000000000", "9223372036854775807"} {
			n := 0
			fmt.Sscan(v, &n)
			if n >= r.min && n <= r.max {
				continue // in range: --warmup 0
			}
			cases = append(cases, tc{[]string{"--" + r.flag, v}, fmt.Sprintf("--%s %s: want %d to %d", r.flag, v, r.min, r.max)})
		}
		// Not an int64, or not a number: the flag parser's error.
		cases = append(cases,
			tc{[]string{"--" + r.flag, "99999999999999999999"}, r.flag},
			tc{[]string{"--" + r.flag, "1e9"}, r.flag})
	}
	cases = append(cases,
		tc{[]string{"--shards", "2,0"}, "--shards 0: want 1 to 1024"},
		tc{[]string{"--shards", "2,,3"}, "--shards"},
		tc{[]string{"--batch", ""}, "--batch"},
		tc{[]string{"--pages", "64", "--k", "65"}, "--k 65: want 1 to 64 (--pages)"},
		tc{[]string{"--max-memory", "-2"}, "max-memory"},
		tc{[]string{"--max-memory", "1e30"}, "max-memory"},
		// Every size in range, but more than the limit.
		tc{[]string{"--shards", "1024", "--batch", "64", "--k", "8192", "--max-memory", "1GiB"}, "more than the 1.0 GiB memory limit"},
	)
	if _, err := memlimit.Available(); err == nil {
		// Petabytes, more than any machine has (--max-memory 0, the
		// default: where the available memory is unknown, only overflows
		// are refused).
		cases = append(cases, tc{[]string{"--batch", "4096", "--q-heads", "1024", "--head-dim", "16384"}, "does not fit in memory"})
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			code, out, stderr := runCLI(t, append(append([]string{}, collectiveQuick...), c.args...)...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d; stderr %q", code, exitUsage, stderr)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
				t.Errorf("stderr %q, want exactly one line", stderr)
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("stderr %q lacks %q", stderr, c.want)
			}
		})
	}
}

// collectiveLines decodes stdout's lines, which must all be JSON results
// of the selection and merge ("kind": "collective").
func collectiveLines(t *testing.T, out string) []collectiveLine {
	t.Helper()
	var res []collectiveLine
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var r collectiveLine
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("stdout line %q: %v", l, err)
		}
		if r.Kind != kindCollective {
			t.Fatalf("stdout line %q: kind %q, want %q", l, r.Kind, kindCollective)
		}
		res = append(res, r)
	}
	return res
}

func TestBenchCollectiveJSONLines(t *testing.T) {
	for _, asJSON := range []bool{true, false} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			args := []string{"bench", "collective", "--shards", "2,3", "--batch", "1,2", "--steps", "5"}
			if asJSON {
				args = append(args, "--json")
			}
			code, out, stderr := runCLI(t, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			res := collectiveLines(t, out)
			want := [][2]int{{2, 1}, {2, 2}, {3, 1}, {3, 2}}
			if len(res) != len(want) {
				t.Fatalf("%d lines, want one per configuration: %q", len(res), out)
			}
			for i, r := range res {
				if r.Shards != want[i][0] || r.Batch != want[i][1] || r.Steps != 5 || r.SelectP50 <= 0 || r.MergeP50 <= 0 {
					t.Errorf("line %d: %+v, want shards %d batch %d, 5 steps, positive latencies", i, r, want[i][0], want[i][1])
				}
			}
			switch {
			case asJSON && (strings.Count(stderr, "\n") != len(want) || strings.Contains(stderr, "{")):
				t.Errorf("--json: stderr %q, want one progress line per configuration and no JSON", stderr)
			case !asJSON:
				// Progress as each configuration starts, a table line as
				// it ends, and the total time.
				if got := strings.Count(stderr, "\n"); got != 2*len(want)+1 {
					t.Errorf("stderr has %d lines, want %d:\n%s", got, 2*len(want)+1, stderr)
				}
				if strings.Contains(stderr, "{") {
					t.Errorf("JSON on stderr:\n%s", stderr)
				}
			}
		})
	}
}

// cancelOnFirstWrite cancels a context at its first write, as a reader that
// stops after the first line would.
type cancelOnFirstWrite struct {
	bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelOnFirstWrite) Write(p []byte) (int, error) {
	w.cancel()
	return w.Buffer.Write(p)
}

// TestBenchCollectiveStreams: each configuration's line reaches stdout as
// soon as it is measured: the first line is written while the second
// configuration has not run (cancelling then stops the command before it).
func TestBenchCollectiveStreams(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOnFirstWrite{cancel: cancel}
	var stderr bytes.Buffer
	code := run(ctx, []string{"bench", "collective", "--shards", "2,3", "--batch", "1", "--steps", "5", "--json"}, out, &stderr)
	if code != exitFailure || !strings.Contains(stderr.String(), "context canceled") {
		t.Errorf("exit %d, stderr %q; want %d and the cancellation", code, stderr.String(), exitFailure)
	}
	if res := collectiveLines(t, out.String()); len(res) != 1 || res[0].Shards != 2 {
		t.Errorf("stdout %q, want the first configuration's line only", out.String())
	}
}
