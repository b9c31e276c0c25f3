package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// small is a bench offload run that takes well under a second.
var offloadSmall = []string{"bench", "offload", "--context", "2048", "--q-heads", "4", "--kv-heads", "2", "--head-dim", "16",
	"--budget", "256", "--steps", "4", "--warmup", "2"}

// TestBenchOffloadConventions: --help on stdout (exit 0), an unknown flag
// one line on stderr naming it (exit 2), as TestHelpAndErrorStreams
// checks for the other commands.
func TestBenchOffloadConventions(t *testing.T) {
	code, stdout, stderr := runCLI(t, "bench", "offload", "--help")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: questctl bench offload") || !strings.Contains(stdout, "Flags:") {
		t.Errorf("--help: exit %d, stderr %q, stdout starts %.60q", code, stderr, stdout)
	}
	code, stdout, stderr = runCLI(t, "bench", "offload", "--no-such-flag")
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no-such-flag") {
		t.Errorf("--no-such-flag: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, "bench", "--help")
	if code != 0 || !strings.Contains(stdout, "offload") {
		t.Errorf("bench --help does not list offload: %q", stdout)
	}
}

// TestBenchOffloadBadFlags: every bad setting exits 2 with one line on
// stderr that names its flag, before anything runs.
func TestBenchOffloadBadFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--device-budget", "0"}, "--device-budget"},
		{[]string{"--device-budget", "101"}, "--device-budget"},
		{[]string{"--device-budget", "50,x"}, "--device-budget"},
		{[]string{"--workload", "slow,fast"}, "--workload"},
		{[]string{"--workload", ""}, "--workload"},
		{[]string{"--prefetch", "-1"}, "--prefetch"},
		{[]string{"--prefetch", "1000000"}, "--prefetch"},
		{[]string{"--context", "0"}, "--context"},
		{[]string{"--context", "99999999999"}, "--context"},
		{[]string{"--budget", "8"}, "--budget"},
		{[]string{"--page-size", "0"}, "--page-size"},
		{[]string{"--q-heads", "3", "--kv-heads", "2"}, "--q-heads"},
		{[]string{"--kv-heads", "0"}, "--kv-heads"},
		{[]string{"--head-dim", "-1"}, "--head-dim"},
		{[]string{"--steps", "0"}, "--steps"},
		{[]string{"--warmup", "-1"}, "--warmup"},
		{[]string{"--eviction", "fifo"}, "--eviction"},
		{[]string{"--tier", "tape"}, "--tier"},
		{[]string{"--tier-dir", dir}, "--tier-dir"},
		{[]string{"--tier", "disk", "--tier-dir", file}, "--tier-dir"},
		{[]string{"--tier", "host+disk", "--tier-dir", file}, "--tier-dir"},
		{[]string{"--tier", "host+disk", "--host-budget", "0"}, "--host-budget"},
		{[]string{"--tier", "host+disk", "--host-budget", "101"}, "--host-budget"},
		{[]string{"--tier", "host+disk", "--host-budget", "x"}, "host-budget"},
		{[]string{"--host-budget", "50"}, "--host-budget"},
		{[]string{"--tier", "disk", "--host-budget", "50"}, "--host-budget"},
		{[]string{"--max-memory", "1MiB"}, "memory limit"}, // as the other benchmarks' preflight says it
		{[]string{"--json=maybe"}, "json"},
	} {
		code, stdout, stderr := runCLI(t, append(append([]string(nil), offloadSmall...), tc.args...)...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.flag) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want exit 2 and one line naming %s)", tc.args, code, stdout, stderr, tc.flag)
		}
	}
}

// TestBenchOffloadRun: a small sweep prints one JSON line per
// configuration with the documented fields; recall is exact (max_abs_diff
// 0) where a step fits the device budget, the full budget hits every
// page, and the disk tier's temporary directory is removed afterwards.
func TestBenchOffloadRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a small benchmark")
	}
	dir := t.TempDir()
	spillKeys := []string{"host_budget_pct", "host_pages", "host_slots", "disk_slots", "spills", "spilled_bytes", "spill_errors", "spills_per_step", "host_reads_per_step", "disk_reads_per_step"}
	for _, tr := range [][]string{{"--tier", "memory"}, {"--tier", "disk", "--tier-dir", dir}, {"--tier", "host+disk", "--tier-dir", dir, "--host-budget", "30"}} {
		args := append(append([]string(nil), offloadSmall...), "--device-budget", "100,20,5", "--workload", "slow,random", "--prefetch", "0,4", "--json")
		code, stdout, stderr := runCLI(t, append(args, tr...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tr, code, stderr)
		}
		var n int
		sc := bufio.NewScanner(strings.NewReader(stdout))
		for sc.Scan() {
			var r map[string]any
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			for _, k := range []string{"device_budget_pct", "workload", "prefetch", "step_us", "resident_step_us", "hit_rate", "h2d_bytes_per_step", "max_abs_diff", "stall_us", "prefetch_hits_per_step", "prefetch_wasted_per_step"} {
				if _, ok := r[k]; !ok {
					t.Fatalf("line without %s: %s", k, sc.Text())
				}
			}
			if r["tier"] != tr[1] {
				t.Fatalf("tier %v, want %s", r["tier"], tr[1])
			}
			for _, k := range spillKeys {
				if _, ok := r[k]; ok != (tr[1] == "host+disk") {
					t.Fatalf("--tier %s: has %s: %v: %s", tr[1], k, ok, sc.Text())
				}
			}
			if tr[1] == "host+disk" {
				// 2048 tokens: 128 pages, 30% of them (38) in host memory.
				// The pages evicted from the device (all but the device
				// budget's) were written to the tier: those beyond 38
				// spilled.
				hostPages, hostSlots, diskSlots := r["host_pages"].(float64), r["host_slots"].(float64), r["disk_slots"].(float64)
				if r["host_budget_pct"].(float64) != 30 || hostPages != 38 || hostSlots > hostPages {
					t.Fatalf("host budget: %s", sc.Text())
				}
				if r["device_budget_pct"].(float64) < 100 && (diskSlots == 0 || r["spills"].(float64) < diskSlots) {
					t.Fatalf("no spill to disk with a %v%% device budget: %s", r["device_budget_pct"], sc.Text())
				}
				if r["spill_errors"].(float64) != 0 || r["spilled_bytes"].(float64) != r["spills"].(float64)*2*2*16*16*4 { // K and V x 2 KV heads x S 16 x D 16 x float32
					t.Fatalf("spill counters: %s", sc.Text())
				}
			}
			if r["passes_per_step"].(float64) == 1 && r["max_abs_diff"].(float64) != 0 {
				t.Fatalf("a single-pass configuration differs from the resident step: %s", sc.Text())
			}
			if r["device_budget_pct"].(float64) == 100 && r["hit_rate"].(float64) != 1 {
				t.Fatalf("the full budget missed: %s", sc.Text())
			}
			n++
		}
		if n != 3*2*2 {
			t.Fatalf("%d JSON lines, want 12", n)
		}
		if strings.Contains(stderr, "| context |") {
			t.Fatal("--json printed the table")
		}
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("the disk tier left %v (%v)", ents, err)
	}
	code, _, stderr := runCLI(t, append(append([]string(nil), offloadSmall...), "--device-budget", "50", "--workload", "slow", "--prefetch", "2")...)
	if code != 0 || !strings.Contains(stderr, "| context |") || !strings.Contains(stderr, "| 2048 | slow | 50%") {
		t.Fatalf("table: exit %d, stderr %s", code, stderr)
	}
}

// FuzzBenchOffload is FuzzCLI for bench offload: no argument list may
// panic, exit with anything but 0, 1 or 2, or allocate much beyond the
// --max-memory preflight; the context is cancelled, so what runs is
// parsing, validation and preflight.
//
//	go test -run '^$' -fuzz FuzzBenchOffload -fuzztime 60s ./cmd/questctl/
func FuzzBenchOffload(f *testing.F) {
	for _, seed := range []string{
		"--context 100000000",
		"--context 65536 --device-budget 100,50,20,10,5 --workload slow,random --prefetch 0,32 --tier memory --json",
		"--context 65536 --tier disk",
		"--context 65536 --device-budget 10 --tier host+disk --host-budget 50 --json",
		"--tier host+disk --host-budget 0",
		"--device-budget 0,,5 --prefetch -3",
		"--workload  --tier ",
		"--page-size 0 --head-dim 99999 --q-heads 7",
		"--context 4096 --budget 256 --steps 1 --warmup 0 --eviction score",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		var args []string
		if line != "" {
			args = strings.Split(line, " ")
		}
		for _, a := range args {
			// No reads or writes outside the test's directories.
			if strings.Contains(a, "dir") || strings.Contains(a, "/") || strings.HasSuffix(a, "=-") || a == "-" {
				return
			}
		}
		args = append(append([]string{"bench", "offload"}, args...), "--max-memory", "64MiB")
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		code := run(ctx, args, io.Discard, io.Discard)
		runtime.ReadMemStats(&after)
		if code < 0 || code > 2 {
			t.Fatalf("%q: exit %d", line, code)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 4*fuzzLimit {
			t.Fatalf("%q: allocated %d MiB under a %d MiB limit", line, grew>>20, fuzzLimit>>20)
		}
	})
}

// TestBenchOffloadBackendFlags: --kv-cache-dtype and --tier disk are
// refused where they cannot apply, naming the flag, before anything runs.
func TestBenchOffloadBackendFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kv-cache-dtype", "f16"}, "--kv-cache-dtype needs --backend cuda"},
		{[]string{"--backend", "cuda", "--tier", "disk"}, "--tier disk needs --backend cpu"},
		{[]string{"--backend", "cuda", "--tier", "host+disk"}, "--tier host+disk needs --backend cpu"},
		{[]string{"--backend", "tpu"}, `--backend "tpu": want cpu or cuda`},
	} {
		code, _, stderr := runCLI(t, append([]string{"bench", "offload"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("bench offload %v: exit %d\n%s\nwant exit 2 and %q", c.args, code, stderr, c.want)
		}
	}
}
