package completion

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// checkError decodes an OpenAI error answer strictly and checks its
// status, type, param and code ("" for null).
func checkError(t testing.TB, what string, status int, body []byte, wantStatus int, wantType, wantParam, wantCode string) {
	t.Helper()
	var e ErrorBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Errorf("%s: body %s is not an error object: %v", what, body, err)
		return
	}
	var top map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || len(top) != 1 || len(top["error"]) != 4 {
		t.Errorf("%s: body %s: want exactly error{message, type, param, code}", what, body)
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	if status != wantStatus || e.Error.Type != wantType || str(e.Error.Param) != wantParam || (wantCode != "" && str(e.Error.Code) != wantCode) || e.Error.Message == "" {
		t.Errorf("%s: %d %s param %q code %q (%q), want %d %s param %q code %q",
			what, status, e.Error.Type, str(e.Error.Param), str(e.Error.Code), e.Error.Message, wantStatus, wantType, wantParam, wantCode)
	}
}

// unchanged checks that refused requests left no trace in the server.
func unchanged(t testing.TB, s *Server, admitted uint64) {
	t.Helper()
	st := s.Stats()
	if st.Admitted != admitted || st.Running != 0 || st.Queued != 0 || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.UsedPages != st.PrefixCachePages {
		t.Fatalf("after refused requests: %+v (want %d admitted and nothing held)", st, admitted)
	}
}

// TestBadRequests: every bad parameter is a 400 (404 for the model)
// in OpenAI's error shape naming the field, and changes nothing.
func TestBadRequests(t *testing.T) {
	m, tok := tinyModel(t)
	s, ts := startServer(t, m, tok, testConfig("tiny"))
	long := strings.Repeat("a", 4100)
	cases := []struct {
		name, body string
		status     int
		param      string
		code       string
	}{
		{"invalid JSON", `{"model": "tiny",`, 400, "", "invalid_json"},
		{"empty body", ``, 400, "", "invalid_json"},
		{"not an object", `["tiny"]`, 400, "", "invalid_type"},
		{"null body", `null`, 400, "", "invalid_type"},
		{"trailing data", `{"model": "tiny", "prompt": "x"} {}`, 400, "", "invalid_json"},
		{"known field bad beside an unknown one", `{"model": "tiny", "prompt": "x", "temprature": 0, "temperature": "hot"}`, 400, "temperature", "invalid_type"},
		{"tools", `{"model": "tiny", "prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}`, 400, "tools", "unsupported_parameter"},
		{"tool_choice", `{"model": "tiny", "prompt": "x", "tool_choice": "auto"}`, 400, "tool_choice", "unsupported_parameter"},
		{"response_format", `{"model": "tiny", "prompt": "x", "response_format": {"type": "json_object"}}`, 400, "response_format", "unsupported_parameter"},
		{"stream_options unknown beside a bad one", `{"model": "tiny", "prompt": "x", "stream": true, "stream_options": {"x": 1, "include_usage": 2}}`, 400, "stream_options.include_usage", "invalid_type"},
		{"repeated field", `{"model": "tiny", "prompt": "x", "model": "tiny"}`, 400, "model", "duplicate_parameter"},
		{"missing prompt", `{"model": "tiny"}`, 400, "prompt", "missing_required_parameter"},
		{"null prompt", `{"model": "tiny", "prompt": null}`, 400, "prompt", "missing_required_parameter"},
		{"unknown model", `{"model": "gpt-4", "prompt": "x"}`, 404, "model", "model_not_found"},
		{"model type", `{"model": 5, "prompt": "x"}`, 400, "model", "invalid_type"},
		{"prompt type", `{"model": "tiny", "prompt": 5}`, 400, "prompt", "invalid_type"},
		{"prompt object", `{"model": "tiny", "prompt": {"text": "x"}}`, 400, "prompt", "invalid_type"},
		{"prompt batch with a number", `{"model": "tiny", "prompt": ["a", 5]}`, 400, "prompt", "invalid_type"},
		{"prompt batch with an object", `{"model": "tiny", "prompt": [[1], {"a": 1}]}`, 400, "prompt", "invalid_type"},
		{"prompt batch with no tokens", `{"model": "tiny", "prompt": ["a", []]}`, 400, "prompt", "invalid_value"},
		{"prompt batch with a bad id", `{"model": "tiny", "prompt": [[1, 2], [3, 260]]}`, 400, "prompt", "invalid_value"},
		{"prompt batch over the context", `{"model": "tiny", "prompt": ["a", "` + long + `"]}`, 400, "prompt", "context_length_exceeded"},
		{"prompt fractional id", `{"model": "tiny", "prompt": [1, 2.5]}`, 400, "prompt", "invalid_type"},
		{"prompt id outside vocabulary", `{"model": "tiny", "prompt": [1, 260]}`, 400, "prompt", "invalid_value"},
		{"prompt negative id", `{"model": "tiny", "prompt": [-1]}`, 400, "prompt", "invalid_value"},
		{"prompt huge id", `{"model": "tiny", "prompt": [99999999999999999999]}`, 400, "prompt", "invalid_value"},
		{"prompt no ids", `{"model": "tiny", "prompt": []}`, 400, "prompt", "invalid_value"},
		{"prompt invalid UTF-8", "{\"model\": \"tiny\", \"prompt\": \"ab\xffcd\"}", 400, "prompt", "invalid_string"},
		{"prompt lone high surrogate", `{"model": "tiny", "prompt": "a\ud800b"}`, 400, "prompt", "invalid_string"},
		{"prompt lone low surrogate", `{"model": "tiny", "prompt": "a\udc00"}`, 400, "prompt", "invalid_string"},
		{"prompt over the context", `{"model": "tiny", "prompt": "` + long + `"}`, 400, "prompt", "context_length_exceeded"},
		{"prompt plus max_tokens over the context", `{"model": "tiny", "prompt": "` + long[:4000] + `", "max_tokens": 200}`, 400, "max_tokens", "context_length_exceeded"},
		{"max_tokens string", `{"model": "tiny", "prompt": "x", "max_tokens": "16"}`, 400, "max_tokens", "invalid_type"},
		{"max_tokens fraction", `{"model": "tiny", "prompt": "x", "max_tokens": 1.5}`, 400, "max_tokens", "invalid_type"},
		{"max_tokens negative", `{"model": "tiny", "prompt": "x", "max_tokens": -1}`, 400, "max_tokens", "invalid_value"},
		{"max_tokens zero", `{"model": "tiny", "prompt": "x", "max_tokens": 0}`, 400, "max_tokens", "invalid_value"},
		{"max_tokens huge", `{"model": "tiny", "prompt": "x", "max_tokens": 9999999999}`, 400, "max_tokens", "invalid_value"},
		{"temperature string", `{"model": "tiny", "prompt": "x", "temperature": "hot"}`, 400, "temperature", "invalid_type"},
		{"temperature range", `{"model": "tiny", "prompt": "x", "temperature": 2.5}`, 400, "temperature", "invalid_value"},
		{"temperature negative", `{"model": "tiny", "prompt": "x", "temperature": -0.1}`, 400, "temperature", "invalid_value"},
		{"top_p boolean", `{"model": "tiny", "prompt": "x", "top_p": true}`, 400, "top_p", "invalid_type"},
		{"top_p range", `{"model": "tiny", "prompt": "x", "top_p": 1.01}`, 400, "top_p", "invalid_value"},
		{"seed fraction", `{"model": "tiny", "prompt": "x", "seed": 1.5}`, 400, "seed", "invalid_type"},
		{"seed string", `{"model": "tiny", "prompt": "x", "seed": "1"}`, 400, "seed", "invalid_type"},
		{"stop number", `{"model": "tiny", "prompt": "x", "stop": 5}`, 400, "stop", "invalid_type"},
		{"stop array of numbers", `{"model": "tiny", "prompt": "x", "stop": ["a", 5]}`, 400, "stop", "invalid_type"},
		{"stop too many", `{"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}`, 400, "stop", "invalid_value"},
		{"stop empty string", `{"model": "tiny", "prompt": "x", "stop": [""]}`, 400, "stop", "invalid_value"},
		{"stop invalid UTF-8", "{\"model\": \"tiny\", \"prompt\": \"x\", \"stop\": \"\xc3\"}", 400, "stop", "invalid_string"},
		{"stream string", `{"model": "tiny", "prompt": "x", "stream": "yes"}`, 400, "stream", "invalid_type"},
		{"stream_options without stream", `{"model": "tiny", "prompt": "x", "stream_options": {"include_usage": true}}`, 400, "stream_options", "invalid_value"},
		{"stream_options type", `{"model": "tiny", "prompt": "x", "stream": true, "stream_options": true}`, 400, "stream_options", "invalid_type"},
		{"n too many", `{"model": "tiny", "prompt": "x", "n": 17}`, 400, "n", "invalid_value"},
		{"n negative", `{"model": "tiny", "prompt": "x", "n": -1}`, 400, "n", "invalid_value"},
		{"n over the pool", `{"model": "tiny", "prompt": "x", "n": 16, "max_tokens": 1000}`, 400, "n", "invalid_value"},
		{"prompts x n over the sequences", `{"model": "tiny", "prompt": ["a", "b", "c", "d", "e", "f"], "n": 16}`, 400, "n", "invalid_value"},
		{"n zero", `{"model": "tiny", "prompt": "x", "n": 0}`, 400, "n", "invalid_value"},
		{"n string", `{"model": "tiny", "prompt": "x", "n": "1"}`, 400, "n", "invalid_type"},
		{"echo string", `{"model": "tiny", "prompt": "x", "echo": "yes"}`, 400, "echo", "invalid_type"},
		{"max_tokens zero without echo", `{"model": "tiny", "prompt": "x", "max_tokens": 0, "echo": false}`, 400, "max_tokens", "invalid_value"},
		{"logprobs", `{"model": "tiny", "prompt": "x", "logprobs": 21}`, 400, "logprobs", "invalid_value"},
		{"best_of", `{"model": "tiny", "prompt": "x", "best_of": 2}`, 400, "best_of", "unsupported_parameter"},
		{"best_of 2 with n 2", `{"model": "tiny", "prompt": "x", "best_of": 2, "n": 2}`, 400, "best_of", "unsupported_parameter"},
		{"best_of below n", `{"model": "tiny", "prompt": "x", "best_of": 1, "n": 2}`, 400, "best_of", "invalid_value"},
		{"n above best_of", `{"model": "tiny", "prompt": ["x", "y"], "n": 3, "best_of": 1}`, 400, "best_of", "invalid_value"},
		{"frequency_penalty over 2", `{"model": "tiny", "prompt": "x", "frequency_penalty": 2.5}`, 400, "frequency_penalty", "invalid_value"},
		{"frequency_penalty under -2", `{"model": "tiny", "prompt": "x", "frequency_penalty": -2.01}`, 400, "frequency_penalty", "invalid_value"},
		{"frequency_penalty string", `{"model": "tiny", "prompt": "x", "frequency_penalty": "1"}`, 400, "frequency_penalty", "invalid_type"},
		{"presence_penalty over 2", `{"model": "tiny", "prompt": "x", "presence_penalty": 3}`, 400, "presence_penalty", "invalid_value"},
		{"presence_penalty under -2", `{"model": "tiny", "prompt": "x", "presence_penalty": -7}`, 400, "presence_penalty", "invalid_value"},
		{"repetition_penalty zero", `{"model": "tiny", "prompt": "x", "repetition_penalty": 0}`, 400, "repetition_penalty", "invalid_value"},
		{"repetition_penalty negative", `{"model": "tiny", "prompt": "x", "repetition_penalty": -1}`, 400, "repetition_penalty", "invalid_value"},
		{"repetition_penalty over 2", `{"model": "tiny", "prompt": "x", "repetition_penalty": 2.5}`, 400, "repetition_penalty", "invalid_value"},
		{"repetition_penalty bool", `{"model": "tiny", "prompt": "x", "repetition_penalty": true}`, 400, "repetition_penalty", "invalid_type"},
		{"logit_bias", `{"model": "tiny", "prompt": "x", "logit_bias": {"50": 10}}`, 400, "logit_bias", "unsupported_parameter"},
		{"suffix", `{"model": "tiny", "prompt": "x", "suffix": "end"}`, 400, "suffix", "unsupported_parameter"},
		{"quest type", `{"model": "tiny", "prompt": "x", "quest": 5}`, 400, "quest", "invalid_type"},
		{"quest unknown", `{"model": "tiny", "prompt": "x", "quest": {"budgett": 64}}`, 400, "quest.budgett", "unknown_parameter"},
		{"quest repeated", `{"model": "tiny", "prompt": "x", "quest": {"sink": 0, "sink": 0}}`, 400, "quest.sink", "duplicate_parameter"},
		{"quest budget type", `{"model": "tiny", "prompt": "x", "quest": {"budget": "64"}}`, 400, "quest.budget", "invalid_type"},
		{"quest budget below a page", `{"model": "tiny", "prompt": "x", "quest": {"budget": 8}}`, 400, "quest.budget", "invalid_value"},
		{"quest selector unknown", `{"model": "tiny", "prompt": "x", "quest": {"selector": "best"}}`, 400, "quest.selector", "invalid_value"},
		{"quest gqa unknown", `{"model": "tiny", "prompt": "x", "quest": {"gqa": "mean"}}`, 400, "quest.gqa", "invalid_value"},
		{"quest sink too large", `{"model": "tiny", "prompt": "x", "quest": {"sink": 2000000}}`, 400, "quest.sink", "invalid_value"},
		// K = 2048/16 = 128 pages, forced pages included; local is 1 by default.
		{"quest sink over the page budget", `{"model": "tiny", "prompt": "x", "quest": {"sink": 128}}`, 400, "quest.sink", "invalid_value"},
		{"quest local over the request's page budget", `{"model": "tiny", "prompt": "x", "quest": {"budget": 32, "local": 3}}`, 400, "quest.local", "invalid_value"},
		{"quest sink not an integer", `{"model": "tiny", "prompt": "x", "quest": {"sink": 1.5}}`, 400, "quest.sink", "invalid_type"},
		{"quest gqa not a string", `{"model": "tiny", "prompt": "x", "quest": {"gqa": 1}}`, 400, "quest.gqa", "invalid_type"},
		{"quest local negative", `{"model": "tiny", "prompt": "x", "quest": {"local": -1}}`, 400, "quest.local", "invalid_value"},
		{"quest dense_layers over the layers", `{"model": "tiny", "prompt": "x", "quest": {"dense_layers": 3}}`, 400, "quest.dense_layers", "invalid_value"},
		{"quest dense_layers negative", `{"model": "tiny", "prompt": "x", "quest": {"dense_layers": -1}}`, 400, "quest.dense_layers", "invalid_value"},
	}
	for _, c := range cases {
		status, _, body := post(t, ts.URL+"/v1/completions", c.body)
		typ := typeInvalid
		checkError(t, c.name, status, body, c.status, typ, c.param, c.code)
	}
	unchanged(t, s, 0)
	if st := s.Stats(); st.Invalid != uint64(len(cases)) {
		t.Errorf("%d invalid requests counted, want %d", st.Invalid, len(cases))
	}
	// The neutral values of the unimplemented fields, and the quest
	// object restating the engine's policy, are accepted.
	c := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": "x", "max_tokens": 2, "echo": false, "logprobs": nil,
		"best_of": 1, "frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1, "logit_bias": map[string]any{}, "suffix": "", "user": "u", "n": 1,
		"stop": nil, "seed": -5, "top_p": 0.5, "stream": false,
		"quest": map[string]any{"budget": 16, "selector": "quest", "gqa": "group_max", "sink": 0, "local": 1, "dense_layers": 0}})
	if c.Usage.CompletionTokens != 2 {
		t.Errorf("neutral values: %+v", c)
	}
}

// TestRoutes: wrong methods are 405 with Allow, unknown paths and
// models 404, all in the error shape; /v1/models lists the model.
func TestRoutes(t *testing.T) {
	m, tok := tinyModel(t)
	s, ts := startServer(t, m, tok, testConfig("tiny"))
	for _, c := range []struct {
		method, path string
		status       int
		allow, code  string
		param        string
	}{
		{"GET", "/v1/completions", 405, "POST", "method_not_allowed", ""},
		{"PUT", "/v1/completions", 405, "POST", "method_not_allowed", ""},
		{"POST", "/v1/models", 405, "GET, HEAD", "method_not_allowed", ""},
		{"DELETE", "/v1/models/tiny", 405, "GET, HEAD", "method_not_allowed", ""},
		{"GET", "/v1/chat/completions", 405, "POST", "method_not_allowed", ""},
		{"POST", "/v1/chat/completions", 400, "", "missing_required_parameter", "messages"},
		{"POST", "/v1/embeddings", 404, "", "unknown_url", ""},
		{"GET", "/", 404, "", "unknown_url", ""},
		{"GET", "/v1/models/other", 404, "", "model_not_found", "model"},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		resp.Body.Close()
		what := c.method + " " + c.path
		checkError(t, what, resp.StatusCode, buf.Bytes(), c.status, typeInvalid, c.param, c.code)
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s: Allow %q, want %q", what, got, c.allow)
		}
	}
	for _, path := range []string{"/v1/models", "/v1/models/tiny"} {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if s.MaxModelLen() != m.Config.MaxPositions {
			t.Errorf("MaxModelLen %d, want the model's %d positions", s.MaxModelLen(), m.Config.MaxPositions)
		}
		want := fmt.Sprintf(`{"id":"tiny","object":"model","created":%d,"owned_by":"questrt","max_model_len":%d}`, s.created, s.MaxModelLen())
		if path == "/v1/models" {
			want = `{"object":"list","data":[` + want + `]}`
		}
		if resp.StatusCode != 200 || strings.TrimSpace(buf.String()) != want {
			t.Errorf("GET %s: %d %s, want %s", path, resp.StatusCode, buf.String(), want)
		}
	}
	unchanged(t, s, 0)
}

// TestBodyLimit: a body over MaxBodyBytes is 413 in the error shape.
func TestBodyLimit(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.MaxBodyBytes = 100
	s, ts := startServer(t, m, tok, cfg)
	status, _, body := post(t, ts.URL+"/v1/completions", `{"model": "tiny", "prompt": "`+strings.Repeat("x", 200)+`"}`)
	checkError(t, "large body", status, body, 413, typeInvalid, "", "request_too_large")
	unchanged(t, s, 0)
}

// TestBodyStall: a request whose body stops arriving is answered 408 at
// the request timeout, not held open for as long as the client waits.
func TestBodyStall(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.RequestTimeout = 300 * time.Millisecond
	s, ts := startServer(t, m, tok, cfg)
	c, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body (%v after the headers): %v", time.Since(start), err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	checkError(t, "stalled body", resp.StatusCode, body, 408, typeTimeout, "", "request_timeout")
	if took < cfg.RequestTimeout {
		t.Errorf("answered %v after the headers, before the request timeout %v", took, cfg.RequestTimeout)
	}
	unchanged(t, s, 0)
}

// TestPoolLimit: a request whose pages exceed the whole pool is a 400
// (it could never be admitted): on max_tokens when the prompt fits the
// pool alone, on the prompt when it does not.
func TestPoolLimit(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.CapacityPages = 8 // 128 tokens
	s, ts := startServer(t, m, tok, cfg)
	status, _, body := post(t, ts.URL+"/v1/completions", `{"model": "tiny", "prompt": "`+strings.Repeat("x", 100)+`", "max_tokens": 100}`)
	checkError(t, "over the pool", status, body, 400, typeInvalid, "max_tokens", "context_length_exceeded")
	status, _, body = post(t, ts.URL+"/v1/completions", `{"model": "tiny", "prompt": "`+strings.Repeat("x", 130)+`", "max_tokens": 1}`)
	checkError(t, "a prompt over the pool", status, body, 400, typeInvalid, "prompt", "context_length_exceeded")
	unchanged(t, s, 0)
}

// held starts a server whose scheduler waits for release before its
// first iteration (and every one until then).
func held(t testing.TB, cfg Config) (s *Server, ts *httptest.Server, release func()) {
	t.Helper()
	m, tok := tinyModel(t)
	return heldModel(t, m, tok, cfg)
}

// span is the scheduler iterations in which a request had a running
// choice: the first and the last (counted at the start of each).
type span struct{ first, last int }

// heldRuns is held, and records for each request (by its completion id)
// the iterations in which any of its choices was running, as runs
// returns them: a request started after another ended when its first
// is past the other's last.
func heldRuns(t testing.TB, cfg Config) (s *Server, ts *httptest.Server, release func(), runs func() map[string]span) {
	t.Helper()
	m, tok := tinyModel(t)
	gate := make(chan struct{})
	var mu sync.Mutex
	seen := map[string]span{}
	iter := 0
	var srv *Server // set before gate closes
	s, err := newServer(m, tok, cfg, hooks{iteration: func(ctx context.Context) {
		select {
		case <-gate:
		case <-ctx.Done():
			return
		}
		srv.mu.Lock()
		var ids []string
		for _, j := range srv.running {
			ids = append(ids, j.id)
		}
		srv.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		iter++
		for _, id := range ids {
			sp, ok := seen[id]
			if !ok {
				sp.first = iter
			}
			sp.last = iter
			seen[id] = sp
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv = s
	ts = httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	var once sync.Once
	return s, ts, func() { once.Do(func() { close(gate) }) }, func() map[string]span {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}

// answer is one HTTP answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// postAsync posts body in a goroutine; the answer comes on the channel.
func postAsync(t testing.TB, url, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			ch <- answer{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		ch <- answer{resp.StatusCode, resp.Header, buf.Bytes()}
	}()
	return ch
}

// waitStats polls until ok holds for the server's stats.
func waitStats(t testing.TB, s *Server, what string, ok func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := s.Stats()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %+v", what, st)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestAdmission: with the scheduler held, two requests whose pages do
// not fit the pool together are both admitted (queued: pages are
// reserved when a request starts), and one past the running and queued
// caps gets 429 with Retry-After naming --max-queued and changes
// nothing; once released, the first runs and the second waits for its
// pages, then runs: both complete with their solo answers.
func TestAdmission(t *testing.T) {
	cfg := testConfig("tiny")
	cfg.CapacityPages = 20
	cfg.MaxRunning, cfg.MaxQueued = 1, 1
	s, ts, release := held(t, cfg)
	url := ts.URL + "/v1/completions"
	// 100 + 100 tokens: 13 pages of 16; two do not fit 20.
	big := `{"model": "tiny", "prompt": "` + strings.Repeat("x", 99) + `", "max_tokens": 100, "temperature": 0}`
	big2 := `{"model": "tiny", "prompt": "` + strings.Repeat("y", 99) + `", "max_tokens": 100, "temperature": 0}`
	small := `{"model": "tiny", "prompt": "hi", "max_tokens": 3, "temperature": 0}`
	first := postAsync(t, url, big)
	waitStats(t, s, "the first request queued", func(st Stats) bool { return st.Queued == 1 })
	second := postAsync(t, url, big2)
	waitStats(t, s, "the second request queued", func(st Stats) bool { return st.Queued == 2 })
	status, h, body := post(t, url, small)
	checkError(t, "caps", status, body, 429, typeRateLimit, "", "rate_limit_exceeded")
	if h.Get("Retry-After") != "2" || !strings.Contains(string(body), "--max-queued") {
		t.Errorf("Retry-After %q, body %s: want 2 and the flag --max-queued", h.Get("Retry-After"), body)
	}
	st := s.Stats()
	if st.Admitted != 2 || st.Refused != 1 || st.Queued != 2 || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries {
		t.Fatalf("stats after the refusal: %+v", st)
	}
	release()
	for i, ch := range []<-chan answer{first, second} {
		a := <-ch
		if a.status != 200 {
			t.Fatalf("admitted request %d: %d %s", i, a.status, a.body)
		}
		// Alone on the idle server, the same answer.
		status, _, solo := post(t, url, []string{big, big2}[i])
		var got, want Completion
		if status != 200 || json.Unmarshal(a.body, &got) != nil || json.Unmarshal(solo, &want) != nil ||
			got.Choices[0].Text != want.Choices[0].Text || got.Usage.CompletionTokens != 100 {
			t.Errorf("request %d: %s, alone %d %s", i, a.body, status, solo)
		}
	}
	unchanged(t, s, 4)
}

// TestDrain: a draining server refuses new requests with 503 and
// Retry-After, Drain waits for the admitted ones (bounded by its
// context), and they complete.
func TestDrain(t *testing.T) {
	s, ts, release := held(t, testConfig("tiny"))
	url := ts.URL + "/v1/completions"
	req := `{"model": "tiny", "prompt": "hello", "max_tokens": 5, "temperature": 0}`
	first := postAsync(t, url, req)
	waitStats(t, s, "the request queued", func(st Stats) bool { return st.Queued == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Drain(ctx); err == nil {
		t.Fatal("Drain returned with a request left")
	}
	status, h, body := post(t, url, req)
	checkError(t, "draining", status, body, 503, typeServer, "", "server_draining")
	if h.Get("Retry-After") == "" {
		t.Error("no Retry-After while draining")
	}
	done := make(chan error, 1)
	go func() { done <- s.Drain(context.Background()) }()
	release()
	if a := <-first; a.status != 200 {
		t.Fatalf("admitted request: %d %s", a.status, a.body)
	}
	if err := <-done; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	unchanged(t, s, 1)
}

// TestCloseFailsRequests: Close answers the requests it still has with
// 503 and releases everything.
func TestCloseFailsRequests(t *testing.T) {
	s, ts, _ := held(t, testConfig("tiny"))
	url := ts.URL + "/v1/completions"
	a := postAsync(t, url, `{"model": "tiny", "prompt": "hello", "max_tokens": 5}`)
	b := postAsync(t, url, `{"model": "tiny", "prompt": "hello", "max_tokens": 5, "stream": true}`)
	waitStats(t, s, "two requests queued", func(st Stats) bool { return st.Queued == 2 })
	s.Close()
	got := <-a
	checkError(t, "closed", got.status, got.body, 503, typeServer, "", "server_shutting_down")
	sb := <-b
	if sb.status != 200 || !strings.Contains(string(sb.body), "server_shutting_down") || strings.Contains(string(sb.body), "[DONE]") {
		t.Errorf("stream of a closed server: %d %s", sb.status, sb.body)
	}
	status, _, body := post(t, url, `{"model": "tiny", "prompt": "hello"}`)
	checkError(t, "after close", status, body, 503, typeServer, "", "server_shutting_down")
	if st := s.Stats(); st.Failed != 2 || st.ReservedPages != 0 || st.Running+st.Queued != 0 {
		t.Errorf("stats after close: %+v", st)
	}
}

// TestRequestTimeout: a request past RequestTimeout gets 504 (an error
// event when streaming) and leaves at the next iteration boundary.
func TestRequestTimeout(t *testing.T) {
	cfg := testConfig("tiny")
	cfg.RequestTimeout = 50 * time.Millisecond
	s, ts, release := held(t, cfg)
	url := ts.URL + "/v1/completions"
	a := postAsync(t, url, `{"model": "tiny", "prompt": "hello", "max_tokens": 5}`)
	b := postAsync(t, url, `{"model": "tiny", "prompt": "hello", "max_tokens": 5, "stream": true}`)
	got := <-a
	checkError(t, "timeout", got.status, got.body, 504, typeTimeout, "", "request_timeout")
	sb := <-b
	if sb.status != 200 || !strings.Contains(string(sb.body), `"request_timeout"`) || strings.Contains(string(sb.body), "[DONE]") {
		t.Errorf("stream past its deadline: %d %s", sb.status, sb.body)
	}
	release()
	st := waitStats(t, s, "the timed-out requests gone", func(st Stats) bool { return st.Queued+st.Running == 0 })
	if st.TimedOut != 2 || st.Cancelled != 0 || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries {
		t.Errorf("stats: %+v", st)
	}
}

// TestQueueNoOvertaking: with whole-context reservations (the
// reservation mode it tests: growing ones would start the big request
// beside the first with 7 pages), a request at the head of the queue
// that waits for pages (13 beside a running request's 13, of 20) is not
// overtaken by a small one behind it that would fit now (1 page): the
// small one starts no earlier than the big one, which starts after the
// running one ended.
func TestQueueNoOvertaking(t *testing.T) {
	cfg := testConfig("tiny")
	cfg.CapacityPages, cfg.GrowReservations = 20, false
	s, ts, release, runs := heldRuns(t, cfg)
	url := ts.URL + "/v1/completions"
	bodies := []string{
		`{"model": "tiny", "prompt": "` + strings.Repeat("x", 99) + `", "max_tokens": 100, "temperature": 0}`,
		`{"model": "tiny", "prompt": "` + strings.Repeat("y", 99) + `", "max_tokens": 100, "temperature": 0}`,
		`{"model": "tiny", "prompt": "hi", "max_tokens": 3, "temperature": 0}`,
	}
	var chs []<-chan answer
	for i, b := range bodies {
		chs = append(chs, postAsync(t, url, b))
		waitStats(t, s, fmt.Sprintf("request %d queued", i), func(st Stats) bool { return st.Queued == i+1 })
	}
	release()
	var ids []string
	for i, ch := range chs {
		a := <-ch
		var c Completion
		if a.status != 200 || json.Unmarshal(a.body, &c) != nil {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
		ids = append(ids, c.ID)
	}
	r := runs()
	running, big, small := r[ids[0]], r[ids[1]], r[ids[2]]
	if running.first == 0 || big.first <= running.last {
		t.Errorf("the first ran in iterations %d..%d, the big one behind it from %d: want it to wait for the first's pages", running.first, running.last, big.first)
	}
	if small.first < big.first {
		t.Errorf("the small request started in iteration %d, before the big one ahead of it (%d): overtaken", small.first, big.first)
	}
	waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	unchanged(t, s, 3)
}

// TestQueueWaitsForPages: four concurrent requests whose pages exceed
// the pool together (13 pages each, one of n = 2 taking all 20) are all
// admitted while the scheduler is held, wait in the queue for pages
// once it runs (one request at a time fits), and complete with the
// answers they get alone afterwards; no page is left reserved.
func TestQueueWaitsForPages(t *testing.T) {
	cfg := testConfig("tiny")
	cfg.CapacityPages = 20
	s, ts, release := held(t, cfg)
	url := ts.URL + "/v1/completions"
	var bodies []string
	var chs []<-chan answer
	for i, c := range []string{"a", "b", "c", "d"} {
		n := 1
		if i == 1 {
			n = 2 // 13 pages and 7 for the fork: the whole pool
		}
		bodies = append(bodies, fmt.Sprintf(`{"model": "tiny", "prompt": "%s", "max_tokens": 100, "temperature": 0.7, "seed": %d, "n": %d}`,
			strings.Repeat(c, 99), i, n))
		chs = append(chs, postAsync(t, url, bodies[i]))
	}
	st := waitStats(t, s, "the four requests queued", func(st Stats) bool { return st.Queued == 5 })
	if st.Admitted != 4 || st.Refused != 0 || st.ReservedPages != 0 {
		t.Fatalf("stats with the requests queued: %+v", st)
	}
	release()
	var got []Completion
	for i, ch := range chs {
		a := <-ch
		var c Completion
		if a.status != 200 || json.Unmarshal(a.body, &c) != nil {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
		got = append(got, c)
	}
	for i, b := range bodies {
		status, _, body := post(t, url, b)
		var solo Completion
		if status != 200 || json.Unmarshal(body, &solo) != nil || len(solo.Choices) != len(got[i].Choices) {
			t.Fatalf("alone: %d %s", status, body)
		}
		for k := range solo.Choices {
			if got[i].Choices[k].Text != solo.Choices[k].Text || got[i].Usage.CompletionTokens != solo.Usage.CompletionTokens {
				t.Errorf("request %d choice %d: %q, alone %q", i, k, got[i].Choices[k].Text, solo.Choices[k].Text)
			}
		}
	}
	st = waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	if st.Refused != 0 || st.Completed != 8 {
		t.Errorf("stats %+v: want 8 completed, none refused", st)
	}
	unchanged(t, s, 8)
}
