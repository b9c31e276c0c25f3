package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestServeDrainEndsStreams: a stream still running when the drain's
// deadline passes gets an error event (server_shutting_down, naming
// --drain-timeout) before its connection closes, instead of being cut
// mid-response.
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
	// The stream's headers go out once the request is admitted (before
	// its prefill): the drain starts only then. A fixed sleep here let a
	// loaded machine stop the server before the request was admitted
	// (connection refused, or server_draining).
	posted := time.Now()
	admitted, got := postCompletion(ready["http"], body)
	select {
	case err := <-admitted:
		if err != nil {
			t.Fatalf("the stream before the drain: %v", err)
		}
		t.Logf("admitted %v after the post", time.Since(posted))
	case <-time.After(30 * time.Second):
		t.Fatal("the stream was not admitted in 30 s")
	}
	if err := stop(); err != nil {
		t.Fatalf("serve after the signal: %v", err)
	}
	select {
	case out := <-got:
		if !strings.Contains(out, `"code":"server_shutting_down"`) || !strings.Contains(out, "questd --drain-timeout") {
			t.Errorf("stream cut by the drain: %q, want an error event with code server_shutting_down", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end after the stop")
	}
}

// postCompletion posts body to the completions API at addr from a
// goroutine that ends with the request (a 60 s client timeout at most):
// admitted gets nil once a 200 answer's headers are in (or the error, or
// the status and body of another answer), then got the whole streamed
// body (or what came before a read error, and the error).
func postCompletion(addr string, body []byte) (admitted chan error, got chan string) {
	admitted, got = make(chan error, 1), make(chan string, 1)
	go func() {
		c := &http.Client{Timeout: 60 * time.Second}
		resp, err := c.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			admitted <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			admitted <- fmt.Errorf("%s: %s", resp.Status, b)
			return
		}
		admitted <- nil
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			got <- "read error after " + string(b) + ": " + err.Error()
			return
		}
		got <- string(b)
	}()
	return admitted, got
}
