package localgroup

import (
	"context"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/grpctransport"
)

// TestBenchTransports: the same configurations over inproc and grpc move
// the same bytes, one result per (shards, batch) each, named by their
// transport; an unknown transport is refused before anything runs.
func TestBenchTransports(t *testing.T) {
	ctx := context.Background()
	c := collective.DefaultBenchConfig()
	c.Shards, c.Batches, c.Steps, c.Warmup = []int{2, 3}, []int{1}, 5, 1
	c.Pages, c.PageBudget = 256, 16
	got := map[string][]collective.BenchResult{}
	for _, name := range []string{"inproc", "grpc"} {
		c.Transport = name
		if err := Bench(ctx, c, func(r collective.BenchResult) error { got[name] = append(got[name], r); return nil }); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if len(got["inproc"]) != 2 || len(got["grpc"]) != 2 {
		t.Fatalf("results %v, want 2 per transport", got)
	}
	for i, a := range got["inproc"] {
		b := got["grpc"][i]
		if a.Transport != "inproc" || b.Transport != "grpc" || a.Shards != b.Shards || a.SelectBytes != b.SelectBytes || a.MergeBytes != b.MergeBytes || !(b.SelectP50 > 0) {
			t.Errorf("inproc %+v vs grpc %+v: the same exchange should move the same bytes", a, b)
		}
	}
	c.Transport = "tcp"
	if err := Bench(ctx, c, func(collective.BenchResult) error { t.Fatal("emitted"); return nil }); err == nil {
		t.Error("transport tcp accepted")
	}
}

// TestSweepRoom: a grpc sweep whose messages pass grpctransport's default
// limit runs, its groups built with room for the largest message.
func TestSweepRoom(t *testing.T) {
	sw := collective.DefaultSweepConfig()
	size := int64(2*grpctransport.DefaultMaxMessageBytes + 2<<20) // 2 ranks: parts past the default
	sw.Shards, sw.MinBytes, sw.MaxBytes, sw.Steps, sw.Warmup, sw.Transport = []int{2}, size, size, 1, 0, "grpc"
	var got []collective.SweepResult
	if err := Sweep(context.Background(), sw, func(r collective.SweepResult) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Transport != "grpc" || got[0].MsgBytes <= grpctransport.DefaultMaxMessageBytes {
		t.Fatalf("results %+v, want one grpc line of parts past %d bytes", got, grpctransport.DefaultMaxMessageBytes)
	}
}
