package completion

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// choiceStream reads a completion or chat stream of several choices
// strictly: each choice's text by index, its finish reason (exactly one),
// whether each chat choice opened with the role alone, and the usage
// chunk.
type choiceStream struct {
	text   map[int]string
	finish map[int]string
	role   map[int]bool
	usage  *Usage
}

func readChoiceStream(t testing.TB, events []string, chat bool) choiceStream {
	t.Helper()
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", events)
	}
	cs := choiceStream{text: map[int]string{}, finish: map[int]string{}, role: map[int]bool{}}
	for _, e := range events[:len(events)-1] {
		dec := json.NewDecoder(bytes.NewReader([]byte(e)))
		dec.DisallowUnknownFields()
		var idx int
		var text string
		var fin *string
		if chat {
			var c ChatCompletion
			if err := dec.Decode(&c); err != nil {
				t.Fatalf("chunk %s: %v", e, err)
			}
			if c.Usage != nil {
				cs.usage = c.Usage
				continue
			}
			if len(c.Choices) != 1 || c.Choices[0].Delta == nil {
				t.Fatalf("chunk %s: want one choice with a delta", e)
			}
			ch := c.Choices[0]
			idx, text, fin = ch.Index, ch.Delta.Content, ch.FinishReason
			if ch.Delta.Role != "" {
				if _, seen := cs.text[idx]; seen || cs.role[idx] || text != "" {
					t.Fatalf("chunk %s: the role after choice %d's text or twice", e, idx)
				}
				cs.role[idx] = true
			}
		} else {
			var c Completion
			if err := dec.Decode(&c); err != nil {
				t.Fatalf("chunk %s: %v", e, err)
			}
			if c.Usage != nil {
				cs.usage = c.Usage
				continue
			}
			if len(c.Choices) != 1 {
				t.Fatalf("chunk %s: %d choices", e, len(c.Choices))
			}
			idx, text, fin = c.Choices[0].Index, c.Choices[0].Text, c.Choices[0].FinishReason
		}
		if _, done := cs.finish[idx]; done {
			t.Fatalf("chunk %s after choice %d's finish", e, idx)
		}
		cs.text[idx] += text
		if fin != nil {
			cs.finish[idx] = *fin
		}
	}
	return cs
}

// postStream posts a streamed request to path and returns its events.
func postStream(t testing.TB, url string, req map[string]any) []string {
	t.Helper()
	b, _ := json.Marshal(req)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		t.Fatalf("stream status %d: %s", resp.StatusCode, buf.String())
	}
	return sseEvents(t, resp.Body)
}

// with returns a copy of req with the given fields set.
func with(req map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range req {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// TestChoicesMatchSolo: n > 1 samples every choice independently, choice
// i with seed + i, so each choice's text and finish equal a request of
// n = 1 with that seed (prompts of 20 tokens, a partial tail page forked,
// and of 32 ids, page-aligned); the usage counts the prompt once and
// every choice's tokens and pages; the prompt is prefilled once; the
// same streamed (each chunk's index, one finish per choice, the same
// usage); greedy choices are all the greedy completion; a chat of n = 2
// likewise, the role opening each choice's stream.
func TestChoicesMatchSolo(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.ChatTemplate = passThrough(t)
	s, ts := startServer(t, m, tok, cfg)
	ids32 := make([]int, 32)
	for i := range ids32 {
		ids32[i] = 'a' + i%26
	}
	const seed = 1234
	for _, prompt := range []any{"The quick brown fox", ids32} {
		base := map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 1.0}
		var solo []Choice
		var want Usage
		for i := range 3 {
			c := complete(t, ts.URL, with(base, "seed", seed+i))
			solo = append(solo, c.Choices[0])
			if i == 0 {
				want.PromptTokens = c.Usage.PromptTokens
			}
			want.CompletionTokens += c.Usage.CompletionTokens
			want.PagesRead += c.Usage.PagesRead
			want.PagesTotal += c.Usage.PagesTotal
		}
		want.TotalTokens = want.PromptTokens + want.CompletionTokens
		if solo[0].Text == solo[1].Text && solo[1].Text == solo[2].Text {
			t.Fatalf("%v: seeds %d..%d sample one text %q: the test shows nothing", prompt, seed, seed+2, solo[0].Text)
		}
		before := s.Stats().PromptTokens
		c := complete(t, ts.URL, with(base, "seed", seed, "n", 3))
		if got := s.Stats().PromptTokens - before; got != uint64(want.PromptTokens-c.Usage.PromptTokensDetails.CachedTokens) {
			t.Errorf("%v: n = 3 prefilled %d prompt tokens, want the prompt's %d once", prompt, got, want.PromptTokens)
		}
		if len(c.Choices) != 3 {
			t.Fatalf("%v: %d choices, want 3", prompt, len(c.Choices))
		}
		for i, ch := range c.Choices {
			if ch.Index != i || ch.Text != solo[i].Text || *ch.FinishReason != *solo[i].FinishReason {
				t.Errorf("%v: choice %d (index %d) %q (%s), want seed %d's %q (%s)", prompt, i, ch.Index, ch.Text, *ch.FinishReason, seed+i, solo[i].Text, *solo[i].FinishReason)
			}
		}
		got := uncached(*c.Usage)
		got.BytesReadVsDense = 0
		if got != want {
			t.Errorf("%v: usage %+v, want %+v", prompt, got, want)
		}
		cs := readChoiceStream(t, postStream(t, ts.URL+"/v1/completions", with(base, "seed", seed, "n", 3, "stream", true,
			"stream_options", map[string]any{"include_usage": true})), false)
		for i := range 3 {
			if cs.text[i] != solo[i].Text || cs.finish[i] != *solo[i].FinishReason {
				t.Errorf("%v: streamed choice %d %q (%s), want %q (%s)", prompt, i, cs.text[i], cs.finish[i], solo[i].Text, *solo[i].FinishReason)
			}
		}
		if len(cs.text) != 3 || cs.usage == nil || uncached(*cs.usage) != uncached(*c.Usage) {
			t.Errorf("%v: streamed %d choices, usage %+v, want 3 and %+v", prompt, len(cs.text), cs.usage, c.Usage)
		}
		// Greedy: every choice is the greedy completion.
		g := complete(t, ts.URL, with(base, "temperature", 0, "max_tokens", 20))
		gn := complete(t, ts.URL, with(base, "temperature", 0, "max_tokens", 20, "n", 4))
		for i, ch := range gn.Choices {
			if ch.Index != i || ch.Text != g.Choices[0].Text {
				t.Errorf("%v: greedy choice %d (index %d) %q, want %q", prompt, i, ch.Index, ch.Text, g.Choices[0].Text)
			}
		}
		if len(gn.Choices) != 4 || gn.Usage.CompletionTokens != 4*g.Usage.CompletionTokens || gn.Usage.PromptTokens != g.Usage.PromptTokens {
			t.Errorf("%v: greedy n = 4: %d choices, usage %+v; n = 1 %+v", prompt, len(gn.Choices), gn.Usage, g.Usage)
		}
	}
	// A chat of n = 2.
	chatReq := map[string]any{"model": "tiny", "messages": []any{map[string]any{"role": "user", "content": "Once upon a time"}},
		"max_tokens": 10, "temperature": 1.0}
	var soloChat []ChatChoice
	for i := range 2 {
		status, _, body := post(t, ts.URL+"/v1/chat/completions", mustJSON(with(chatReq, "seed", seed+i)))
		var c ChatCompletion
		if err := json.Unmarshal(body, &c); err != nil || status != 200 {
			t.Fatalf("chat: %d %s", status, body)
		}
		soloChat = append(soloChat, c.Choices[0])
	}
	status, _, body := post(t, ts.URL+"/v1/chat/completions", mustJSON(with(chatReq, "seed", seed, "n", 2)))
	var cc ChatCompletion
	if err := json.Unmarshal(body, &cc); err != nil || status != 200 || len(cc.Choices) != 2 {
		t.Fatalf("chat n = 2: %d %s", status, body)
	}
	for i, ch := range cc.Choices {
		if ch.Index != i || ch.Message.Content != soloChat[i].Message.Content || ch.Message.Role != "assistant" {
			t.Errorf("chat choice %d (index %d) %q, want %q", i, ch.Index, ch.Message.Content, soloChat[i].Message.Content)
		}
	}
	cs := readChoiceStream(t, postStream(t, ts.URL+"/v1/chat/completions", with(chatReq, "seed", seed, "n", 2, "stream", true)), true)
	for i := range 2 {
		if cs.text[i] != soloChat[i].Message.Content || !cs.role[i] || cs.finish[i] != *soloChat[i].FinishReason {
			t.Errorf("chat stream choice %d: %q role %v (%s), want %q", i, cs.text[i], cs.role[i], cs.finish[i], soloChat[i].Message.Content)
		}
	}
	waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	unchanged(t, s, s.Stats().Admitted)
}

// TestPromptBatch: an array of prompts (strings, or arrays of ids) with
// n = 2 answers prompt-major choices (index = prompt*2 + choice), each
// equal to its solo request with seed + index; the usage counts each
// prompt once.
func TestPromptBatch(t *testing.T) {
	m, tok := tinyModel(t)
	s, ts := startServer(t, m, tok, testConfig("tiny"))
	const seed = -7
	for _, prompts := range [][]any{
		{"ab", "The rain in Spain", "x"},
		{[]int{256, 104, 105}, []int{256, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}},
	} {
		var want []Choice
		prompt := 0
		for i, p := range prompts {
			for c := range 2 {
				k := i*2 + c
				r := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": p, "max_tokens": 8, "temperature": 0.8, "seed": seed + k})
				want = append(want, r.Choices[0])
				if c == 0 {
					prompt += r.Usage.PromptTokens
				}
			}
		}
		c := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": prompts, "max_tokens": 8, "temperature": 0.8, "seed": seed, "n": 2})
		if len(c.Choices) != len(want) {
			t.Fatalf("%v: %d choices, want %d", prompts, len(c.Choices), len(want))
		}
		for k, ch := range c.Choices {
			if ch.Index != k || ch.Text != want[k].Text || *ch.FinishReason != *want[k].FinishReason {
				t.Errorf("%v: choice %d (index %d) %q (%s), want %q (%s)", prompts, k, ch.Index, ch.Text, *ch.FinishReason, want[k].Text, *want[k].FinishReason)
			}
		}
		if c.Usage.PromptTokens != prompt || c.Usage.TotalTokens != prompt+c.Usage.CompletionTokens {
			t.Errorf("%v: usage %+v, want %d prompt tokens", prompts, c.Usage, prompt)
		}
		cs := readChoiceStream(t, postStream(t, ts.URL+"/v1/completions", map[string]any{"model": "tiny", "prompt": prompts, "max_tokens": 8,
			"temperature": 0.8, "seed": seed, "n": 2, "stream": true}), false)
		for k := range want {
			if cs.text[k] != want[k].Text || cs.finish[k] != *want[k].FinishReason {
				t.Errorf("%v: streamed choice %d %q, want %q", prompts, k, cs.text[k], want[k].Text)
			}
		}
	}
	waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	unchanged(t, s, s.Stats().Admitted)
}

// TestChoicesAdmittedTogether: a request's choices are admitted all or
// none: with the scheduler held and one request of n = 2 queued, a
// request of n = 3 past the sequence caps gets 429 though its first
// choices alone would fit, and changes nothing; one of n = 2 whose pages
// do not fit beside the first's (though the running cap has room for
// both) is queued, waits while the first runs and starts only after the
// first has ended (its choices' pages reserved together); then the
// n = 3 one runs.
func TestChoicesAdmittedTogether(t *testing.T) {
	cfg := testConfig("tiny")
	cfg.CapacityPages = 9
	cfg.MaxRunning, cfg.MaxQueued = 4, 0
	s, ts, release, runs := heldRuns(t, cfg)
	url := ts.URL + "/v1/completions"
	// 2 ids + 40 tokens: 3 pages, and 3 for the fork.
	first := postAsync(t, url, `{"model": "tiny", "prompt": "x", "max_tokens": 40, "n": 2, "temperature": 0}`)
	waitStats(t, s, "the first request queued", func(st Stats) bool { return st.Queued == 2 })
	three := `{"model": "tiny", "prompt": "z", "max_tokens": 4, "n": 3}` // 2 + 3 sequences > 4
	status, hdr, body := post(t, url, three)
	checkError(t, three, status, body, 429, typeRateLimit, "", "rate_limit_exceeded")
	if !strings.Contains(string(body), "--max-queued") || hdr.Get("Retry-After") == "" {
		t.Errorf("%s: %s (Retry-After %q), want the message to name --max-queued", three, body, hdr.Get("Retry-After"))
	}
	if st := s.Stats(); st.Admitted != 1 || st.Queued != 2 || st.Running != 0 || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.Refused != 1 {
		t.Errorf("after the refused %s: %+v", three, st)
	}
	// 2 + 2 pages: not beside the first's 6 of 9; it waits for them.
	second := postAsync(t, url, `{"model": "tiny", "prompt": "y", "max_tokens": 20, "n": 2, "temperature": 0}`)
	waitStats(t, s, "the second request queued", func(st Stats) bool { return st.Queued == 4 })
	release()
	var ids []string
	for i, ch := range []<-chan answer{first, second} {
		a := <-ch
		var c Completion
		if err := json.Unmarshal(a.body, &c); err != nil || a.status != 200 || len(c.Choices) != 2 || c.Choices[0].Text != c.Choices[1].Text {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
		ids = append(ids, c.ID)
	}
	r := runs()
	a, b := r[ids[0]], r[ids[1]]
	if a.first == 0 || b.first == 0 || b.first <= a.last {
		t.Errorf("the first ran in iterations %d..%d, the second in %d..%d: want the second to start after the first ended", a.first, a.last, b.first, b.last)
	}
	status, _, b3 := post(t, url, three)
	var c Completion
	if err := json.Unmarshal(b3, &c); err != nil || status != 200 || len(c.Choices) != 3 {
		t.Errorf("%s after the others: %d %s", three, status, b3)
	}
	waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	unchanged(t, s, 3)
	if st := s.Stats(); st.Completed != 3 || st.Refused != 1 {
		t.Errorf("stats %+v: want 3 requests completed (one count per request) and 1 refused", st)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprint(err))
	}
	return string(b)
}

// TestChoicesTightPool: n = 4 on a pool of exactly the pages the
// request reserves (a prompt of 20 tokens, 4 on a tail page the forks
// share until each copies it, and 40 tokens each: 4 + 3 x 3 pages with
// CP 1, 2 + 3 x 2 with CP 2), on the main engine and on an engine of
// the request's own selector: every choice equals its solo request, and
// nothing is left held.
func TestChoicesTightPool(t *testing.T) {
	m, tok := tinyModel(t)
	prompt := "Twenty tokens here." // BOS + 19 bytes
	for _, c := range []struct {
		cp, pages int
		quest     map[string]any
	}{
		{1, 13, nil},
		{2, 8, nil},
		{1, 13, map[string]any{"selector": "oracle"}},
		{2, 8, map[string]any{"selector": "recent", "local": 2}},
	} {
		cfg := testConfig("tiny")
		cfg.CP, cfg.CapacityPages = c.cp, c.pages
		cfg.Policy.BudgetTokens = 32
		s, ts := startServer(t, m, tok, cfg)
		base := map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 1.0}
		if c.quest != nil {
			base["quest"] = c.quest
		}
		var solo []string
		for i := range 4 {
			solo = append(solo, complete(t, ts.URL, with(base, "seed", 77+i)).Choices[0].Text)
		}
		got := complete(t, ts.URL, with(base, "seed", 77, "n", 4))
		for i, ch := range got.Choices {
			if ch.Text != solo[i] {
				t.Errorf("cp %d %v: choice %d %q, solo %q", c.cp, c.quest, i, ch.Text, solo[i])
			}
		}
		if got.Usage.CompletionTokens != 160 {
			t.Errorf("cp %d %v: usage %+v, want 4 x 40 tokens", c.cp, c.quest, got.Usage)
		}
		// One page less and the request could never fit: 400 naming n.
		status, _, body := post(t, ts.URL+"/v1/completions", mustJSON(with(base, "seed", 77, "n", 5)))
		checkError(t, "n = 5 over the pool", status, body, 400, typeInvalid, "n", "invalid_value")
		waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 && st.OwnEnginesOpen == 0 })
		unchanged(t, s, 5)
	}
}

// TestChoicesCancelled: streams of n = 3 (and a batch of two prompts of
// n = 2) whose clients go away after the first chunk, or before any,
// end every choice: no sequence, page or reservation is left, each
// request counts once as cancelled, and no goroutine is left.
func TestChoicesCancelled(t *testing.T) {
	m, tok := tinyModel(t)
	s, ts := startServer(t, m, tok, testConfig("tiny"))
	leaks := goleak.IgnoreCurrent()
	tr := &http.Transport{}
	client := &http.Client{Transport: tr}
	bodies := []string{
		`{"model": "tiny", "prompt": "Tell me a long story.", "max_tokens": 2000, "temperature": 0.5, "n": 3, "stream": true}`,
		`{"model": "tiny", "prompt": ["one", "two"], "max_tokens": 2000, "n": 2, "stream": true}`,
	}
	cancelled := 0
	for _, body := range bodies {
		for _, firstChunk := range []bool{true, false} {
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if firstChunk {
				line, err := bufio.NewReader(resp.Body).ReadString('\n')
				if err != nil || !strings.HasPrefix(line, "data: ") {
					t.Fatalf("first line %q: %v", line, err)
				}
			}
			cancel()
			resp.Body.Close()
			cancelled++
			waitStats(t, s, "the cancelled request ended", func(st Stats) bool {
				return st.Cancelled == uint64(cancelled) && st.Running+st.Queued == 0
			})
		}
	}
	tr.CloseIdleConnections()
	waitStats(t, s, "nothing held", func(st Stats) bool { return st.EngineSequences == st.PrefixCacheEntries })
	unchanged(t, s, uint64(cancelled))
	if st := s.Stats(); st.Completed != 0 || st.Failed != 0 {
		t.Errorf("stats %+v: want every request cancelled once", st)
	}
	goleak.VerifyNone(t, leaks)
}

// TestChoicesObserved: Config.Observe sees a request of n = 3 once, with
// its usage, the first token of any choice and every choice's
// inter-token times; a request of n = 3 whose deadline passes while it
// is queued (its first choice ends first, failing the forks waiting for
// its prompt) is seen once too, as timed out.
func TestChoicesObserved(t *testing.T) {
	cfg := testConfig("tiny")
	// Observe runs after the answer and after the counters move, so the
	// test waits for the timings themselves.
	observed := make(chan RequestTiming, 4)
	cfg.Observe = func(rt RequestTiming) { observed <- rt }
	cfg.RequestTimeout = 300 * time.Millisecond
	s, ts, release := held(t, cfg)
	// Its deadline passes while it is queued: the handler answers the
	// stream's error event; then the scheduler finds the choices gone.
	events := postStream(t, ts.URL+"/v1/completions", map[string]any{"model": "tiny", "prompt": "gone", "max_tokens": 5, "n": 3, "stream": true})
	if len(events) != 1 || !strings.Contains(events[0], "request_timeout") {
		t.Fatalf("the queued request's stream: %q", events)
	}
	release()
	waitStats(t, s, "the timed-out request ended", func(st Stats) bool { return st.TimedOut == 1 && st.Cancelled == 0 && st.Running+st.Queued == 0 })
	c := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": "abc", "max_tokens": 5, "n": 3, "temperature": 0})
	var seen []RequestTiming
	for len(seen) < 2 {
		select {
		case rt := <-observed:
			seen = append(seen, rt)
		case <-time.After(10 * time.Second):
			t.Fatalf("observed %d timings in 10 s, want one per request: %+v", len(seen), seen)
		}
	}
	select {
	case rt := <-observed:
		t.Fatalf("a third timing for two requests: %+v", rt)
	case <-time.After(100 * time.Millisecond):
	}
	if seen[0].Outcome != "timeout" {
		t.Errorf("timed-out n = 3: %+v", seen[0])
	}
	rt := seen[1]
	if rt.ID != c.ID || rt.Outcome != "completed" || rt.Usage != *c.Usage || rt.FirstToken <= 0 || len(rt.InterToken) != 3*4 {
		t.Errorf("n = 3: %+v, want id %s, usage %+v, 12 inter-token times", rt, c.ID, *c.Usage)
	}
}
