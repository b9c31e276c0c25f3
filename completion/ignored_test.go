package completion

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// syncBuffer is a bytes.Buffer safe for the server's logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestIgnoredFields: completions and chat requests with fields the
// server does not know (vLLM's length_penalty, a client's own, one
// in stream_options) get 200, the same greedy text as without them (and
// with top_k and min_p, which greedy decoding ignores, and the neutral
// repetition_penalty 1), and
// the header naming them in the body's order; the neutral values of the
// refused-when-used fields (tools [], tool_choice "none",
// response_format text) pass without a header; each unknown name is
// logged once per server; odd names are quoted in the header.
func TestIgnoredFields(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.ChatTemplate = passThrough(t)
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s, ts := startServer(t, m, tok, cfg)
	send := func(path string, fields map[string]any) (string, string) {
		t.Helper()
		req := map[string]any{"model": "tiny", "max_tokens": 6, "temperature": 0}
		if path == "/v1/completions" {
			req["prompt"] = "The grass is"
		} else {
			req["messages"] = []map[string]any{{"role": "user", "content": "The grass is"}}
		}
		for k, v := range fields {
			req[k] = v
		}
		b, _ := json.Marshal(req) // keys sorted: the header's order is the body's
		status, h, body := post(t, ts.URL+path, string(b))
		if status != http.StatusOK {
			t.Fatalf("%s %s: %d %s", path, b, status, body)
		}
		var c struct {
			Choices []struct {
				Text    string
				Message struct{ Content string }
			}
		}
		if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("%s: %s: %v", path, body, err)
		}
		return c.Choices[0].Text + c.Choices[0].Message.Content, h.Get(IgnoredFieldsHeader)
	}
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		plain, h := send(path, nil)
		if h != "" || plain == "" {
			t.Fatalf("%s without extras: %q, header %q", path, plain, h)
		}
		extras := map[string]any{"top_k": 40, "min_p": 0.05, "repetition_penalty": 1, "length_penalty": 1.1, "x_client_tag": map[string]any{"a": []int{1}},
			"stream_options": nil}
		if path == "/v1/completions" {
			extras["max_completion_tokens"] = 99
		}
		text, h := send(path, extras)
		want := "length_penalty, x_client_tag"
		if path == "/v1/completions" {
			want = "length_penalty, max_completion_tokens, x_client_tag"
		}
		if text != plain || h != want {
			t.Errorf("%s with extras: %q, header %q; want %q, header %q", path, text, h, plain, want)
		}
		text, h = send(path, map[string]any{"tools": []any{}, "tool_choice": "none", "functions": nil, "function_call": "none", "response_format": map[string]any{"type": "text"}})
		if text != plain || h != "" {
			t.Errorf("%s with neutral tools and format: %q, header %q; want %q and none", path, text, h, plain)
		}
	}
	b := `{"model": "tiny", "prompt": "x", "max_tokens": 1, "stream": true, "stream_options": {"continuous_usage_stats": true}, "a,b\n\"": 1}`
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	sseEvents(t, resp.Body)
	resp.Body.Close()
	if got, want := resp.Header.Get(IgnoredFieldsHeader), `stream_options.continuous_usage_stats, "a,b\n\""`; resp.StatusCode != 200 || got != want {
		t.Errorf("stream with odd names: %d, header %q, want %q", resp.StatusCode, got, want)
	}
	out := logs.String()
	if n := strings.Count(out, "request fields ignored"); n != 2 {
		t.Errorf("%d log lines of ignored fields, want 2 (the completion's 3 new names, the chat's none new, the stream's 2):\n%s", n, out)
	}
	for _, name := range []string{"length_penalty", "max_completion_tokens", "continuous_usage_stats"} {
		if strings.Count(out, name) != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", name, strings.Count(out, name), out)
		}
	}
	waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
}

// TestIgnoredFieldsHeaderBound: a body of many unknown fields gets a
// header of at most maxIgnoredHeader bytes that counts the rest, and the
// log names at most maxLoggedIgnored of them.
func TestIgnoredFieldsHeaderBound(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	_, ts := startServer(t, m, tok, cfg)
	var sb strings.Builder
	sb.WriteString(`{"model": "tiny", "prompt": "x", "max_tokens": 1`)
	const n = 500
	for i := range n {
		sb.WriteString(`, "field_` + strings.Repeat("z", i%7) + "_" + itoa(i) + `": 0`)
	}
	sb.WriteString("}")
	status, h, body := post(t, ts.URL+"/v1/completions", sb.String())
	got := h.Get(IgnoredFieldsHeader)
	if status != 200 || len(got) > maxIgnoredHeader+len(", and 500 more") || !strings.HasPrefix(got, "field__0, field_z_1, ") || !strings.Contains(got, " more") {
		t.Fatalf("%d %s: header of %d bytes %q", status, body, len(got), got)
	}
	if c := strings.Count(logs.String(), "field_"); c != maxLoggedIgnored {
		t.Errorf("%d names logged, want %d", c, maxLoggedIgnored)
	}
}

// TestChatEcho: with echo, a chat whose last message is the
// assistant's gets that message's content before its answer (vLLM's
// rule), streamed too; a last message of the user's echoes nothing.
func TestChatEcho(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.ChatTemplate = passThrough(t)
	s, ts := startServer(t, m, tok, cfg)
	msgs := []map[string]any{{"role": "user", "content": "The grass is"}, {"role": "assistant", "content": "Green, "}}
	chatText := func(echo, stream bool, msgs []map[string]any) string {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": "tiny", "messages": msgs, "max_tokens": 5, "temperature": 0, "echo": echo, "stream": stream})
		status, _, body := post(t, ts.URL+"/v1/chat/completions", string(b))
		if status != 200 {
			t.Fatalf("%s: %d %s", b, status, body)
		}
		if stream {
			var out string
			for _, e := range sseEvents(t, bytes.NewReader(body)) {
				var c ChatCompletion
				if e == "[DONE]" || json.Unmarshal([]byte(e), &c) != nil || len(c.Choices) == 0 {
					continue
				}
				out += c.Choices[0].Delta.Content
			}
			return out
		}
		var c ChatCompletion
		if err := json.Unmarshal(body, &c); err != nil {
			t.Fatal(err)
		}
		return c.Choices[0].Message.Content
	}
	plain := chatText(false, false, msgs)
	for _, stream := range []bool{false, true} {
		if got := chatText(true, stream, msgs); got != "Green, "+plain {
			t.Errorf("echo (stream %v): %q, want %q", stream, got, "Green, "+plain)
		}
	}
	user := msgs[:1]
	if got, want := chatText(true, false, user), chatText(false, false, user); got != want {
		t.Errorf("echo after the user's message: %q, want %q (nothing to echo)", got, want)
	}
	waitStats(t, s, "the chats done", func(st Stats) bool { return st.Running+st.Queued == 0 })
}
