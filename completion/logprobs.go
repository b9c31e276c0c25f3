package completion

import (
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/questrt/questrt/model"
)

// Log-probabilities of generated tokens (the "logprobs" of a completion,
// "logprobs" and "top_logprobs" of a chat): each token's log-softmax under
// the model's logits, before temperature and top_p (what the model
// assigns, as vLLM reports by default), and the most likely alternatives.
// A token that ends the request as a stop id has none (it has no text);
// with stop strings, the last entries may cover text the stop cut off.

// maxTopLogprobs bound a request's alternatives per token: 20 both, as
// vLLM's default --max-logprobs (OpenAI's completions stop at 5, which
// vLLM users' tools, lm-eval's among them, go past).
const (
	maxTopLogprobs     = 20
	maxChatTopLogprobs = 20
)

// tokenLogprob is one generated (or, with echo, prompt) token's entry;
// none marks the prompt's first token, which nothing predicts (its
// log-probability and alternatives are null).
type tokenLogprob struct {
	text string
	lp   float64
	top  []textLogprob // most likely first
	none bool
}

type textLogprob struct {
	text string
	lp   float64
}

// logprobOf returns the log-softmax of logits at id (in float64) and the
// top most likely ids with theirs (ties by the lower id).
func logprobOf(logits []float32, id, top int) (float64, []int, []float64) {
	m := math.Inf(-1)
	for _, l := range logits {
		m = max(m, float64(l))
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l) - m)
	}
	logZ := m + math.Log(z)
	if top <= 0 {
		return clampLogprob(float64(logits[id]) - logZ), nil, nil
	}
	// The top ids: a sorted window of at most top entries.
	best := make([]int, 0, top+1)
	better := func(a, b int) bool { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b) }
	for i := range logits {
		if len(best) == top && !better(i, best[top-1]) {
			continue
		}
		at, _ := slices.BinarySearchFunc(best, i, func(x, t int) int {
			if better(x, t) {
				return -1
			}
			return 1
		})
		best = slices.Insert(best, at, i)
		if len(best) > top {
			best = best[:top]
		}
	}
	lps := make([]float64, len(best))
	for k, i := range best {
		lps[k] = clampLogprob(float64(logits[i]) - logZ)
	}
	return clampLogprob(float64(logits[id]) - logZ), best, lps
}

// minLogprob stands for the log-probability of a token the model rules
// out (-Inf), and of NaN logits, which JSON cannot carry (vLLM's value).
const minLogprob = -9999.0

func clampLogprob(v float64) float64 {
	if math.IsNaN(v) || v < minLogprob {
		return minLogprob
	}
	return v
}

// utf8JSONText is s as JSON shows it: each byte outside valid UTF-8 is
// U+FFFD (encoding/json's rule), so that a token and its key in a
// top_logprobs map read the same.
func utf8JSONText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// logprob records j's token id (sampled from logits) for the next post,
// when j asked for log-probabilities.
func (s *Server) logprob(j *job, logits []float32, id int) {
	if !j.p.logprobs {
		return
	}
	j.lpQueue = append(j.lpQueue, s.entry(logits, id, j.p.topLogprobs))
}

// entry is the entry of token id under logits, with top alternatives.
func (s *Server) entry(logits []float32, id, top int) tokenLogprob {
	lp, ids, lps := logprobOf(logits, id, top)
	e := tokenLogprob{text: model.TokenText(s.tok, id), lp: lp}
	for k, t := range ids {
		e.top = append(e.top, textLogprob{text: model.TokenText(s.tok, t), lp: lps[k]})
	}
	return e
}

// promptLogprobs records, for j with echo and logprobs, the entries of
// the prompt tokens that a prefill chunk of n tokens (after j.filled)
// predicts from logits (n rows: row r predicts the token after the
// chunk's r-th), the first prompt token's empty one with the first
// chunk; it returns the last row, the logits of the first generated
// token once the prompt is done.
func (s *Server) promptLogprobs(j *job, logits []float32, n int) []float32 {
	v := len(logits) / n
	ids := j.p.ids
	if j.filled == 0 {
		j.promptLP = append(j.promptLP, tokenLogprob{text: s.tok.Decode(ids[:1]), none: true})
	}
	for r := range n {
		next := j.filled + r + 1
		if next >= len(ids) {
			break
		}
		j.promptLP = append(j.promptLP, s.entry(logits[r*v:(r+1)*v], ids[next], j.p.topLogprobs))
	}
	return logits[(n-1)*v:]
}

// CompletionLogprobs is OpenAI's logprobs object of a text completion's
// choice: per generated token its text, log-probability, the most likely
// alternatives (null without them) and its byte offset in the
// completion's text. With echo the prompt's tokens come first, the
// first with a null log-probability and null alternatives.
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// ChatLogprobs is OpenAI's logprobs object of a chat choice.
type ChatLogprobs struct {
	Content []ChatTokenLogprob `json:"content"`
}

// ChatTokenLogprob is one generated token of a chat: its text, its
// UTF-8 bytes (a token may hold part of a character), log-probability
// and the most likely alternatives.
type ChatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []ChatTopLogprob `json:"top_logprobs"`
}

// ChatTopLogprob is an alternative token.
type ChatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

func textBytes(s string) []int {
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}

// completionLogprobs is the logprobs object of entries whose text starts
// at offset in the completion's text (nil without entries asked for).
func completionLogprobs(p params, entries []tokenLogprob, offset int) *CompletionLogprobs {
	if !p.logprobs {
		return nil
	}
	out := &CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []*float64{}, TextOffset: []int{}}
	if p.topLogprobs > 0 {
		out.TopLogprobs = []map[string]float64{}
	}
	for _, e := range entries {
		out.Tokens = append(out.Tokens, e.text)
		out.TextOffset = append(out.TextOffset, offset)
		offset += len(e.text)
		if e.none {
			out.TokenLogprobs = append(out.TokenLogprobs, nil)
			if p.topLogprobs > 0 {
				out.TopLogprobs = append(out.TopLogprobs, nil)
			}
			continue
		}
		out.TokenLogprobs = append(out.TokenLogprobs, &e.lp)
		if p.topLogprobs > 0 {
			m := make(map[string]float64, len(e.top)+1)
			for _, t := range e.top {
				// Keyed as JSON shows it (each byte of a character
				// split over tokens is U+FFFD): two ids of one key
				// keep the likelier.
				k := utf8JSONText(t.text)
				if _, dup := m[k]; !dup {
					m[k] = t.lp
				}
			}
			// The sampled token is always among them (OpenAI's
			// "up to logprobs+1"), also when sampling took one past the
			// top.
			if k := utf8JSONText(e.text); !mapHas(m, k) {
				m[k] = e.lp
			}
			out.TopLogprobs = append(out.TopLogprobs, m)
		}
	}
	return out
}

// chatLogprobs is the chat logprobs object of entries (nil without
// entries asked for).
func chatLogprobs(p params, entries []tokenLogprob) *ChatLogprobs {
	if !p.logprobs {
		return nil
	}
	out := &ChatLogprobs{Content: []ChatTokenLogprob{}}
	for _, e := range entries {
		c := ChatTokenLogprob{Token: e.text, Logprob: e.lp, Bytes: textBytes(e.text), TopLogprobs: []ChatTopLogprob{}}
		for _, t := range e.top {
			c.TopLogprobs = append(c.TopLogprobs, ChatTopLogprob{Token: t.text, Logprob: t.lp, Bytes: textBytes(t.text)})
		}
		out.Content = append(out.Content, c)
	}
	return out
}

func mapHas(m map[string]float64, k string) bool {
	_, ok := m[k]
	return ok
}
