package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// readyWriter cancels its context once the ready line is written.
type readyWriter struct {
	bytes.Buffer
	cancel context.CancelFunc
}

func (w *readyWriter) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if strings.Contains(w.String(), `"event":"ready"`) {
		w.cancel()
	}
	return n, err
}

// TestLogNodeOnce: every log line of a node that starts and stops names
// the node once (the membership's lines named it twice: node=s0
// component=cluster node=s0).
func TestLogNodeOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stdout := &readyWriter{cancel: cancel}
	var stderr bytes.Buffer
	code := run(ctx, []string{"--insecure", "--name", "s0", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--metrics-addr", ""},
		envOf(nil), stdout, &stderr)
	if code != 0 || !strings.Contains(stderr.String(), "gossip started") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if n := strings.Count(line, " node=s0"); n > 1 {
			t.Errorf("node named %d times: %s", n, line)
		}
	}
}
