package serve

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"
)

// Completion is OpenAI's text_completion object: the answer of a
// request, and (with Usage nil except in the last) each chunk of a
// stream.
type Completion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`
}

// Choice is one completion. FinishReason is "stop" (a stop token or a
// stop string) or "length" (max_tokens); null in the chunks of a stream
// before the last. Logprobs is null unless the request asked for it
// (its tokens in a stream's chunk).
type Choice struct {
	Text         string              `json:"text"`
	Index        int                 `json:"index"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// Usage is OpenAI's token counts, extended with the KV pages decode
// steps read: PagesRead and PagesTotal are (KV head, page) pairs over
// all layers and decode steps, read and the number dense attention
// reads; BytesReadVsDense is the K/V and summary bytes read over dense
// attention's (rho, weighted by each step's pages as questctl generate
// totals it; 0 without decode steps).
type Usage struct {
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	TotalTokens      int     `json:"total_tokens"`
	PagesRead        int     `json:"pages_read"`
	PagesTotal       int     `json:"pages_total"`
	BytesReadVsDense float64 `json:"bytes_read_vs_dense"`
}

// completions serves POST /v1/completions.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	arrived := time.Now()
	req, aerr := decodeRequest(body)
	if aerr == nil {
		var p params
		if p, aerr = s.resolve(req); aerr == nil {
			s.run(w, r, p, arrived)
			return
		}
	}
	s.invalid()
	aerr.write(w)
}

// readBody reads a request's body within the server's limits; on a
// failure it answers (408, 413 or 400) and returns false.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	// The request timeout counts from arrival: a body that stalls does not
	// hold the handler past it. The deadline is cleared once the body is in
	// (a deadline applies to pending reads too): net/http's background read,
	// which tells a client gone, starts at the body's end and would
	// otherwise fail at it and cancel the request's context before the
	// request's own timeout answers 504. (A ResponseWriter without
	// deadlines answers ErrNotSupported: then only the client bounds it.)
	rc := http.NewResponseController(w)
	if s.cfg.RequestTimeout > 0 {
		_ = rc.SetReadDeadline(time.Now().Add(s.cfg.RequestTimeout))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if s.cfg.RequestTimeout > 0 && err == nil {
		// Only with the body in: after a failed read the deadline stays, so
		// that net/http's discard of the rest of the body cannot hang.
		_ = rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		s.invalid()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			(&apiError{status: http.StatusRequestTimeout, typ: typeTimeout, code: "request_timeout",
				message: "The request body did not arrive within the server's request timeout of " + s.cfg.RequestTimeout.String() + "."}).write(w)
			return nil, false
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			(&apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalid, code: "request_too_large",
				message: "The request body is larger than the server's limit of " + strconv.FormatInt(mbe.Limit, 10) + " bytes."}).write(w)
			return nil, false
		}
		badParam("", "invalid_body", "reading the request body: %v", err).write(w)
		return nil, false
	}
	return body, true
}

// run admits a valid request that arrived at arrived (its body read)
// and answers it.
func (s *Server) run(w http.ResponseWriter, r *http.Request, p params, arrived time.Time) {
	var ctx context.Context
	var cancel context.CancelFunc
	if s.cfg.RequestTimeout > 0 {
		ctx, cancel = context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	} else {
		ctx, cancel = context.WithCancel(r.Context())
	}
	j := &job{ctx: ctx, cancel: cancel, p: p, pages: s.pagesFor(len(p.ids) + p.maxTokens), notify: make(chan struct{}, 1),
		clock: reqClock{arrived: arrived}}
	if err := s.admit(j); err != nil {
		cancel()
		err.write(w)
		return
	}
	if p.stream {
		s.stream(w, j)
		return
	}
	var text []byte
	var lps []tokenLogprob
	for {
		t, l, done, res := s.wait(j)
		text, lps = append(text, t...), append(lps, l...)
		if !done {
			continue
		}
		if res.err != nil {
			// A client gone reads nothing; one still there (its context
			// ended otherwise) gets the error, never an empty 200.
			if res.err.status != statusClientGone || r.Context().Err() == nil {
				res.err.write(w)
			}
			return
		}
		if j.p.chat {
			c := s.chatObject(j, string(text), &res.finish, &res.usage)
			c.Choices[0].Logprobs = chatLogprobs(j.p, lps)
			writeJSON(w, http.StatusOK, c)
			return
		}
		c := s.chunk(j, string(text), &res.finish)
		c.Choices[0].Logprobs = completionLogprobs(j.p, lps, 0)
		c.Usage = &res.usage
		writeJSON(w, http.StatusOK, c)
		return
	}
}

// wait blocks until j has news, or its context ends (the scheduler then
// ends it at its next iteration boundary; the answer does not wait for
// that).
func (s *Server) wait(j *job) ([]byte, []tokenLogprob, bool, result) {
	select {
	case <-j.notify:
	case <-j.ctx.Done():
	}
	return s.news(j)
}

// await blocks until j has news or its context ends, calling keep each
// time tick fires first; false when keep does (the client is gone).
func (s *Server) await(j *job, tick <-chan time.Time, keep func() bool) bool {
	for {
		select {
		case <-j.notify:
			return true
		case <-j.ctx.Done():
			return true
		case <-tick:
			if !keep() {
				return false
			}
		}
	}
}

// news takes j's text and log-probabilities since the last take, and its
// result once done (or its context's end).
func (s *Server) news(j *job) ([]byte, []tokenLogprob, bool, result) {
	text, lps, done, res := j.take()
	if !done && j.ctx.Err() != nil {
		done, res = true, result{err: ctxError(j.ctx)}
	}
	return text, lps, done, res
}

// chunk is a completion object of j holding text.
func (s *Server) chunk(j *job, text string, finish *string) Completion {
	return Completion{ID: j.id, Object: "text_completion", Created: j.created, Model: s.name,
		Choices: []Choice{{Text: text, FinishReason: finish}}}
}

// stream answers j with server-sent events: a chunk per piece of text,
// a last chunk with the finish reason, a usage chunk when asked, then
// [DONE]. A failure after the first byte is an error event (OpenAI's
// error object) and no [DONE].
func (s *Server) stream(w http.ResponseWriter, j *job) {
	rc := http.NewResponseController(w)
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	// Headers go out at once: a client sees the stream open while the
	// prompt is prefilled.
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	// piece is a chunk of text and its tokens' log-probabilities (a
	// chat chunk on /v1/chat/completions, whose first carries the
	// assistant's role); offset is where the text starts in the
	// completion's.
	first := true
	offset := 0 // of the next entry's token in the completion's text
	piece := func(text string, lps []tokenLogprob, finish *string) any {
		// Entries may run ahead of the text (bytes a stop string holds
		// back): the offsets follow the entries' own texts.
		defer func() {
			for _, e := range lps {
				offset += len(e.text)
			}
		}()
		if j.p.chat {
			c := s.chatChunk(j, text, finish, first)
			if len(lps) > 0 {
				c.Choices[0].Logprobs = chatLogprobs(j.p, lps)
			}
			first = false
			return c
		}
		c := s.chunk(j, text, finish)
		if len(lps) > 0 {
			c.Choices[0].Logprobs = completionLogprobs(j.p, lps, offset)
		}
		return c
	}
	if j.p.chat && !send(piece("", nil, nil)) {
		return // OpenAI opens a chat stream with the role alone
	}
	// A comment when nothing was sent for SSEKeepAlive (a long prefill);
	// without it tick stays nil and never fires.
	var tick <-chan time.Time
	keepAlive := func() bool { return true }
	if d := s.cfg.SSEKeepAlive; d > 0 {
		quiet := time.NewTimer(d)
		defer quiet.Stop()
		tick = quiet.C
		write := send
		send = func(v any) bool {
			quiet.Reset(d)
			return write(v)
		}
		keepAlive = func() bool {
			quiet.Reset(d)
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return false
			}
			return rc.Flush() == nil
		}
	}
	for {
		if !s.await(j, tick, keepAlive) {
			return // the client is gone; the scheduler ends j
		}
		text, lps, done, res := s.news(j)
		if (len(text) > 0 || len(lps) > 0) && !send(piece(string(text), lps, nil)) {
			return // the client is gone; the scheduler ends j
		}
		if !done {
			continue
		}
		if res.err != nil {
			if res.err.status != statusClientGone {
				send(res.err.body())
			}
			return
		}
		if !send(piece("", nil, &res.finish)) {
			return
		}
		if j.p.includeUsage {
			var last any
			if j.p.chat {
				c := s.chatChunk(j, "", nil, false)
				c.Choices, c.Usage = []ChatChoice{}, &res.usage
				last = c
			} else {
				c := s.chunk(j, "", nil)
				c.Choices, c.Usage = []Choice{}, &res.usage
				last = c
			}
			if !send(last) {
				return
			}
		}
		if _, err := io.WriteString(w, "data: [DONE]\n\n"); err == nil {
			rc.Flush()
		}
		return
	}
}
