package completion

import (
	"sync"

	"github.com/questrt/questrt/plan"
)

// RequestRecord is a finished request as the server keeps it
// (Config.History): GET /admin/requests/{id} returns it, and POST
// /admin/requests/{id}/replay replays it with dense attention.
type RequestRecord struct {
	// ID is the completion id of the answer; Index the choice's (a
	// request of n > 1 or of a batch of prompts keeps a record per
	// choice, under one id: GET /admin/requests/{id} and its replay take
	// the first kept).
	ID      string `json:"id"`
	Index   int    `json:"index"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	// PromptTokens is the prompt as the model saw it (BOS included).
	PromptTokens []int `json:"prompt_tokens"`
	// OutputTokens is every token generated, a stop token included; Text
	// what the client got.
	OutputTokens []int  `json:"output_tokens"`
	Text         string `json:"text"`
	// QuestArgmax is, per generated token, the most likely token of the
	// logits it was sampled from (the token itself when greedy).
	QuestArgmax []int `json:"quest_argmax"`
	// FinishReason is stop or length; empty when the request failed
	// (Error says why: cancelled, timed out, ...).
	FinishReason string `json:"finish_reason,omitempty"`
	Error        string `json:"error,omitempty"`
	// Settings are the request's decoding and selection settings.
	Settings RecordSettings `json:"settings"`
	Usage    Usage          `json:"usage"`
}

// RecordSettings are a recorded request's effective settings.
type RecordSettings struct {
	MaxTokens   int     `json:"max_tokens"`
	Temperature float64 `json:"temperature"`
	TopP        float64 `json:"top_p"`
	Seed        uint64  `json:"seed"`
	// Greedy: every token was the logits' most likely one.
	Greedy bool `json:"greedy"`
	// Budget is the token budget (0: the policy's, BudgetTokens).
	Budget       int    `json:"budget"`
	BudgetTokens int    `json:"policy_budget_tokens"`
	DenseLayers  int    `json:"dense_layers"`
	Selector     string `json:"selector"`
	GQA          string `json:"gqa"`
	Sink         int    `json:"sink"`
	Local        int    `json:"local"`
	PageSize     int    `json:"page_size"`
	// TopK and MinP are the request's top_k and min_p (0: none).
	TopK int     `json:"top_k,omitempty"`
	MinP float64 `json:"min_p,omitempty"`
	// RepetitionPenalty, FrequencyPenalty and PresencePenalty are the
	// request's penalties (1, 0, 0: none).
	RepetitionPenalty float64 `json:"repetition_penalty,omitempty"`
	FrequencyPenalty  float64 `json:"frequency_penalty,omitempty"`
	PresencePenalty   float64 `json:"presence_penalty,omitempty"`
	// StopTokenIDs are the request's stop_token_ids (the model's EOS
	// ids end every request besides).
	StopTokenIDs []int `json:"stop_token_ids,omitempty"`
}

// history is the last Config.History finished requests, oldest first.
type history struct {
	mu   sync.Mutex
	max  int
	recs []*RequestRecord
}

// add keeps r, forgetting the oldest record past the bound.
func (h *history) add(r *RequestRecord) {
	if h.max == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recs) == h.max {
		copy(h.recs, h.recs[1:])
		h.recs = h.recs[:h.max-1]
	}
	h.recs = append(h.recs, r)
}

// get returns the record of id, or nil.
func (h *history) get(id string) *RequestRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if r.ID == id {
			return r
		}
	}
	return nil
}

// list returns the records, newest first.
func (h *history) list() []*RequestRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*RequestRecord, 0, len(h.recs))
	for i := len(h.recs) - 1; i >= 0; i-- {
		out = append(out, h.recs[i])
	}
	return out
}

// record builds j's record (called by end, on the scheduler; last is
// the text end sends with the result).
func (s *Server) record(j *job, res result, last []byte) *RequestRecord {
	p := j.p
	sel := p.sel.Selector
	if p.allDense {
		sel = plan.Dense
	}
	r := &RequestRecord{ID: j.id, Index: p.index, Created: j.created, Model: s.name,
		PromptTokens: p.ids, OutputTokens: j.out, QuestArgmax: j.argmax, Text: string(j.sent) + string(last),
		FinishReason: res.finish, Usage: res.usage,
		Settings: RecordSettings{MaxTokens: p.maxTokens, Temperature: p.temperature, TopP: p.topP, Seed: p.seed,
			Greedy: p.temperature == 0 && !p.penalized(), Budget: p.budget, BudgetTokens: p.sel.BudgetTokens, DenseLayers: p.denseLayers,
			Selector: sel.String(), GQA: p.sel.GQA.String(), Sink: p.sel.SinkPages, Local: p.sel.LocalPages, PageSize: p.sel.PageSize,
			TopK: p.topK, MinP: p.minP, StopTokenIDs: p.stopTokens,
			RepetitionPenalty: p.repetitionPenalty, FrequencyPenalty: p.frequencyPenalty, PresencePenalty: p.presencePenalty}}
	if res.err != nil {
		r.Error = res.err.message
	}
	return r
}
