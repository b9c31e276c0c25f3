package serveload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/completion"
)

// ErrModelNotListed is wrapped by Run's error when Config.Model names a
// model the server does not list.
var ErrModelNotListed = errors.New("model not listed by the server")

// notListedError is ErrModelNotListed with its message.
type notListedError struct{ msg string }

func (e notListedError) Error() string        { return e.msg }
func (e notListedError) Is(target error) bool { return target == ErrModelNotListed }

// client talks to one completions API.
type client struct {
	base   string // http://HOST:PORT
	http   *http.Client
	cfg    Config
	errOut io.Writer // safe for concurrent use
}

// modelID asks GET /v1/models, which also tells an unreachable server
// or one that is not a completions API; it returns --model or the first
// model listed.
func (cl *client) modelID(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cl.base+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	resp, err := cl.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("the server at %s is unreachable (is questd up with --http-addr %s?): %v", cl.base, cl.cfg.Addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("GET %s/v1/models: %v", cl.base, err)
	}
	var list completion.ModelList
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &list) != nil || list.Object != "list" {
		return "", fmt.Errorf("GET %s/v1/models: HTTP %d, %s: not a completions API (--addr is questd's --http-addr)", cl.base, resp.StatusCode, errorMessage(body))
	}
	if cl.cfg.Model != "" {
		for _, m := range list.Data {
			if m.ID == cl.cfg.Model {
				return m.ID, nil
			}
		}
		return "", notListedError{fmt.Sprintf("--model %q: the server at %s does not list it (it lists %s)", cl.cfg.Model, cl.base, modelIDs(list))}
	}
	if len(list.Data) == 0 {
		return "", fmt.Errorf("GET %s/v1/models: the server lists no model", cl.base)
	}
	return list.Data[0].ID, nil
}

func modelIDs(l completion.ModelList) string {
	var ids []string
	for _, m := range l.Data {
		ids = append(ids, m.ID)
	}
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// errorMessage is an error answer's message, or the start of the body.
func errorMessage(body []byte) string {
	var e completion.ErrorBody
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		return "empty body"
	}
	return strconv.Quote(s)
}

// sample is one request's measurement.
type sample struct {
	err          error
	sent, first  time.Time // the request sent; its first text (zero: none)
	last, end    time.Time // its last text; the stream's end
	itl          []float64 // ms
	tokens       int       // completion tokens (usage)
	promptTokens int
	cachedTokens int
	text         string
	correct      bool
	retries      int
	rho          float64
}

// body is the JSON request of prompt p with selector sel.
func (cl *client) body(p prompt, sel string, maxTokens int) []byte {
	q := map[string]any{"selector": sel}
	if sel == "quest" && cl.cfg.Budget > 0 {
		q["budget"] = cl.cfg.Budget
	}
	b, _ := json.Marshal(map[string]any{
		"model": cl.cfg.Model, "prompt": p.text, "max_tokens": maxTokens, "temperature": 0, "stream": true,
		"stream_options": map[string]bool{"include_usage": true}, "quest": q,
	})
	return b
}

// streamChunk is what bench serve reads of a stream's event.
type streamChunk struct {
	Choices []completion.Choice     `json:"choices"`
	Usage   *completion.Usage       `json:"usage"`
	Error   *completion.ErrorDetail `json:"error"`
}

// stream sends one streaming request and measures it; opened, when set,
// is called once the server has admitted it (its stream's headers).
func (cl *client) stream(ctx context.Context, body []byte, answer string, opened func()) sample {
	ctx, cancel := context.WithTimeout(ctx, cl.cfg.Timeout)
	defer cancel()
	s := sample{sent: time.Now()}
	var resp *http.Response
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cl.base+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			s.err = err
			return s
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		resp, err = cl.http.Do(req)
		if err != nil {
			s.err = fmt.Errorf("POST %s/v1/completions: %v", cl.base, err)
			return s
		}
		if resp.StatusCode == http.StatusOK {
			break
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			s.err = fmt.Errorf("POST %s/v1/completions: HTTP %d: %s", cl.base, resp.StatusCode, errorMessage(b))
			return s
		}
		s.retries++
		wait := time.Second
		if v, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && v > 0 {
			wait = time.Duration(v) * time.Second
		}
		select {
		case <-ctx.Done():
			s.err = fmt.Errorf("refused with 429 until the request's --timeout: %s", errorMessage(b))
			return s
		case <-time.After(wait):
		}
	}
	defer resp.Body.Close()
	if opened != nil {
		opened()
	}
	var text strings.Builder
	done := false
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	for !done {
		line, err := rd.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the stream ended without [DONE]")
			}
			s.err = fmt.Errorf("stream: %v", err)
			return s
		}
		line = strings.TrimRight(line, "\r\n")
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue // blank lines between events, comments
		}
		now := time.Now()
		if data == "[DONE]" {
			done = true
			break
		}
		var ch streamChunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			s.err = fmt.Errorf("stream: event %.80q: %v", data, err)
			return s
		}
		if ch.Error != nil {
			s.err = fmt.Errorf("stream: error event: %s", ch.Error.Message)
			return s
		}
		if ch.Usage != nil {
			s.tokens, s.promptTokens, s.rho = ch.Usage.CompletionTokens, ch.Usage.PromptTokens, ch.Usage.BytesReadVsDense
			s.cachedTokens = ch.Usage.PromptTokensDetails.CachedTokens
		}
		if len(ch.Choices) == 0 {
			continue
		}
		t := ch.Choices[0].Text
		switch {
		case t == "":
			if s.first.IsZero() && ch.Choices[0].FinishReason != nil { // no text at all: the end is the first token
				s.first, s.last = now, now
			}
		case s.first.IsZero():
			s.first, s.last = now, now
		default:
			gap := float64(now.Sub(s.last).Nanoseconds()) / 1e6 / float64(len(t))
			for range len(t) {
				s.itl = append(s.itl, gap)
			}
			s.last = now
		}
		text.WriteString(t)
	}
	s.end = time.Now()
	s.text = text.String()
	s.correct = strings.HasPrefix(strings.TrimLeft(s.text, " "), answer)
	return s
}
