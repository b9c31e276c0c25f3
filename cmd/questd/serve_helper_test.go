package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// errServeStuck is stop's error when serve does not return.
var errServeStuck = errors.New("serve did not return within 15s of the signal")

// runServe runs questd's serve path for cfg in the background and
// returns its ready line, a context that ends when stop is called, and
// stop: it cancels serve's context (the signal) and returns serve's
// error, or an error when serve did not return within 15 s. stop may be
// called more than once (the later calls return the first's result);
// the test's cleanup calls it too.
func runServe(t *testing.T, cfg Config) (ready map[string]string, ctx context.Context, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := serve(ctx, cfg, slog.New(slog.DiscardHandler), pw, prometheus.NewRegistry(), nil)
		pw.Close()
		done <- err
	}()
	var once sync.Once
	var stopErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(15 * time.Second):
				stopErr = errServeStuck
			}
		})
		return stopErr
	}
	t.Cleanup(func() { stop() })
	br := bufio.NewReader(pr)
	line, err := br.ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("ready line: %v (serve: %v)", err, <-done)
	}
	go io.Copy(io.Discard, br)
	if err := json.Unmarshal([]byte(line), &ready); err != nil {
		t.Fatalf("ready line %q: %v", line, err)
	}
	return ready, ctx, stop
}
