package completion

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/model"
)

// record fetches the kept record of a finished request (GET
// /admin/requests/{id}).
func record(t *testing.T, url, id string) RequestRecord {
	t.Helper()
	resp, err := http.Get(url + "/admin/requests/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/requests/%s: status %d: %s", id, resp.StatusCode, b)
	}
	var r RequestRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("record %s: %v", b, err)
	}
	return r
}

// errParam is the param of an error answer's body.
func errParam(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			Param string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Errorf("error body %s: %v", body, err)
	}
	return e.Error.Param
}

// TestStopTokenIDs: stop_token_ids ends a completion at the first
// generated token among them, as EOS does: a greedy completion asked to
// stop at its own i-th token (one it did not produce before) returns the
// text of the tokens before it, finish_reason stop, that token counted
// in completion_tokens, in a stream too; ids it never generates change
// nothing; the ids are recorded, sorted and without repeats; bad values
// get 400 naming the field.
func TestStopTokenIDs(t *testing.T) {
	m, tok := tinyModel(t)
	_, ts := startServer(t, m, tok, testConfig("tiny"))
	base := map[string]any{"model": "tiny", "prompt": "Stop me when you can.", "max_tokens": 12, "temperature": 0}
	plain := complete(t, ts.URL, base)
	out := record(t, ts.URL, plain.ID).OutputTokens
	if plain.Choices[0].FinishReason == nil || *plain.Choices[0].FinishReason != "length" || len(out) != 12 {
		t.Fatalf("greedy completion: finish %v, %d tokens; want length after 12 (a tiny random model: pick another prompt)", plain.Choices[0].FinishReason, len(out))
	}
	at := -1 // the first token (past the first) not generated before it
	for i := 1; i < len(out); i++ {
		if !slices.Contains(out[:i], out[i]) {
			at = i
			break
		}
	}
	if at < 0 {
		t.Fatalf("greedy tokens %v repeat one token: pick another prompt", out)
	}
	// The text of the tokens before the stop token: the completion of
	// as many tokens.
	wantText := complete(t, ts.URL, with(base, "max_tokens", at)).Choices[0].Text
	var never int // a token id the completion never generated
	for slices.Contains(out, never) {
		never++
	}
	stopped := complete(t, ts.URL, with(base, "stop_token_ids", []int{never, out[at], never}))
	ch := stopped.Choices[0]
	if ch.Text != wantText || ch.FinishReason == nil || *ch.FinishReason != "stop" || stopped.Usage.CompletionTokens != at+1 {
		t.Fatalf("stop_token_ids [%d] (token %d of %v): text %q finish %v completion_tokens %d; want %q, stop, %d",
			out[at], at, out, ch.Text, ch.FinishReason, stopped.Usage.CompletionTokens, wantText, at+1)
	}
	if rec := record(t, ts.URL, stopped.ID); !slices.Equal(rec.Settings.StopTokenIDs, slices.Sorted(slices.Values([]int{never, out[at]}))) ||
		!slices.Equal(rec.OutputTokens, out[:at+1]) {
		t.Errorf("record: stop_token_ids %v output %v; want the ids sorted without repeats, output %v", rec.Settings.StopTokenIDs, rec.OutputTokens, out[:at+1])
	}
	// A stream stops alike.
	b, _ := json.Marshal(with(with(base, "stop_token_ids", []int{out[at]}), "stream", true))
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	text, finish, _ := streamText(t, sseEvents(t, resp.Body))
	resp.Body.Close()
	if text != wantText || finish != "stop" {
		t.Errorf("stream: text %q finish %q; want %q, stop", text, finish, wantText)
	}
	// Ids never generated: the plain completion.
	same := complete(t, ts.URL, with(base, "stop_token_ids", []int{never}))
	if same.Choices[0].Text != plain.Choices[0].Text || *same.Choices[0].FinishReason != "length" {
		t.Errorf("stop_token_ids [%d] (never generated): %q %v; want %q length", never, same.Choices[0].Text, *same.Choices[0].FinishReason, plain.Choices[0].Text)
	}
	vocab := m.Config.VocabSize
	for _, c := range []struct{ value, param string }{
		{`"7"`, "stop_token_ids"},
		{`7`, "stop_token_ids"},
		{`[1.5]`, "stop_token_ids[0]"},
		{`[3, null]`, "stop_token_ids[1]"},
		{`[3, "4"]`, "stop_token_ids[1]"},
		{`[-1]`, "stop_token_ids"},
		{fmt.Sprintf(`[%d]`, vocab), "stop_token_ids"},
	} {
		body := fmt.Sprintf(`{"model": "tiny", "prompt": "x", "stop_token_ids": %s}`, c.value)
		status, _, b := post(t, ts.URL+"/v1/completions", body)
		if status != http.StatusBadRequest || errParam(t, b) != c.param {
			t.Errorf("stop_token_ids %s: status %d %s; want 400 naming %s", c.value, status, b, c.param)
		}
	}
}

// TestTruncatePromptTokens: truncate_prompt_tokens k answers as the
// prompt's last k tokens given as ids do (text, log-probabilities,
// prompt_tokens k; echo returns the kept tokens' text); a prompt of at
// most k tokens is unchanged; -1 truncates to max_model_len, so that a
// prompt longer than the context is admitted with room left for the
// completion only when k leaves it; bad values get 400 naming the field.
func TestTruncatePromptTokens(t *testing.T) {
	m, tok := loadModel(t, writeTinyModel(t, "tiny", 96))
	_, ts := startServer(t, m, tok, testConfig("tiny"))
	prompt := strings.Repeat("A long prompt whose start is cut. ", 2) // 69 tokens with BOS
	ids := model.PromptIDs(tok, prompt)
	const k = 20
	base := map[string]any{"model": "tiny", "max_tokens": 5, "temperature": 0, "logprobs": 1}
	want := complete(t, ts.URL, with(base, "prompt", ids[len(ids)-k:]))
	got := complete(t, ts.URL, with(with(base, "prompt", prompt), "truncate_prompt_tokens", k))
	if got.Usage.PromptTokens != k || got.Choices[0].Text != want.Choices[0].Text ||
		!slices.EqualFunc(got.Choices[0].Logprobs.TokenLogprobs, want.Choices[0].Logprobs.TokenLogprobs, func(a, b *float64) bool { return *a == *b }) {
		t.Fatalf("truncate_prompt_tokens %d: prompt_tokens %d text %q logprobs %v; the last %d ids give %q %v",
			k, got.Usage.PromptTokens, got.Choices[0].Text, got.Choices[0].Logprobs.TokenLogprobs, k, want.Choices[0].Text, want.Choices[0].Logprobs.TokenLogprobs)
	}
	echo := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": prompt, "truncate_prompt_tokens": k, "max_tokens": 5, "temperature": 0, "echo": true})
	if kept := tok.Decode(ids[len(ids)-k:]); echo.Choices[0].Text != kept+want.Choices[0].Text {
		t.Errorf("echo with truncate_prompt_tokens %d: %q; want the kept tokens' text %q then %q", k, echo.Choices[0].Text, kept, want.Choices[0].Text)
	}
	whole := complete(t, ts.URL, with(base, "prompt", prompt))
	longer := complete(t, ts.URL, with(with(base, "prompt", prompt), "truncate_prompt_tokens", len(ids)))
	if longer.Usage.PromptTokens != len(ids) || longer.Choices[0].Text != whole.Choices[0].Text {
		t.Errorf("truncate_prompt_tokens %d (the prompt's length): prompt_tokens %d text %q; want %d, %q", len(ids), longer.Usage.PromptTokens, longer.Choices[0].Text, len(ids), whole.Choices[0].Text)
	}
	// A prompt over the context (96): refused whole, admitted cut.
	over := strings.Repeat("x", 150)
	status, _, b := post(t, ts.URL+"/v1/completions", fmt.Sprintf(`{"model": "tiny", "prompt": %q, "max_tokens": 5}`, over))
	if status != http.StatusBadRequest || !strings.Contains(string(b), "context_length_exceeded") {
		t.Fatalf("a prompt of 151 tokens over a context of 96: status %d %s; want 400 context_length_exceeded", status, b)
	}
	cut := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": over, "max_tokens": 5, "truncate_prompt_tokens": 91})
	if cut.Usage.PromptTokens != 91 || cut.Usage.CompletionTokens < 1 {
		t.Errorf("truncate_prompt_tokens 91: usage %+v; want 91 prompt tokens and a completion", cut.Usage)
	}
	// -1 keeps max_model_len tokens: no room for max_tokens then.
	status, _, b = post(t, ts.URL+"/v1/completions", fmt.Sprintf(`{"model": "tiny", "prompt": %q, "max_tokens": 5, "truncate_prompt_tokens": -1}`, over))
	if status != http.StatusBadRequest || !strings.Contains(string(b), "context_length_exceeded") || !strings.Contains(string(b), "96 in your prompt") {
		t.Errorf("truncate_prompt_tokens -1 with max_tokens 5: status %d %s; want 400 context_length_exceeded for a prompt of 96", status, b)
	}
	for _, c := range []string{`0`, `-2`, `97`, `"5"`, `2.5`} {
		status, _, b := post(t, ts.URL+"/v1/completions", fmt.Sprintf(`{"model": "tiny", "prompt": "x", "truncate_prompt_tokens": %s}`, c))
		if status != http.StatusBadRequest || errParam(t, b) != "truncate_prompt_tokens" {
			t.Errorf("truncate_prompt_tokens %s: status %d %s; want 400 naming truncate_prompt_tokens", c, status, b)
		}
	}
}

// TestTopKMinP: top_k and min_p restrict sampling as vLLM's: with top_k
// 1, or min_p 1, a sampled completion (temperature 1.5) is the greedy
// one; with top_k 3 every sampled token of a chat of n = 2 is among the 3
// most likely of its step (its logprobs' 3 alternatives, by bytes and
// log-probability); with min_p 0.2 at temperature 1 every token is at
// least 0.2 times as likely as the most likely; neither is named
// ignored; bad values get 400 naming the field.
func TestTopKMinP(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.ChatTemplate = passThrough(t)
	_, ts := startServer(t, m, tok, cfg)
	base := map[string]any{"model": "tiny", "prompt": "Pick among the likely ones.", "max_tokens": 16, "seed": 5}
	greedy := complete(t, ts.URL, with(base, "temperature", 0)).Choices[0].Text
	for _, f := range []map[string]any{{"top_k": 1}, {"min_p": 1}} {
		req := with(base, "temperature", 1.5)
		for k, v := range f {
			req[k] = v
		}
		if got := complete(t, ts.URL, req).Choices[0].Text; got != greedy {
			t.Errorf("%v at temperature 1.5: %q, want the greedy %q", f, got, greedy)
		}
	}
	free := complete(t, ts.URL, with(base, "temperature", 1.5)).Choices[0].Text
	if free == greedy {
		t.Fatalf("temperature 1.5 without top_k gives the greedy text %q: pick another seed", free)
	}
	b, _ := json.Marshal(map[string]any{"model": "tiny", "messages": []map[string]any{{"role": "user", "content": "Pick among the likely ones."}},
		"max_tokens": 16, "seed": 5, "temperature": 1.5, "top_k": 3, "logprobs": true, "top_logprobs": 3, "n": 2})
	status, h, body := post(t, ts.URL+"/v1/chat/completions", string(b))
	var chat ChatCompletion
	if err := json.Unmarshal(body, &chat); err != nil || status != http.StatusOK || h.Get(IgnoredFieldsHeader) != "" || len(chat.Choices) != 2 {
		t.Fatalf("chat with top_k 3: %d %s, ignored %q", status, body, h.Get(IgnoredFieldsHeader))
	}
	for _, ch := range chat.Choices {
		for i, e := range ch.Logprobs.Content {
			if !slices.ContainsFunc(e.TopLogprobs, func(a ChatTopLogprob) bool { return slices.Equal(a.Bytes, e.Bytes) && a.Logprob == e.Logprob }) {
				t.Errorf("top_k 3, choice %d token %d %q (logprob %v) is not among the 3 most likely %+v", ch.Index, i, e.Token, e.Logprob, e.TopLogprobs)
			}
		}
	}
	c := complete(t, ts.URL, with(base, "temperature", 1, "min_p", 0.2, "logprobs", 1, "max_tokens", 32))
	lp := c.Choices[0].Logprobs
	for i := range lp.Tokens {
		best := math.Inf(-1)
		for _, v := range lp.TopLogprobs[i] {
			best = max(best, v)
		}
		if *lp.TokenLogprobs[i] < best+math.Log(0.2)-1e-6 {
			t.Errorf("min_p 0.2, token %d %q: logprob %v under the most likely's %v + ln 0.2", i, lp.Tokens[i], *lp.TokenLogprobs[i], best)
		}
	}
	for _, c := range []struct{ field, value string }{
		{"top_k", "-2"}, {"top_k", "1.5"}, {"top_k", `"5"`},
		{"min_p", "-0.1"}, {"min_p", "1.5"}, {"min_p", `"x"`},
	} {
		status, _, b := post(t, ts.URL+"/v1/completions", fmt.Sprintf(`{"model": "tiny", "prompt": "x", %q: %s}`, c.field, c.value))
		if status != http.StatusBadRequest || errParam(t, b) != c.field {
			t.Errorf("%s %s: %d %s; want 400 naming %s", c.field, c.value, status, b, c.field)
		}
	}
}

// TestStatsPagesRead: Stats.PagesRead and PagesTotal are the finished
// requests' usage pages_read and pages_total summed (n = 2's usage
// counts both choices), the sparse budget reading fewer than dense.
func TestStatsPagesRead(t *testing.T) {
	m, tok := tinyModel(t)
	s, ts := startServer(t, m, tok, testConfig("tiny"))
	long := strings.Repeat("pages to choose among, ", 20)
	var read, total int
	for _, req := range []map[string]any{
		{"model": "tiny", "prompt": long, "max_tokens": 8, "temperature": 0, "quest": map[string]any{"budget": 32, "dense_layers": 0}},
		{"model": "tiny", "prompt": "short", "max_tokens": 5, "n": 2, "seed": 1},
	} {
		u := complete(t, ts.URL, req).Usage
		read, total = read+u.PagesRead, total+u.PagesTotal
	}
	st := waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	if st.PagesRead != uint64(read) || st.PagesTotal != uint64(total) || read >= total {
		t.Errorf("Stats pages read %d of %d; the usages' %d of %d (want equal, fewer read than dense)", st.PagesRead, st.PagesTotal, read, total)
	}
}
