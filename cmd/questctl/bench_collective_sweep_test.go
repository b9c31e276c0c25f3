package main

import (
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/questrt/questrt/collective"
)

// TestBenchCollectiveBadSweeps: a factor below 2 (or above the limit),
// sizes out of range, --min-bytes above --max-bytes, a size that is not
// one and a flag of the selection given with a sweep are refused with one
// line naming the flag, before anything runs (no progress line, nothing
// on stdout).
func TestBenchCollectiveBadSweeps(t *testing.T) {
	big := fmt.Sprint(collective.MaxSweepBytes + 1)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--factor", "1"}, "--factor 1: want 2 to 1024"},
		{[]string{"--factor", "0"}, "--factor 0: want 2 to 1024"},
		{[]string{"--factor", "-2"}, "--factor -2: want 2 to 1024"},
		{[]string{"--factor", "1025"}, "--factor 1025: want 2 to 1024"},
		{[]string{"--factor", "1.5"}, "factor"},
		{[]string{"--min-bytes", "0"}, "--min-bytes 0: want 1 to 1073741824"},
		{[]string{"--min-bytes", "-1"}, "--min-bytes -1: want 1 to 1073741824"},
		{[]string{"--min-bytes", big}, "--min-bytes " + big + ": want 1 to 1073741824"},
		{[]string{"--max-bytes", "0"}, "--max-bytes 0: want 1 to 1073741824"},
		{[]string{"--max-bytes", "2G"}, "--max-bytes 2147483648: want 1 to 1073741824"},
		{[]string{"--min-bytes", "64", "--max-bytes", "8"}, "--min-bytes 64: want 1 to 8 (--max-bytes)"},
		{[]string{"--min-bytes", "1M"}, "--min-bytes 1048576: want 1 to 65536 (--max-bytes)"}, // above the --max-bytes below
		{[]string{"--min-bytes", "lots"}, "min-bytes"},
		{[]string{"--max-bytes", "1e400"}, "max-bytes"},
		{[]string{"--factor", "2", "--batch", "1"}, "--batch: not with a sweep"},
		{[]string{"--min-bytes", "8", "--k", "4"}, "--k: not with a sweep"},
		{[]string{"--factor", "2", "--steps", "0"}, "--steps 0: want 1 to"},
		{[]string{"--factor", "2", "--shards", "0"}, "--shards 0: want 1 to"},
		{[]string{"--factor", "2", "--max-bytes", "1G", "--shards", "1", "--max-memory", "1GiB"}, "more than the 1.0 GiB memory limit"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			args := []string{"bench", "collective", "--shards", "2", "--steps", "5", "--warmup", "1", "--max-bytes", "64K", "--json"}
			code, out, stderr := runCLI(t, append(args, c.args...)...)
			if code != exitUsage || out != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", code, out, stderr, c.want)
			}
		})
	}
}

// sweepLines decodes stdout's lines, which must all be sweep lines.
func sweepLines(t *testing.T, out string) []sweepLine {
	t.Helper()
	var res []sweepLine
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var r sweepLine
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("stdout line %q: %v", l, err)
		}
		if r.Kind != kindSweep {
			t.Fatalf("stdout line %q: kind %q, want %q", l, r.Kind, kindSweep)
		}
		res = append(res, r)
	}
	return res
}

// TestBenchCollectiveSweep: a sweep prints one line per (transport,
// shards, size) with nccl-tests' columns, and a table with them on
// stderr without --json.
func TestBenchCollectiveSweep(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "collective", "--transport", "inproc,grpc", "--shards", "2,4",
		"--min-bytes", "8", "--max-bytes", "32K", "--factor", "8", "--steps", "10", "--warmup", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	res := sweepLines(t, out)
	// Sizes 8, 64, 512, 4096, 32768 at 2 and 4 ranks, over both transports.
	if len(res) != 20 {
		t.Fatalf("%d lines, want 20:\n%s", len(res), out)
	}
	for i, r := range res {
		tr, n, size := "inproc", 2, int64(8)<<(3*(i%5))
		if i >= 10 {
			tr = "grpc"
		}
		if i%10 >= 5 {
			n = 4
		}
		if r.Op != "allgather" || r.Transport != tr || r.Shards != n || r.Bytes != size || r.MsgBytes != size/int64(n) ||
			r.Steps != 10 || r.SentBytes != int64(n-1)*size || r.SentMsgs != int64(n*(n-1)) {
			t.Errorf("line %d: %+v; want %s, %d ranks, %d bytes", i, r.SweepResult, tr, n, size)
		}
		alg := float64(r.Bytes) / r.TimeUS / 1e3
		if r.TimeUS <= 0 || math.Abs(r.AlgBW-alg) > 1e-9*alg || math.Abs(r.BusBW-alg*float64(n-1)/float64(n)) > 1e-9*alg {
			t.Errorf("line %d: time %v us, algbw %v, busbw %v; want %v and (n-1)/n of it", i, r.TimeUS, r.AlgBW, r.BusBW, alg)
		}
	}
	for _, col := range []string{"size (B)", "time (us)", "algbw GB/s", "busbw GB/s"} {
		if !strings.Contains(stderr, col) {
			t.Errorf("stderr lacks the column %q:\n%s", col, stderr)
		}
	}
	if strings.Contains(stderr, "{") {
		t.Errorf("JSON on stderr:\n%s", stderr)
	}
}

// TestBenchCollectiveMetadata: every line, of either kind, carries the
// host, the build, the transport and its TLS setting; a test binary has
// no VCS stamp, so the commit is "unknown".
func TestBenchCollectiveMetadata(t *testing.T) {
	var lines []benchMeta
	_, out, stderr := runCLI(t, "bench", "collective", "--shards", "2", "--batch", "1", "--steps", "5", "--transport", "inproc,grpc", "--json")
	for _, l := range collectiveLines(t, out) {
		if l.BaselineP50 <= 0 || l.OverheadVsBaseline <= 0 || l.BaselineBytes != l.SelectBytes || l.PingPongP50 <= 0 {
			t.Errorf("%s line without its baseline: %+v", l.Transport, l.BenchResult)
		}
		lines = append(lines, l.benchMeta)
	}
	_, out, stderr2 := runCLI(t, "bench", "collective", "--shards", "2", "--factor", "2", "--max-bytes", "16", "--steps", "5", "--json")
	for _, l := range sweepLines(t, out) {
		lines = append(lines, l.benchMeta)
	}
	if len(lines) != 2+2 {
		t.Fatalf("%d lines; stderr %s%s", len(lines), stderr, stderr2)
	}
	for i, m := range lines {
		h := m.Host
		if h.CPU == "" || h.Cores != runtime.NumCPU() || h.Kernel == "" || !strings.HasPrefix(h.Kernel, runtime.GOOS) {
			t.Errorf("line %d: host %+v", i, h)
		}
		if runtime.GOOS == "linux" && (len(h.LoadAvg) != 3 || h.CPU == "unknown") {
			t.Errorf("line %d: host %+v, want the load average and the CPU model on Linux", i, h)
		}
		if m.GoVersion != runtime.Version() || m.Version == "" || m.Commit != "unknown" || m.TLS {
			t.Errorf("line %d: %+v", i, m)
		}
	}
	js := out[:strings.IndexByte(out, '\n')]
	for _, key := range []string{`"host":{"cpu":`, `"cores":`, `"load_avg":`, `"kernel":`, `"go_version":`, `"questrt_version":`, `"commit":`, `"tls":false`, `"transport":"inproc"`} {
		if !strings.Contains(js, key) {
			t.Errorf("line %s lacks %s", js, key)
		}
	}
}

// TestBenchCollectiveHelpSweep: --help explains the baseline, the sweep
// flags and the metadata.
func TestBenchCollectiveHelpSweep(t *testing.T) {
	_, out, _ := runCLI(t, "bench", "collective", "--help")
	for _, s := range []string{"-min-bytes", "-max-bytes", "-factor", "overhead_vs_baseline", "algbw", "busbw", "nccl-tests", "commit", "load average"} {
		if !strings.Contains(out, s) {
			t.Errorf("--help lacks %q", s)
		}
	}
}
