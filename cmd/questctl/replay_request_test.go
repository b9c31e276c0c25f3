package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/questrt/questrt/completion"
)

// completeOn posts a greedy completion to the API at addr and returns
// its id.
func completeOn(t *testing.T, addr string, body map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var c completion.Completion
	if err := json.Unmarshal(raw, &c); err != nil || resp.StatusCode != 200 {
		t.Fatalf("completion: %s %s", resp.Status, raw)
	}
	return c.ID
}

// TestReplayRequest: questctl replay-request re-runs a served request
// with dense attention: with the dense selector every token agrees; with
// a one-page budget the table and the JSON name the first divergence;
// the ID may come before or after the flags.
func TestReplayRequest(t *testing.T) {
	addr, _ := serveTestServer(t)
	prompt := "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. " +
		strings.Repeat("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ", 8) +
		"The pass key is 48213. Remember it. 48213 is the pass key. " +
		strings.Repeat("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ", 8) +
		"What is the pass key? The pass key is "
	dense := completeOn(t, addr, map[string]any{"model": "passkey-llama-v1", "prompt": prompt, "max_tokens": 6, "temperature": 0,
		"quest": map[string]any{"selector": "dense"}})
	code, stdout, stderr := runCLI(t, "replay-request", "--addr", addr, dense)
	if code != 0 || stderr != "" || !strings.Contains(stdout, "6 of 6 tokens agree with dense attention") || !strings.Contains(stdout, "no divergence") ||
		!strings.Contains(stdout, "index  position  token") || !strings.Contains(stdout, "selection: dense") {
		t.Fatalf("dense request: exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
	}
	sparse := completeOn(t, addr, map[string]any{"model": "passkey-llama-v1", "prompt": prompt, "max_tokens": 6, "temperature": 0,
		"quest": map[string]any{"budget": 16, "dense_layers": 0}})
	code, stdout, stderr = runCLI(t, "replay-request", sparse, "--json", "--addr", "http://"+addr)
	if code != 0 || stderr != "" || strings.Count(stdout, "\n") != 1 {
		t.Fatalf("--json: exit %d, stderr %q, stdout %q", code, stderr, stdout)
	}
	var rep completion.ReplayReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || rep.ID != sparse || len(rep.Tokens) == 0 {
		t.Fatalf("--json: %v %+v", err, rep)
	}
	t.Logf("one-page budget: %d of %d agree, first divergence %d", rep.Agree, len(rep.Tokens), rep.FirstDivergence)
	if rep.FirstDivergence < 0 {
		t.Fatalf("a one-page budget agrees with dense on every token: %+v", rep)
	}
	_, table, _ := runCLI(t, "replay-request", "--addr", addr, sparse)
	if !strings.Contains(table, "first divergence at token ") || !strings.Contains(table, "NO") {
		t.Errorf("table of the sparse request:\n%s", table)
	}
	code, stdout, stderr = runCLI(t, "replay-request", "--addr", addr, "cmpl-nope")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "404") || !strings.Contains(stderr, "cmpl-nope") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("unknown id: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestReplayRequestBadFlags: a missing address or id, a bad address or
// timeout and a second id are one-line usage errors (exit 2).
func TestReplayRequestBadFlags(t *testing.T) {
	addr := closedAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cmpl-1"}, "--addr is required"},
		{[]string{"--addr", addr}, "request ID is required"},
		{[]string{"--addr", "localhost", "cmpl-1"}, "--addr"},
		{[]string{"--addr", "http://", "cmpl-1"}, "--addr"},
		{[]string{"--addr", addr, "--timeout", "0s", "cmpl-1"}, "--timeout"},
		{[]string{"--addr", addr, "cmpl-1", "cmpl-2"}, "unexpected arguments"},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"replay-request"}, tc.args...)...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want exit 2 naming %s)", tc.args, code, stdout, stderr, tc.want)
		}
	}
	if code, _, stderr := runCLI(t, "replay-request", "--addr", addr, "cmpl-1"); code != 1 || !strings.Contains(stderr, "cmpl-1") {
		t.Errorf("closed port: exit %d, %q", code, stderr)
	}
}
