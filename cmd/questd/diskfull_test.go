package main

import (
	"context"
	"math/rand/v2"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/plan"
)

// TestQuestdDiskFull runs questd with --data-dir on a real 384 KiB
// tmpfs (mounted in a user and mount namespace of the process's own:
// skipped where that is not permitted) and fills it through the client
// API: the append that meets the full disk took effect in memory, so it
// breaks its sequence and fails with FAILED_PRECONDITION, a message that
// says "disk full" and names no server path, and the sequence's next
// append says it is broken (never a length mismatch that would leave it
// wedged); the node
// logs the failure with the file and counts it in
// questrt_persist_errors_total{kind="disk_full"}; a SIGTERM, whose
// grids cannot save their tails, says so and exits 1.
func TestQuestdDiskFull(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("tmpfs in a user namespace: Linux only")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1)")
	}
	if out, err := exec.Command(unshare, "--user", "--map-root-user", "--mount", "sh", "-c", `mount -t tmpfs -o size=64k questrt-test "$1"`, "sh", t.TempDir()).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs in a namespace of this test's own: %v: %s", err, strings.TrimSpace(string(out)))
	}
	dir := t.TempDir()
	wrap := []string{unshare, "--user", "--map-root-user", "--mount", "sh", "-c", `mount -t tmpfs -o size=384k questrt-test "$1" || exit 99; shift; exec "$@"`, "sh", dir}
	p, err := spawnQuestdVia(t, wrap, nil, append(slices.Clone(smallNode), "--data-dir", dir, "--log-format", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	awaitReady(t, p)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, p.ready["grpc"], client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := c.Geometry()
	kv := g.KVHeads * g.HeadDim
	rng := rand.New(rand.NewPCG(7, 7))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	// Sequences of 2 sealed pages and a tail (page size 4) until the
	// disk is full.
	var fail error
	var id string
	layer, seqs := 0, 0
	for ; fail == nil && seqs < 100; seqs++ {
		if id, _, fail = c.Create(ctx, plan.Striped); fail != nil {
			break
		}
		for layer = 0; layer < g.Layers; layer++ {
			if fail = c.Append(ctx, id, layer, vec(9*kv), vec(9*kv)); fail != nil {
				break
			}
		}
	}
	if fail == nil {
		t.Fatalf("no error after %d sequences on a 384 KiB tmpfs", seqs)
	}
	st := status.Convert(fail)
	t.Logf("the client's error after %d sequences: %v: %s", seqs, st.Code(), st.Message())
	if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "disk full") || strings.Contains(st.Message(), dir) || strings.Contains(st.Message(), "slab-") {
		t.Errorf("the client's error on a full disk: %v %q, want FAILED_PRECONDITION saying disk full, no path", st.Code(), st.Message())
	}
	if layer < g.Layers {
		again := status.Convert(c.Append(ctx, id, layer, vec(9*kv), vec(9*kv)))
		if again.Code() != codes.FailedPrecondition || !strings.Contains(again.Message(), "broken") {
			t.Errorf("the append again: %v %q, want FAILED_PRECONDITION saying the sequence is broken", again.Code(), again.Message())
		}
	}
	if got := metric(t, scrape(t, p.ready["metrics"]), "questrt_persist_errors_total", "kind", "disk_full").GetCounter().GetValue(); got < 1 {
		t.Errorf(`questrt_persist_errors_total{kind="disk_full"} = %v, want at least 1`, got)
	}
	var logged []map[string]any
	for _, r := range p.logRecords("data dir: disk full: the change is in memory but not durable; free space (the next change persists what failed)") {
		if path, _ := r["path"].(string); strings.HasPrefix(path, dir) && r["level"] == "ERROR" {
			logged = append(logged, r)
		}
	}
	if len(logged) == 0 {
		t.Errorf("no error logged with a file in %s:\n%s", dir, p.stderr.String())
	} else {
		t.Logf("logged: %v", logged[0])
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 1 {
		t.Errorf("questd stopped on a full disk: exit code %d, want 1", code)
	}
	if s := p.stderr.String(); !strings.Contains(s, "could not save every sequence in full") || len(p.logRecords("questd failed")) != 1 {
		t.Errorf("stderr does not say the sequences were not saved:\n%s", s)
	}
}
