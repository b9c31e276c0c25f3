//go:build unix

package main

import (
	"bytes"
	"os/exec"
	"testing"
)

// TestBenchCollectiveNodesSweep: a sweep with --nodes runs every rank in
// its own process and prints the lines goroutines print, with
// "processes"; the selection lines of --nodes carry their baseline.
func TestBenchCollectiveNodesSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("builds questctl and starts processes")
	}
	bin := buildQuestctl(t)
	run := func(args ...string) (string, string) {
		cmd := exec.Command(bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	out, stderr := run("bench", "collective", "--transport", "grpc", "--nodes", "2,3", "--min-bytes", "1K", "--max-bytes", "64K", "--factor", "8", "--steps", "10", "--json")
	res := sweepLines(t, out)
	if len(res) != 6 {
		t.Fatalf("%d lines, want 3 sizes at 2 and 3 processes:\n%s", len(res), out)
	}
	for i, r := range res {
		n := 2 + i/3
		m := int64(1024<<(3*(i%3))) / int64(n)
		if r.Processes != n || r.Shards != n || r.MsgBytes != m || r.SentBytes != int64(n*(n-1))*m || r.TimeUS <= 0 || r.BusBW <= 0 {
			t.Errorf("line %d: %+v; want %d processes, %d-byte messages", i, r.SweepResult, n, m)
		}
	}
	pids := rankPIDs(t, stderr)
	if len(pids) != 5 {
		t.Errorf("stderr names %d child pids, want 5:\n%s", len(pids), stderr)
	}
	checkGone(t, pids)

	out, _ = run("bench", "collective", "--transport", "grpc", "--nodes", "3", "--batch", "1", "--steps", "10", "--pages", "64", "--k", "8", "--json")
	for _, l := range collectiveLines(t, out) {
		if l.Processes != 3 || l.BaselineP50 <= 0 || l.BaselineBytes != l.SelectBytes || l.MergeBaselineBytes != l.MergeBytes || l.PingPongP50 <= 0 {
			t.Errorf("--nodes line without its baseline: %+v", l.BenchResult)
		}
	}
}
