package main

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/questrt/questrt/pagestore"
)

// persistCount is questrt_persist_errors_total{kind} in reg.
func persistCount(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range mfs {
		byName[f.GetName()] = f
	}
	return metric(t, byName, "questrt_persist_errors_total", "kind", kind).GetCounter().GetValue()
}

// jsonRecords parses the JSON log lines in s.
func jsonRecords(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, r)
	}
	return out
}

// TestPersistWatch: every persistence failure counts in
// questrt_persist_errors_total by kind (disk_full for ENOSPC and
// EDQUOT, io for another errno, other); the log names the file the
// client's error does not, the first failure of a kind at once and the
// next ones at most every persistLogEvery with the count of those not
// logged; a Close's failures before the stop are logged and counted but
// do not fail the stop, those after it began do, naming the condition.
func TestPersistWatch(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, &readiness{})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	w := newPersistWatch(m, slog.New(slog.NewJSONHandler(&logs, nil)))
	clock := time.Unix(1000, 0)
	w.now = func() time.Time { return clock }
	for _, k := range []string{"disk_full", "io", "other"} {
		if got := persistCount(t, reg, k); got != 0 {
			t.Errorf("%s before any failure: %v", k, got)
		}
	}
	slab := "/var/lib/questd/grids/m0/g.1/rank-tp0-cp0/slab-000000"
	ioErr := func(errno syscall.Errno, closing bool) *pagestore.IOError {
		return &pagestore.IOError{Op: "write page", Path: slab, Err: &os.PathError{Op: "write", Path: slab, Err: errno}, Closing: closing}
	}
	for range 5 {
		w.report(ioErr(syscall.ENOSPC, false))
	}
	w.report(ioErr(syscall.EDQUOT, false))
	w.report(ioErr(syscall.EIO, false))
	w.report(&pagestore.IOError{Op: "commit metadata", Path: "/var/lib/questd/x/store.db", Err: errors.New("database not open")})
	for kind, want := range map[string]float64{"disk_full": 6, "io": 1, "other": 1} {
		if got := persistCount(t, reg, kind); got != want {
			t.Errorf("questrt_persist_errors_total{kind=%q} = %v, want %v", kind, got, want)
		}
	}
	recs := jsonRecords(t, logs.String())
	if len(recs) != 3 {
		t.Fatalf("%d records, want one per kind:\n%s", len(recs), logs.String())
	}
	if r := recs[0]; r["level"] != "ERROR" || r["path"] != slab || r["op"] != "write page" || r["kind"] != "disk_full" ||
		!strings.Contains(r["msg"].(string), "disk full") || !strings.Contains(r["err"].(string), "no space left on device") {
		t.Errorf("the disk-full record: %v", r)
	}
	if r := recs[1]; r["kind"] != "io" || !strings.Contains(r["err"].(string), "input/output error") {
		t.Errorf("the I/O record: %v", r)
	}
	clock = clock.Add(persistLogEvery)
	w.report(ioErr(syscall.ENOSPC, false))
	recs = jsonRecords(t, logs.String())
	if len(recs) != 4 || recs[3]["not_logged_since_the_last"] != float64(5) {
		t.Errorf("after %v: records %v, want a fourth saying 5 were not logged", persistLogEvery, recs)
	}

	// A grid closed while the node runs.
	w.report(ioErr(syscall.ENOSPC, true))
	if err := w.stopError(); err != nil {
		t.Errorf("a Close failure before the stop: stop error %v", err)
	}
	recs = jsonRecords(t, logs.String())
	if len(recs) != 5 || !strings.Contains(recs[4]["msg"].(string), "not saved in full") || recs[4]["path"] != slab {
		t.Errorf("a Close failure is logged at once, with the file: %v", recs)
	}
	w.beginStop()
	if err := w.stopError(); err != nil {
		t.Errorf("a stop without failures: %v", err)
	}
	w.report(ioErr(syscall.ENOSPC, false)) // an append's, during the drain
	if err := w.stopError(); err != nil {
		t.Errorf("no Close failed: %v", err)
	}
	w.report(ioErr(syscall.ENOSPC, true))
	w.report(&pagestore.IOError{Op: "commit metadata", Path: "/var/lib/questd/x/store.db", Err: syscall.ENOSPC, Closing: true})
	err = w.stopError()
	if err == nil || !strings.Contains(err.Error(), "could not save every sequence in full") || !strings.Contains(err.Error(), "2 failures") ||
		!strings.Contains(err.Error(), "disk full (no space left on device)") || !strings.Contains(err.Error(), slab) {
		t.Errorf("stop error %v", err)
	}
	if got := persistCount(t, reg, "disk_full"); got != 11 {
		t.Errorf("disk_full = %v, want 11", got)
	}
}
