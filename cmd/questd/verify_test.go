package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/plan"
)

// verifyRun runs questd with args in this process and returns its exit
// status, stdout and stderr.
func verifyRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), args, func(string) (string, bool) { return "", false }, &out, &errb)
	return code, out.String(), errb.String()
}

// TestQuestdVerifyData: a questd with --data-dir appends 9 tokens to a
// sequence; questd --verify-data refuses the directory while it runs
// (exit 2, "in use"), reports the grid ok with the sequence's 9 tokens
// after a graceful stop (exit 0); with both meta pages of the grid's
// store.db damaged it reports the grid damaged (exit 1) and leaves it,
// --repair moves it to <grid>.corrupt-<time> (exit 1), and the next
// verification lists it as quarantined (exit 0). The restarted questd
// then opens the grid fresh: it quarantines nothing itself. Bad usage
// exits 2, --help 0.
func TestQuestdVerifyData(t *testing.T) {
	dir := t.TempDir()
	args := append(slices.Clone(smallNode), "--data-dir", dir, "--log-format", "json")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	use := func(p *questdProc) {
		t.Helper()
		c, err := client.Dial(ctx, p.ready["grpc"], client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		g := c.Geometry()
		id, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		kv := g.KVHeads * g.HeadDim
		for l := range g.Layers {
			if err := c.Append(ctx, id, l, make([]float32, 9*kv), make([]float32, 9*kv)); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop := func(p *questdProc) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("questd exited %d", code)
		}
	}
	p1 := startQuestd(t, args...)
	use(p1)
	if code, _, stderr := verifyRun(t, "--verify-data", "--data-dir", dir); code != 2 || !strings.Contains(stderr, "in use") {
		t.Errorf("verify while questd runs: exit %d, stderr %q; want 2, in use", code, stderr)
	}
	stop(p1)

	code, out, stderr := verifyRun(t, "--verify-data", "--data-dir", dir)
	okLine := regexp.MustCompile(`(?m)^grids/m0/\S+\.0: ok: 1 sequences$`)
	seqLine := regexp.MustCompile(`(?m)^  sequence \d+ of grid m0/\S+: 9 tokens: ok, \d+ pages read$`)
	if code != 0 || !okLine.MatchString(out) || !seqLine.MatchString(out) {
		t.Fatalf("verify after a stop: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("after a stop:\n%s", out)

	dbs, _ := filepath.Glob(filepath.Join(dir, "grids", "*", "*", "rank-*", "store.db"))
	if len(dbs) != 1 {
		t.Fatalf("store.db files %v", dbs)
	}
	b, err := os.ReadFile(dbs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[24] ^= 0xff
	b[os.Getpagesize()+24] ^= 0xff
	if err := os.WriteFile(dbs[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	grid := filepath.Dir(filepath.Dir(dbs[0]))
	code, out, _ = verifyRun(t, "--verify-data", "--data-dir", dir)
	if code != 1 || !strings.Contains(out, ": damaged: ") || !strings.Contains(out, "--repair does it now") {
		t.Errorf("verify with a damaged store.db: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(grid); err != nil {
		t.Errorf("verify without --repair moved the grid: %v", err)
	}
	code, out, _ = verifyRun(t, "--verify-data", "--data-dir", dir, "--repair")
	if code != 1 || !strings.Contains(out, "moved to grids/m0/"+filepath.Base(grid)+".corrupt-") {
		t.Errorf("--repair: exit %d\n%s", code, out)
	}
	t.Logf("--repair:\n%s", out)
	if m, _ := filepath.Glob(grid + ".corrupt-*"); len(m) != 1 {
		t.Errorf("after --repair: %v, want the grid at one .corrupt-* name", m)
	}
	code, out, _ = verifyRun(t, "--verify-data", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "quarantined earlier") || !strings.Contains(out, "0 grids: 0 ok, 0 damaged; 1 quarantined before") {
		t.Errorf("verify after --repair: exit %d\n%s", code, out)
	}

	p2 := startQuestd(t, args...)
	use(p2)
	if recs := p2.logRecords("data dir damaged: moved aside, the grid starts on a fresh one (this node's part of its sequences is lost)"); len(recs) != 0 {
		t.Errorf("questd quarantined again after --repair: %v", recs)
	}
	stop(p2)

	for _, bad := range [][]string{
		{"--verify-data"},
		{"--verify-data", "--data-dir", dir, "extra"},
		{"--verify-data", "--data-dir", filepath.Join(dir, "missing")},
		{"--verify-data", "--data-dir", dir, "--no-such-flag"},
	} {
		if code, _, stderr := verifyRun(t, bad...); code != 2 || stderr == "" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a reason", bad, code, stderr)
		}
	}
	if code, _, stderr := verifyRun(t, "--verify-data", "--help"); code != 0 || !strings.Contains(stderr, "Exit status") {
		t.Errorf("--help: exit %d, %q", code, stderr)
	}
}
