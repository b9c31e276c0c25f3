package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchCollectiveGRPC: --transport inproc,grpc runs the same
// configurations over both transports and prints one JSON line per
// (transport, shards, batch), with the same bytes on the wire; an unknown
// transport is a one-line usage error.
func TestBenchCollectiveGRPC(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "collective", "--transport", "inproc,grpc", "--shards", "2,3", "--batch", "1",
		"--steps", "10", "--warmup", "2", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	type line struct {
		Transport   string  `json:"transport"`
		Shards      int     `json:"shards"`
		SelectP50   float64 `json:"select_p50_us"`
		SelectBytes int     `json:"select_bytes"`
		MergeBytes  int     `json:"merge_bytes"`
	}
	var got []line
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r line
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%v: %q", err, l)
		}
		got = append(got, r)
	}
	if len(got) != 4 || got[0].Transport != "inproc" || got[2].Transport != "grpc" {
		t.Fatalf("want inproc then grpc lines for 2 and 3 shards: %+v", got)
	}
	for i := range 2 {
		a, b := got[i], got[i+2]
		if a.Shards != b.Shards || a.SelectBytes != b.SelectBytes || a.MergeBytes != b.MergeBytes || b.SelectP50 <= 0 {
			t.Errorf("inproc %+v vs grpc %+v: the same exchange should move the same bytes", a, b)
		}
	}
	code, stdout, stderr := runCLI(t, "bench", "collective", "--transport", "tcp")
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "--transport") {
		t.Fatalf("--transport tcp: exit %d, %q, %q", code, stdout, stderr)
	}
}
