package completion

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestLogprobOf: the log-softmax of random logits against a float64
// reference, and the top ids in order (ties by the lower id).
func TestLogprobOf(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for trial := range 50 {
		n := 1 + rng.IntN(600)
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = float32(math.Round(rng.NormFloat64()*4) / 2) // ties
		}
		id, top := rng.IntN(n), rng.IntN(8)
		var z float64
		for _, l := range logits {
			z += math.Exp(float64(l))
		}
		want := float64(logits[id]) - math.Log(z)
		lp, ids, lps := logprobOf(logits, id, top)
		if math.Abs(lp-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Fatalf("trial %d: logprob %v, float64 %v", trial, lp, want)
		}
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
		if top > n {
			top = n
		}
		if !slices.Equal(ids, order[:top]) && !(top == 0 && ids == nil) {
			t.Fatalf("trial %d: top %d ids %v, want %v", trial, top, ids, order[:top])
		}
		for k, i := range ids {
			if w := float64(logits[i]) - math.Log(z); math.Abs(lps[k]-w) > 1e-9*math.Max(1, math.Abs(w)) {
				t.Fatalf("trial %d: top %d logprob %v, float64 %v", trial, k, lps[k], w)
			}
		}
	}
}

// TestLogprobs: a greedy completion of the passkey prompt with logprobs 3
// gives one entry per token whose texts make the completion's text, whose
// offsets add up, and whose log-probability is the top alternative's (the
// greedy token is the most likely), every one <= 0; the same streamed, and
// as a chat (logprobs true, top_logprobs 2, bytes); bad values are 400.
func TestLogprobs(t *testing.T) {
	m, tok, mdir := passkeyModel(t)
	name := filepath.Base(mdir)
	cfg := testConfig(name)
	cfg.ChatTemplate = passThrough(t)
	s, ts := startServer(t, m, tok, cfg)
	prompt, key := passkeyPrompt(t, mdir)
	c := complete(t, ts.URL, map[string]any{"model": name, "prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 3})
	lp := c.Choices[0].Logprobs
	if c.Choices[0].Text != key || lp == nil || len(lp.Tokens) != 5 || strings.Join(lp.Tokens, "") != key || len(lp.TopLogprobs) != 5 {
		t.Fatalf("completion %q logprobs %+v", c.Choices[0].Text, lp)
	}
	off := 0
	for i, tk := range lp.Tokens {
		best, bestText := math.Inf(-1), ""
		for text, v := range lp.TopLogprobs[i] {
			if v > best {
				best, bestText = v, text
			}
		}
		if *lp.TokenLogprobs[i] > 0 || lp.TextOffset[i] != off || len(lp.TopLogprobs[i]) != 3 || bestText != tk || best != *lp.TokenLogprobs[i] {
			t.Errorf("token %d %q: logprob %v offset %d top %v", i, tk, lp.TokenLogprobs[i], lp.TextOffset[i], lp.TopLogprobs[i])
		}
		off += len(tk)
	}
	// Streamed: the entries come with their text, chunk by chunk.
	b, _ := json.Marshal(map[string]any{"model": name, "prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 0, "stream": true})
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	events := sseEvents(t, resp.Body)
	resp.Body.Close()
	var toks []string
	var lps []float64
	for _, e := range events[:len(events)-1] {
		var ch Completion
		if err := json.Unmarshal([]byte(e), &ch); err != nil {
			t.Fatal(err)
		}
		if len(ch.Choices) == 1 && ch.Choices[0].Logprobs != nil {
			l := ch.Choices[0].Logprobs
			if strings.Join(l.Tokens, "") != ch.Choices[0].Text || l.TopLogprobs != nil {
				t.Errorf("chunk %s: tokens %q for text %q (top %v, want null with logprobs 0)", e, l.Tokens, ch.Choices[0].Text, l.TopLogprobs)
			}
			toks, lps = append(toks, l.Tokens...), append(lps, values(l.TokenLogprobs)...)
		}
	}
	if strings.Join(toks, "") != key || !slices.Equal(lps, values(lp.TokenLogprobs)) {
		t.Errorf("streamed tokens %q logprobs %v, want %q %v", toks, lps, key, lp.TokenLogprobs)
	}
	// A stop string that holds bytes back: the streamed entries and
	// offsets equal the answer's (entries may cover text the stop cut).
	stop := key[2:4]
	whole := complete(t, ts.URL, map[string]any{"model": name, "prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 1, "stop": stop})
	b, _ = json.Marshal(map[string]any{"model": name, "prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 1, "stop": stop, "stream": true})
	resp, err = http.Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	events = sseEvents(t, resp.Body)
	resp.Body.Close()
	var offs []int
	toks = nil
	for _, e := range events[:len(events)-1] {
		var ch Completion
		if err := json.Unmarshal([]byte(e), &ch); err != nil {
			t.Fatal(err)
		}
		if len(ch.Choices) == 1 && ch.Choices[0].Logprobs != nil {
			offs = append(offs, ch.Choices[0].Logprobs.TextOffset...)
			toks = append(toks, ch.Choices[0].Logprobs.Tokens...)
			for i, tk := range ch.Choices[0].Logprobs.Tokens {
				if top := ch.Choices[0].Logprobs.TopLogprobs[i]; len(top) != 1 || !mapHas(top, tk) {
					t.Errorf("streamed token %q: top %v, want the token itself", tk, top)
				}
			}
		}
	}
	wl := whole.Choices[0].Logprobs
	if whole.Choices[0].Text != key[:2] || !slices.Equal(offs, wl.TextOffset) || !slices.Equal(toks, wl.Tokens) || !slices.Equal(wl.TextOffset, []int{0, 1, 2, 3}) {
		t.Errorf("stop %q: text %q, streamed offsets %v tokens %q, answer's %v %q (want offsets 0..3)", stop, whole.Choices[0].Text, offs, toks, wl.TextOffset, wl.Tokens)
	}
	// A chat.
	b, _ = json.Marshal(map[string]any{"model": name, "messages": []any{map[string]any{"role": "user", "content": prompt}},
		"max_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 2})
	status, _, body := post(t, ts.URL+"/v1/chat/completions", string(b))
	var cc ChatCompletion
	if err := json.Unmarshal(body, &cc); err != nil || status != 200 || cc.Choices[0].Logprobs == nil {
		t.Fatalf("chat: %d %s", status, body)
	}
	content := cc.Choices[0].Logprobs.Content
	if len(content) != 5 {
		t.Fatalf("chat logprobs of %d tokens, want 5", len(content))
	}
	for i, e := range content {
		if e.Token != lp.Tokens[i] || e.Logprob != *lp.TokenLogprobs[i] || !slices.Equal(e.Bytes, textBytes(e.Token)) || len(e.TopLogprobs) != 2 ||
			e.TopLogprobs[0].Token != e.Token || e.TopLogprobs[0].Logprob != e.Logprob || e.TopLogprobs[1].Logprob > e.Logprob {
			t.Errorf("chat token %d: %+v, want %q %v", i, e, lp.Tokens[i], lp.TokenLogprobs[i])
		}
	}
	// 20 alternatives (vLLM's bound), distinct, most likely first in
	// value, the greedy token's the best.
	c20 := complete(t, ts.URL, map[string]any{"model": name, "prompt": prompt, "max_tokens": 2, "temperature": 0, "logprobs": 20})
	for i, top := range c20.Choices[0].Logprobs.TopLogprobs {
		best := math.Inf(-1)
		for _, v := range top {
			best = max(best, v)
		}
		if len(top) != 20 || best != *c20.Choices[0].Logprobs.TokenLogprobs[i] {
			t.Errorf("logprobs 20: token %d has %d alternatives, best %v, its own %v", i, len(top), best, *c20.Choices[0].Logprobs.TokenLogprobs[i])
		}
	}
	// Without logprobs: null.
	if c := complete(t, ts.URL, map[string]any{"model": name, "prompt": "x", "max_tokens": 1}); c.Choices[0].Logprobs != nil {
		t.Errorf("logprobs without asking: %+v", c.Choices[0].Logprobs)
	}
	for _, bad := range []struct{ path, body, param string }{
		{"/v1/completions", `{"model": "` + name + `", "prompt": "x", "logprobs": 21}`, "logprobs"},
		{"/v1/completions", `{"model": "` + name + `", "prompt": "x", "logprobs": true}`, "logprobs"},
		{"/v1/chat/completions", `{"model": "` + name + `", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}`, "top_logprobs"},
		{"/v1/chat/completions", `{"model": "` + name + `", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}`, "top_logprobs"},
	} {
		status, _, body := post(t, ts.URL+bad.path, bad.body)
		var e ErrorBody
		if err := json.Unmarshal(body, &e); err != nil || status != 400 || e.Error.Param == nil || *e.Error.Param != bad.param {
			t.Errorf("%s %s: %d %s, want 400 naming %s", bad.path, bad.body, status, body, bad.param)
		}
	}
	waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
}

// values dereferences token_logprobs (NaN for a null).
func values(ps []*float64) []float64 {
	out := make([]float64, len(ps))
	for i, p := range ps {
		out[i] = math.NaN()
		if p != nil {
			out[i] = *p
		}
	}
	return out
}
