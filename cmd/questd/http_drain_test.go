package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestServeDrainEndsStreams: a stream still running when the drain's
// deadline passes gets an error event (server_shutting_down) before its
// connection closes, instead of being cut mid-response.
func TestServeDrainEndsStreams(t *testing.T) {
	v1 := passkeyModel(t)
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--drain-timeout", "100ms")...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	// A prompt of several thousand tokens: its prefill outlasts the drain.
	body, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "max_tokens": 200, "stream": true,
		"prompt": strings.Repeat("The grass is green. The sky is blue. ", 160)})
	got := make(chan string, 1)
	go func() {
		c := &http.Client{Timeout: 60 * time.Second}
		resp, err := c.Post("http://"+ready["http"]+"/v1/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			got <- "read error after " + string(b) + ": " + err.Error()
			return
		}
		got <- string(b)
	}()
	time.Sleep(300 * time.Millisecond) // admitted and prefilling
	if err := stop(); err != nil {
		t.Fatalf("serve after the signal: %v", err)
	}
	select {
	case out := <-got:
		if !strings.Contains(out, `"code":"server_shutting_down"`) {
			t.Errorf("stream cut by the drain: %q, want an error event with code server_shutting_down", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end after the stop")
	}
}
