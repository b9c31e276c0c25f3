package main

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/plan"
)

// TestQuestdQuarantine: questd with --data-dir, a sequence appended, a
// graceful stop; both meta pages of the grid's store.db damaged; the
// restarted questd stays up, counts the damaged directory in
// questrt_data_dir_quarantined_total, logs it with both paths, keeps the
// directory aside for inspection, and creates and appends on the grid
// again.
func TestQuestdQuarantine(t *testing.T) {
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
	p1 := startQuestd(t, args...)
	use(p1)
	if err := p1.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p1.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("first questd exited %d", code)
	}
	var dbs []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "store.db" {
			dbs = append(dbs, p)
		}
		return nil
	})
	if len(dbs) == 0 {
		t.Fatalf("no store.db under %s", dir)
	}
	for _, p := range dbs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[24] ^= 0xff
		b[os.Getpagesize()+24] ^= 0xff
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p2 := startQuestd(t, args...)
	use(p2) // the grid opens again: on a fresh directory
	if got := metric(t, scrape(t, p2.ready["metrics"]), "questrt_data_dir_quarantined_total").GetCounter().GetValue(); got != 1 {
		t.Errorf("questrt_data_dir_quarantined_total = %v, want 1", got)
	}
	recs := p2.logRecords("data dir damaged: moved aside, the grid starts on a fresh one (this node's part of its sequences is lost)")
	if len(recs) != 1 {
		t.Fatalf("logged %d quarantines, want 1:\n%s", len(recs), p2.stderr.String())
	}
	if moved, _ := recs[0]["moved_to"].(string); moved == "" {
		t.Errorf("the log line names no destination: %v", recs[0])
	} else if _, err := os.Stat(moved); err != nil {
		t.Errorf("the damaged directory is not kept: %v", err)
	}
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p2.wait(t, 20*time.Second); code != 0 {
		t.Errorf("second questd exited %d", code)
	}
}
