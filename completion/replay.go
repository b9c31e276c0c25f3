package completion

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/questrt/questrt/model"
)

// ReplayReport is the answer of POST /admin/requests/{id}/replay: a
// kept request replayed with dense attention, teacher-forced on the
// tokens it generated, to tell a selection miss (dense would have chosen
// another token at the same prefix) from a model error (dense chooses
// the same token).
type ReplayReport struct {
	ID           string         `json:"id"`
	PromptTokens int            `json:"prompt_tokens"`
	Settings     RecordSettings `json:"settings"`
	// Tokens compares, per generated token, Quest's choice with dense
	// attention's at the same prefix.
	Tokens []ReplayToken `json:"tokens"`
	// Agree counts the tokens where Quest's and dense attention's most
	// likely tokens are the same; FirstDivergence is the index of the
	// first where they are not (-1: none).
	Agree           int `json:"agree"`
	FirstDivergence int `json:"first_divergence"`
}

// ReplayToken is one generated token of a replay.
type ReplayToken struct {
	// Index is the token's index in the output, Position its position in
	// the sequence (prompt tokens + Index).
	Index    int `json:"index"`
	Position int `json:"position"`
	// Token is what the request generated (sampled from Quest's logits),
	// Text its decoded bytes.
	Token int    `json:"token"`
	Text  string `json:"text"`
	// Quest and Dense are the most likely next token under Quest's
	// attention (as served) and under dense attention, after the same
	// prefix (the prompt and the request's tokens before this one).
	Quest int  `json:"quest"`
	Dense int  `json:"dense"`
	Agree bool `json:"agree"`
	// DenseMargin is dense attention's logit of its choice minus its
	// logit of Quest's (0 when they agree; a small margin is a near tie);
	// DenseLogprob is dense attention's log-probability of Token.
	DenseMargin  float64 `json:"dense_margin"`
	DenseLogprob float64 `json:"dense_logprob"`
}

// admin serves the request history: GET /admin/requests (the kept
// requests, newest first, without their tokens), GET
// /admin/requests/{id} (one record) and POST /admin/requests/{id}/replay
// (its dense replay).
func (s *Server) admin(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/admin/requests"), "/")
	id, op, _ := strings.Cut(rest, "/")
	switch {
	case rest == "":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.notAllowed(w, r, "GET, HEAD")
			return
		}
		recs := s.hist.list()
		list := RecordList{Object: "list", Data: make([]RecordSummary, 0, len(recs)), Max: s.cfg.History}
		for _, rec := range recs {
			list.Data = append(list.Data, RecordSummary{ID: rec.ID, Created: rec.Created, PromptTokens: len(rec.PromptTokens),
				CompletionTokens: len(rec.OutputTokens), FinishReason: rec.FinishReason, Error: rec.Error})
		}
		writeJSON(w, http.StatusOK, list)
		return
	case op != "" && op != "replay":
		s.invalid()
		(&apiError{status: http.StatusNotFound, typ: typeInvalid, code: "unknown_url",
			message: fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path)}).write(w)
		return
	}
	rec := s.hist.get(id)
	if rec == nil {
		s.invalid()
		msg := fmt.Sprintf("No request %q among the %d the server keeps (the last finished ones).", id, s.cfg.History)
		if s.cfg.History == 0 {
			msg = "The server keeps no requests (its history is 0: questd --request-history)."
		}
		(&apiError{status: http.StatusNotFound, typ: typeInvalid, param: "id", code: "request_not_found", message: msg}).write(w)
		return
	}
	if op == "" {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.notAllowed(w, r, "GET, HEAD")
			return
		}
		writeJSON(w, http.StatusOK, rec)
		return
	}
	if r.Method != http.MethodPost {
		s.notAllowed(w, r, "POST")
		return
	}
	rep, aerr := s.replayDense(r.Context(), rec)
	if aerr != nil {
		aerr.write(w)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// RecordList is the answer of GET /admin/requests.
type RecordList struct {
	Object string          `json:"object"`
	Data   []RecordSummary `json:"data"`
	// Max is how many requests the server keeps (Config.History).
	Max int `json:"max"`
}

// RecordSummary is a kept request without its tokens.
type RecordSummary struct {
	ID               string `json:"id"`
	Created          int64  `json:"created"`
	PromptTokens     int    `json:"prompt_tokens"`
	CompletionTokens int    `json:"completion_tokens"`
	FinishReason     string `json:"finish_reason,omitempty"`
	Error            string `json:"error,omitempty"`
}

// replayDense runs rec's prompt and generated tokens through the model
// with dense attention (the prefill's float32 kernel, the prompt in
// chunks of Config.ChunkTokens), teacher-forced: the logits before each
// generated token come from the same prefix the request had. One replay
// runs at a time, next to the scheduler (the model is safe for
// concurrent use; it takes CPU from the requests); it ends with ctx or
// the server.
func (s *Server) replayDense(ctx context.Context, rec *RequestRecord) (*ReplayReport, *apiError) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	s.replays.Add(1)
	s.mu.Unlock()
	defer s.replays.Done()
	select {
	case s.replaying <- struct{}{}:
		defer func() { <-s.replaying }()
	case <-ctx.Done():
		return nil, s.ctxError(ctx)
	}
	rep := &ReplayReport{ID: rec.ID, PromptTokens: len(rec.PromptTokens), Settings: rec.Settings, FirstDivergence: -1,
		Tokens: make([]ReplayToken, 0, len(rec.OutputTokens))}
	if len(rec.OutputTokens) == 0 {
		return rep, nil
	}
	d := model.NewDense(s.m.Geometry(), s.cfg.Workers)
	fail := func(what string, err error) *apiError {
		if ctx.Err() != nil {
			if s.ctx.Err() != nil {
				return errClosed
			}
			return s.ctxError(ctx)
		}
		return internal(fmt.Errorf("dense replay of %s: %s: %w", rec.ID, what, err))
	}
	var logits []float32
	ids := rec.PromptTokens
	for lo := 0; lo < len(ids); lo += s.cfg.ChunkTokens {
		var err error
		if logits, err = s.m.Forward(ctx, d, ids[lo:min(lo+s.cfg.ChunkTokens, len(ids))], model.ForwardOptions{}); err != nil {
			return nil, fail("prompt", err)
		}
	}
	vocab := s.m.Config.VocabSize
	add := func(i int, row []float32) {
		tokID := rec.OutputTokens[i]
		quest := tokID
		if i < len(rec.QuestArgmax) {
			quest = rec.QuestArgmax[i]
		}
		dense := model.Argmax(row)
		t := ReplayToken{Index: i, Position: len(ids) + i, Token: tokID, Text: model.TokenText(s.tok, tokID),
			Quest: quest, Dense: dense, Agree: quest == dense, DenseLogprob: logprob(row, tokID)}
		if !t.Agree {
			t.DenseMargin = float64(row[dense] - row[quest])
			if rep.FirstDivergence < 0 {
				rep.FirstDivergence = i
			}
		} else {
			rep.Agree++
		}
		rep.Tokens = append(rep.Tokens, t)
	}
	add(0, logits)
	out := rec.OutputTokens[:len(rec.OutputTokens)-1]
	for lo := 0; lo < len(out); lo += s.cfg.ChunkTokens {
		hi := min(lo+s.cfg.ChunkTokens, len(out))
		all, err := s.m.Forward(ctx, d, out[lo:hi], model.ForwardOptions{AllLogits: true})
		if err != nil {
			return nil, fail("output", err)
		}
		for k := range hi - lo {
			add(lo+k+1, all[k*vocab:(k+1)*vocab])
		}
	}
	return rep, nil
}

// logprob is log softmax(row)[id], in float64.
func logprob(row []float32, id int) float64 {
	m := math.Inf(-1)
	for _, x := range row {
		m = max(m, float64(x))
	}
	var sum float64
	for _, x := range row {
		sum += math.Exp(float64(x) - m)
	}
	return float64(row[id]) - m - math.Log(sum)
}
