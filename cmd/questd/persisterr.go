package main

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/questrt/questrt/pagestore"
)

// persistLogEvery is how often persistWatch logs the failures of one
// kind after the first: the others in between are counted and the next
// record says how many.
const persistLogEvery = 10 * time.Second

// The kinds of persistence errors (questrt_persist_errors_total's kind
// label).
const (
	persistDiskFull = "disk_full"
	persistIO       = "io"
	persistOther    = "other"
)

// persistKind is the kind of a persistence error.
func persistKind(e *pagestore.IOError) string {
	switch {
	case errors.Is(e, pagestore.ErrDiskFull):
		return persistDiskFull
	case errors.Is(e, pagestore.ErrIO):
		return persistIO
	}
	return persistOther
}

// persistWatch is the node's eye on the failures of --data-dir's files
// (node.Config.OnPersistError, down to every hosted grid's worker and
// page stores): it counts each in questrt_persist_errors_total{kind},
// logs it with the file (the error the client got names none), at most
// once per persistLogEvery and kind, and keeps the failures of the
// grids' Closes after the stop began: the sequences they could not save
// in full, which make the stop fail ([persistWatch.stopError]).
type persistWatch struct {
	log      *slog.Logger
	count    *prometheus.CounterVec
	now      func() time.Time
	stopping atomic.Bool

	mu         sync.Mutex
	last       map[string]time.Time // by kind: the last record logged
	suppressed map[string]int       // by kind: failures not logged since
	unsaved    int                  // Close failures after the stop began
	first      *pagestore.IOError   // the first of them
}

func newPersistWatch(m *metrics, log *slog.Logger) *persistWatch {
	return &persistWatch{log: log, count: m.persist, now: time.Now, last: map[string]time.Time{}, suppressed: map[string]int{}}
}

// report takes one failure (node.Config.OnPersistError). It runs on the
// goroutine that met it, possibly with a store's locks held: it only
// counts and logs.
func (w *persistWatch) report(e *pagestore.IOError) {
	kind := persistKind(e)
	w.count.WithLabelValues(kind).Inc()
	w.mu.Lock()
	now := w.now()
	stopping := w.stopping.Load()
	if e.Closing && stopping {
		w.unsaved++
		if w.first == nil {
			w.first = e
		}
	}
	log := e.Closing || now.Sub(w.last[kind]) >= persistLogEvery
	suppressed := w.suppressed[kind]
	if log {
		w.last[kind], w.suppressed[kind] = now, 0
	} else {
		w.suppressed[kind]++
	}
	w.mu.Unlock()
	if !log {
		return
	}
	var msg string
	switch kind {
	case persistDiskFull:
		msg = "data dir: disk full: the change is in memory but not durable; free space (the next change persists what failed)"
	case persistIO:
		msg = "data dir: I/O error: the change is in memory but not durable"
	default:
		msg = "data dir: persistence failed: the change is in memory but not durable"
	}
	if e.Closing {
		msg = "data dir: sequences not saved in full at the grid's close (" + pagestore.Condition(e.Err) + "): a restart recovers them at their last saved lengths, the tail tokens reported lost"
	}
	attrs := []any{"op", e.Op, "path", e.Path, "err", e.Err, "kind", kind}
	if suppressed > 0 {
		attrs = append(attrs, "not_logged_since_the_last", suppressed)
	}
	w.log.Error(msg, attrs...)
}

// beginStop marks the start of the node's stop: the Close failures from
// then on make [persistWatch.stopError] fail.
func (w *persistWatch) beginStop() { w.stopping.Store(true) }

// stopError says, after the node stopped, that the grids hosted here
// could not save every sequence in full (nil when they could).
func (w *persistWatch) stopError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.unsaved == 0 {
		return nil
	}
	return fmt.Errorf("stop: the grids hosted here could not save every sequence in full to --data-dir (%d failures, the first: %s of %s: %s): a restart recovers them at their last saved lengths, their tail tokens reported lost",
		w.unsaved, w.first.Op, w.first.Path, pagestore.Condition(w.first.Err))
}
