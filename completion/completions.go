package completion

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
	// PromptTokensDetails tells how many prompt tokens the prefix cache
	// gave (OpenAI's field).
	PromptTokensDetails PromptTokensDetails `json:"prompt_tokens_details"`
}

// PromptTokensDetails is the breakdown of a usage's prompt tokens.
type PromptTokensDetails struct {
	// CachedTokens is the prompt tokens taken from the prefix cache
	// instead of prefilled.
	CachedTokens int `json:"cached_tokens"`
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
			s.ignore(w, "/v1/completions", req.ignored)
			s.run(w, r, p, arrived)
			return
		}
	}
	s.notResolved(aerr)
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
				message: "The request body did not arrive within the server's request timeout (questd --request-timeout " + s.cfg.RequestTimeout.String() + ")."}).write(w)
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

// run admits a valid request that arrived at arrived (its body read),
// as one job per choice, and answers it.
func (s *Server) run(w http.ResponseWriter, r *http.Request, p params, arrived time.Time) {
	var ctx context.Context
	var cancel context.CancelFunc
	if s.cfg.RequestTimeout > 0 {
		ctx, cancel = context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	} else {
		ctx, cancel = context.WithCancel(r.Context())
	}
	// Whatever the answer, the request's choices end with it (a choice
	// still running when the handler returns is ended as cancelled).
	defer cancel()
	g := s.newGroup(ctx, p, arrived)
	if err := s.admit(g); err != nil {
		err.write(w)
		return
	}
	if p.stream {
		s.stream(w, g)
		return
	}
	n := len(g.jobs)
	texts := make([][]byte, n)
	lps := make([][]tokenLogprob, n)
	res := make([]result, n)
	finished := make([]bool, n)
	for left := n; left > 0; {
		select {
		case <-g.notify:
		case <-ctx.Done():
		}
		for i, j := range g.jobs {
			if finished[i] {
				continue
			}
			t, l, done, rs := s.news(j)
			texts[i], lps[i] = append(texts[i], t...), append(lps[i], l...)
			if !done {
				continue
			}
			if rs.err != nil {
				// A client gone reads nothing; one still there (its
				// context ended otherwise) gets the error, never an
				// empty 200.
				if rs.err.status != statusClientGone || r.Context().Err() == nil {
					rs.err.write(w)
				}
				return
			}
			finished[i], res[i] = true, rs
			left--
		}
	}
	usage := usageOf(g.jobs, res)
	j0 := g.jobs[0]
	if j0.p.chat {
		c := ChatCompletion{ID: "chat" + j0.id, Object: "chat.completion", Created: j0.created, Model: s.name, Usage: &usage}
		for i, j := range g.jobs {
			c.Choices = append(c.Choices, ChatChoice{Index: j.p.index, Message: &ChatMessage{Role: "assistant", Content: string(texts[i])},
				Logprobs: chatLogprobs(j.p, lps[i]), FinishReason: &res[i].finish})
		}
		writeJSON(w, http.StatusOK, c)
		return
	}
	c := Completion{ID: j0.id, Object: "text_completion", Created: j0.created, Model: s.name, Usage: &usage}
	for i, j := range g.jobs {
		c.Choices = append(c.Choices, Choice{Text: string(texts[i]), Index: j.p.index,
			Logprobs: completionLogprobs(j.p, lps[i], 0), FinishReason: &res[i].finish})
	}
	writeJSON(w, http.StatusOK, c)
}

// newGroup makes the jobs of a request of params p under ctx: for each
// prompt, its first choice (which prefills it) and the n-1 others
// (forks of the first's sequence), in index order, all notifying one
// channel.
func (s *Server) newGroup(ctx context.Context, p params, arrived time.Time) *group {
	g := &group{ctx: ctx, notify: make(chan struct{}, 1), grows: s.grows(p)}
	for pi, ids := range p.prompts {
		var lead *job
		for c := range p.n {
			q := p
			q.prompts, q.echoes = nil, nil
			q.ids, q.echoText, q.index = ids, p.echoes[pi], pi*p.n+c
			jctx, jcancel := context.WithCancel(ctx)
			j := &job{ctx: jctx, cancel: jcancel, p: q, g: g, notify: g.notify, clock: reqClock{arrived: arrived}}
			switch {
			case g.grows:
				// The prompt and the first decode step's token: the
				// decode steps reserve the pages after.
				lead, j.pages = j, s.pagesFor(len(ids)+min(p.maxTokens, 1))
			case c == 0:
				lead, j.pages = j, s.pagesFor(len(ids)+p.maxTokens)
			default:
				j.leader, j.pages = lead, s.forkPages(len(ids), p.maxTokens)
				lead.forks = append(lead.forks, j)
			}
			g.jobs = append(g.jobs, j)
			g.pages += j.pages
		}
	}
	return g
}

// await blocks until one of g's jobs has news or the request's context
// ends (the scheduler then ends the jobs at its next iteration boundary;
// the answer does not wait for that), calling keep each time tick fires
// first; false when keep does (the client is gone).
func (s *Server) await(g *group, tick <-chan time.Time, keep func() bool) bool {
	for {
		select {
		case <-g.notify:
			return true
		case <-g.ctx.Done():
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
	// The context first: the scheduler posts a job's result before it
	// cancels the job's context (end), so a take after a context seen
	// ended finds the result that ended it. (Taken first, a result
	// posted between the take and the check read as the client gone.)
	gone := j.ctx.Err() != nil
	text, lps, done, res := j.take()
	if !done && gone {
		done, res = true, result{err: s.ctxError(j.ctx)}
	}
	return text, lps, done, res
}

// chunk is a completion object of j holding text.
func (s *Server) chunk(j *job, text string, finish *string) Completion {
	return Completion{ID: j.id, Object: "text_completion", Created: j.created, Model: s.name,
		Choices: []Choice{{Text: text, Index: j.p.index, FinishReason: finish}}}
}

// stream answers g with server-sent events: chunks of each choice's
// text (its index set), each choice's last chunk with its finish
// reason, once all are done a usage chunk when asked, then [DONE]. A
// failure after the first byte is an error event (OpenAI's error
// object) and no [DONE].
func (s *Server) stream(w http.ResponseWriter, g *group) {
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
	chat := g.jobs[0].p.chat
	n := len(g.jobs)
	// offsets[i] is where choice i's next entry's token starts in its
	// text.
	offsets := make([]int, n)
	// piece is a chunk of choice i's text and its tokens'
	// log-probabilities (a chat chunk on /v1/chat/completions).
	piece := func(i int, text string, lps []tokenLogprob, finish *string) any {
		j := g.jobs[i]
		// Entries may run ahead of the text (bytes a stop string holds
		// back): the offsets follow the entries' own texts.
		defer func() {
			for _, e := range lps {
				offsets[i] += len(e.text)
			}
		}()
		if chat {
			c := s.chatChunk(j, text, finish, false)
			if len(lps) > 0 {
				c.Choices[0].Logprobs = chatLogprobs(j.p, lps)
			}
			return c
		}
		c := s.chunk(j, text, finish)
		if len(lps) > 0 {
			c.Choices[0].Logprobs = completionLogprobs(j.p, lps, offsets[i])
		}
		return c
	}
	if chat {
		// OpenAI opens each choice of a chat stream with the role alone.
		for _, j := range g.jobs {
			if !send(s.chatChunk(j, "", nil, true)) {
				return
			}
		}
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
	res := make([]result, n)
	finished := make([]bool, n)
	for left := n; left > 0; {
		if !s.await(g, tick, keepAlive) {
			return // the client is gone; the scheduler ends the jobs
		}
		for i, j := range g.jobs {
			if finished[i] {
				continue
			}
			text, lps, done, rs := s.news(j)
			if (len(text) > 0 || len(lps) > 0) && !send(piece(i, string(text), lps, nil)) {
				return // the client is gone; the scheduler ends the jobs
			}
			if !done {
				continue
			}
			if rs.err != nil {
				if rs.err.status != statusClientGone {
					send(rs.err.body())
				}
				return
			}
			if !send(piece(i, "", nil, &rs.finish)) {
				return
			}
			finished[i], res[i] = true, rs
			left--
		}
	}
	if g.jobs[0].p.includeUsage {
		usage := usageOf(g.jobs, res)
		var last any
		if chat {
			c := s.chatChunk(g.jobs[0], "", nil, false)
			c.Choices, c.Usage = []ChatChoice{}, &usage
			last = c
		} else {
			c := s.chunk(g.jobs[0], "", nil)
			c.Choices, c.Usage = []Choice{}, &usage
			last = c
		}
		if !send(last) {
			return
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err == nil {
		rc.Flush()
	}
}
