package completion

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/questrt/questrt/model"
)

// TestEcho: echo prepends the prompt to the text; with logprobs the
// prompt's tokens come first, the first with null log-probability and
// alternatives, the others equal to a float64 log-softmax of the logits
// of a prefill whose attention is the float64 reference (model.Reference)
// within 1e-4, each token among its alternatives, the offsets running
// over the echoed text; the completion's entries follow unchanged. A
// prompt longer than a prefill chunk, n = 2, a stream, a batch of prompts
// of ids and max_tokens 0 (the prompt scored alone) give the same
// entries.
func TestEcho(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.ChunkTokens = 7 // the prompt's log-probabilities come from several chunks
	s, ts := startServer(t, m, tok, cfg)
	prompt := "Echo me back, please."
	ids := model.PromptIDs(tok, prompt)
	// The float64 reference: every position's logits with a float64
	// attention, log-softmax in float64.
	logits, err := m.Forward(context.Background(), model.NewReference(m.Geometry()), ids, model.ForwardOptions{AllLogits: true})
	if err != nil {
		t.Fatal(err)
	}
	v := m.Config.VocabSize
	ref := func(pos int) float64 { // log p(ids[pos] | ids[:pos])
		row := logits[(pos-1)*v : pos*v]
		mx := math.Inf(-1)
		for _, l := range row {
			mx = max(mx, float64(l))
		}
		var z float64
		for _, l := range row {
			z += math.Exp(float64(l) - mx)
		}
		return float64(row[ids[pos]]) - mx - math.Log(z)
	}
	base := map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0}
	plain := complete(t, ts.URL, with(base, "logprobs", 2))
	worst := 0.0 // the largest prompt log-probability error seen
	check := func(what string, ch Choice, maxTokens int) {
		t.Helper()
		want := prompt
		if maxTokens > 0 {
			want += plain.Choices[0].Text
		}
		lp := ch.Logprobs
		if ch.Text != want || lp == nil {
			t.Fatalf("%s: text %q (logprobs %v), want %q", what, ch.Text, lp, want)
		}
		n := len(ids) + min(maxTokens, len(plain.Choices[0].Logprobs.Tokens))
		if len(lp.Tokens) != n || len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n || len(lp.TextOffset) != n {
			t.Fatalf("%s: %d tokens, %d logprobs, %d top, %d offsets; want %d", what, len(lp.Tokens), len(lp.TokenLogprobs), len(lp.TopLogprobs), len(lp.TextOffset), n)
		}
		if lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil || lp.Tokens[0] != "" {
			t.Errorf("%s: the first prompt token (BOS) %q: logprob %v top %v, want null", what, lp.Tokens[0], lp.TokenLogprobs[0], lp.TopLogprobs[0])
		}
		// The prompt's tokens (ASCII here), then the completion's as
		// without echo, their offsets after the prompt's.
		pl := plain.Choices[0].Logprobs
		off := 0
		for i := range n {
			if i >= len(ids) {
				k := i - len(ids)
				if lp.Tokens[i] != pl.Tokens[k] || *lp.TokenLogprobs[i] != *pl.TokenLogprobs[k] || lp.TextOffset[i] != len(prompt)+pl.TextOffset[k] {
					t.Errorf("%s: completion token %d %q logprob %v offset %d, without echo %q %v at %d", what, k, lp.Tokens[i], *lp.TokenLogprobs[i],
						lp.TextOffset[i], pl.Tokens[k], *pl.TokenLogprobs[k], pl.TextOffset[k])
				}
				continue
			}
			if lp.TextOffset[i] != off || lp.Tokens[i] != tok.Decode(ids[i:i+1]) {
				t.Errorf("%s: prompt token %d %q at %d, want %q at %d", what, i, lp.Tokens[i], lp.TextOffset[i], tok.Decode(ids[i:i+1]), off)
			}
			off += len(lp.Tokens[i])
			if i == 0 {
				continue
			}
			got := *lp.TokenLogprobs[i]
			worst = max(worst, math.Abs(got-ref(i)))
			if w := ref(i); math.Abs(got-w) > 1e-4 {
				t.Errorf("%s: prompt token %d %q: logprob %v, float64 reference %v", what, i, lp.Tokens[i], got, w)
			}
			if top := lp.TopLogprobs[i]; len(top) < 2 || len(top) > 3 || !mapHas(top, lp.Tokens[i]) || top[lp.Tokens[i]] != got {
				t.Errorf("%s: prompt token %d %q: top %v, want 2 alternatives and the token", what, i, lp.Tokens[i], top)
			}
		}
		if off != len(prompt) {
			t.Errorf("%s: the prompt's tokens cover %d bytes, want %d", what, off, len(prompt))
		}
	}
	c := complete(t, ts.URL, with(base, "logprobs", 2, "echo", true))
	check("echo", c.Choices[0], 6)
	if c.Usage.PromptTokens != len(ids) || c.Usage.CompletionTokens != plain.Usage.CompletionTokens {
		t.Errorf("echo usage %+v, want %d prompt tokens", c.Usage, len(ids))
	}
	two := complete(t, ts.URL, with(base, "logprobs", 2, "echo", true, "n", 2))
	for i, ch := range two.Choices {
		check("n = 2, choice "+string(rune('0'+i)), ch, 6)
	}
	// Streamed: the prompt and its entries in the first chunk, the
	// offsets running on.
	events := postStream(t, ts.URL+"/v1/completions", with(base, "logprobs", 2, "echo", true, "stream", true))
	var streamed Choice
	streamed.Logprobs = &CompletionLogprobs{}
	for _, e := range events[:len(events)-1] {
		var ch Completion
		if err := jsonStrict(e, &ch); err != nil {
			t.Fatalf("chunk %s: %v", e, err)
		}
		streamed.Text += ch.Choices[0].Text
		if l := ch.Choices[0].Logprobs; l != nil {
			sl := streamed.Logprobs
			sl.Tokens, sl.TokenLogprobs = append(sl.Tokens, l.Tokens...), append(sl.TokenLogprobs, l.TokenLogprobs...)
			sl.TopLogprobs, sl.TextOffset = append(sl.TopLogprobs, l.TopLogprobs...), append(sl.TextOffset, l.TextOffset...)
		}
	}
	if !strings.HasPrefix(events[0], `{"id"`) || !strings.Contains(events[0], `"text":"`+prompt) {
		t.Errorf("first chunk %s: want the prompt", events[0])
	}
	check("stream", streamed, 6)
	// The prompt scored alone.
	zero := complete(t, ts.URL, with(base, "logprobs", 2, "echo", true, "max_tokens", 0))
	check("max_tokens 0", zero.Choices[0], 0)
	if zero.Usage.CompletionTokens != 0 || *zero.Choices[0].FinishReason != "length" {
		t.Errorf("max_tokens 0: usage %+v finish %s", zero.Usage, *zero.Choices[0].FinishReason)
	}
	// A batch of prompts of ids: each echoes its own (decoded) prompt.
	batch := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": []any{ids, []int{256, 'h', 'i'}}, "max_tokens": 6,
		"temperature": 0, "echo": true, "logprobs": 2})
	check("batch", batch.Choices[0], 6)
	if ch := batch.Choices[1]; !strings.HasPrefix(ch.Text, "hi") || ch.Logprobs.TokenLogprobs[0] != nil || len(ch.Logprobs.Tokens) != 3+6 {
		t.Errorf("batch choice 1: %q %+v", ch.Text, ch.Logprobs)
	}
	// Echo without logprobs: the text alone.
	if c := complete(t, ts.URL, with(base, "echo", true)); c.Choices[0].Text != prompt+plain.Choices[0].Text || c.Choices[0].Logprobs != nil {
		t.Errorf("echo without logprobs: %q %v", c.Choices[0].Text, c.Choices[0].Logprobs)
	}
	t.Logf("prompt log-probabilities within %.2g of the float64 reference", worst)
	waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	unchanged(t, s, s.Stats().Admitted)
}

// jsonStrict decodes s into v refusing unknown fields.
func jsonStrict(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
