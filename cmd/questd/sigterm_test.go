package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestSigtermDuringPrefill: a questd process that gets SIGTERM while a
// long prompt prefills logs at once that it stops (the signal, the
// drain's bound and the requests in flight), exits 0 within
// --drain-timeout and a prefill chunk, and the stream's client gets an
// error event that says the server shut down before the request
// finished, naming --drain-timeout.
func TestSigtermDuringPrefill(t *testing.T) {
	v1 := passkeyModel(t)
	args := append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--log-format", "json", "--drain-timeout", "500ms")
	p := startQuestd(t, args...)
	// 16K token ids: the prefill takes tens of seconds on the CPU.
	ids := make([]int, 16000)
	for i := range ids {
		ids[i] = 65 + (i*7)%26
	}
	body, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": ids, "max_tokens": 16, "stream": true})
	admitted, got := postCompletion(p.ready["http"], body)
	select {
	case err := <-admitted:
		if err != nil {
			t.Fatalf("the stream before the signal: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream was not admitted in 30 s")
	}
	time.Sleep(200 * time.Millisecond) // into the prefill
	signalled := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Errorf("questd exited %d after SIGTERM, want 0", code)
	}
	took := time.Since(signalled)
	t.Logf("questd exited %v after SIGTERM", took)
	if took > 15*time.Second {
		t.Errorf("questd took %v to stop after SIGTERM with --drain-timeout 500ms", took)
	}
	select {
	case out := <-got:
		if !strings.Contains(out, `"code":"server_shutting_down"`) || !strings.Contains(out, "--drain-timeout") {
			t.Errorf("the stream after SIGTERM: %q, want an error event server_shutting_down naming --drain-timeout", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end after the stop")
	}
	if recs := p.logRecords("completions drain: --drain-timeout passed; the requests left fail with 503 server_shutting_down"); len(recs) != 1 {
		t.Errorf("%d log lines saying the drain ended at --drain-timeout, want 1", len(recs))
	}
	recs := p.logRecords("stopping: draining, then leaving the cluster")
	if len(recs) != 1 || recs[0]["why"] != "terminated signal received" || recs[0]["drain_timeout"] == nil || recs[0]["requests_running"] != 1.0 {
		t.Errorf("the stop's log line: %v, want one naming the signal, the drain timeout and 1 request running", recs)
	}
}

// TestSignalBeforeReady: a signal that comes while questd starts (its
// join retrying a peer that is not up, or anything before its ready
// line) stops it as a stop asked for: serve returns nil (exit 0), and
// no ready line is printed for a node that never served.
func TestSignalBeforeReady(t *testing.T) {
	for _, c := range []struct {
		name  string
		extra []string
	}{
		{"joining", []string{"--join", "127.0.0.1:1"}},
		{"starting", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := load(t, nil, append(append([]string(nil), smallNode...), c.extra...)...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // the signal, already there
			var out bytes.Buffer
			if err := serve(ctx, cfg, slog.New(slog.DiscardHandler), &out, prometheus.NewRegistry(), nil); err != nil {
				t.Errorf("serve stopped by a signal while it starts: %v, want nil (exit 0)", err)
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q, want no ready line", out.String())
			}
		})
	}
}
