package completion

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// CompletionRequest is the body of POST /v1/completions: OpenAI's
// legacy completions request as this server reads it, and the "quest"
// extension. Decoding checks every field it knows strictly (see the
// package doc); fields of OpenAI's API that the server does not
// implement and whose neglect would change what the answer means
// (best_of, logit_bias, suffix, tools, tool_choice, functions,
// function_call, response_format) are accepted only at their neutral
// values (null, 1, {}, "", [], "none", {"type": "text"}); best_of 1
// only with n 1, as best_of must be at least n (vLLM's rule). Other
// fields (a client's extensions) are ignored, as vLLM does:
// the answer names them in its X-Questrt-Ignored-Fields header and the
// server logs each name once.
type CompletionRequest struct {
	// Model must be the server's model name, or empty (the server's
	// one model, as vLLM takes a request without it).
	Model string `json:"model"`
	// Prompt is the prompt (required unless Prompts is set): a string
	// (tokenized, BOS first where the tokenizer has one) or an array of
	// token ids (used as given).
	Prompt *Prompt `json:"prompt"`
	// Prompts is a batch of prompts (the JSON prompt as an array of
	// strings or of arrays of token ids), used when Prompt is nil: each
	// is completed N times, the choices indexed prompt-major (prompt
	// i's choice c has index i*N + c), as OpenAI does. MarshalJSON
	// writes it as that array.
	Prompts []Prompt `json:"-"`
	// MaxTokens is the most tokens generated (Config.DefaultMaxTokens
	// when nil; at least 1, or 0 with Echo: the prompt scored alone).
	MaxTokens *int `json:"max_tokens,omitempty"`
	// Echo prepends the prompt to each choice's text and, with Logprobs,
	// the prompt's tokens to its log-probabilities (the first token's
	// null: nothing predicts it), as OpenAI and vLLM do.
	Echo bool `json:"echo,omitempty"`
	// Temperature is the sampling temperature, 0..2 (nil: 1, as OpenAI;
	// 0: greedy).
	Temperature *float64 `json:"temperature,omitempty"`
	// TopP is nucleus sampling's probability mass, 0..1 (nil: 1; 0:
	// greedy).
	TopP *float64 `json:"top_p,omitempty"`
	// Seed makes sampling repeatable (nil: a seed of the server's).
	Seed *int64 `json:"seed,omitempty"`
	// Stop lists up to 4 strings that end the completion where they
	// appear in the decoded text (a string or an array in the JSON): the
	// first to complete, byte by byte, ends it, and the text returned
	// stops where that string starts.
	Stop []string `json:"stop,omitempty"`
	// Stream asks for server-sent events.
	Stream bool `json:"stream,omitempty"`
	// StreamOptions tune the stream (only with Stream).
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
	// N is the number of choices per prompt, 1..MaxChoices (nil: 1),
	// sampled independently: with a Seed, the choice of index i samples
	// with seed Seed+i (two's complement wrap), so that it equals a
	// request of n = 1 with that seed; without one, with the server's
	// seed of the request plus i. The prompt is prefilled once and its
	// sequence forked for the other choices.
	N *int `json:"n,omitempty"`
	// User is OpenAI's end-user id (ignored).
	User string `json:"user,omitempty"`
	// Quest chooses the request's page selection.
	Quest *QuestOptions `json:"quest,omitempty"`
	// Logprobs asks for each generated token's log-probability and this
	// many most likely alternatives, 0..20 (nil: none; OpenAI allows 5, vLLM 20).
	Logprobs *int `json:"logprobs,omitempty"`
	// TopK samples among the K most likely tokens only (vLLM's top_k;
	// nil, 0 or -1: all); MinP among the tokens at least MinP times as
	// likely as the most likely (vLLM's min_p, 0..1; nil or 0: all).
	// They apply after the temperature, top-k before top_p, min_p last.
	TopK *int     `json:"top_k,omitempty"`
	MinP *float64 `json:"min_p,omitempty"`
	// RepetitionPenalty divides the positive logits and multiplies the
	// others of the tokens in the prompt or the output so far (vLLM's
	// repetition_penalty, (0, 2]; nil or 1: none); FrequencyPenalty
	// subtracts itself times a token's count in the output so far, and
	// PresencePenalty itself once from every token of the output so far
	// (OpenAI's frequency_penalty and presence_penalty, -2..2; nil or 0:
	// none). They change the logits, in that order, before the
	// temperature, top_k, top_p and min_p, greedy decoding included;
	// logprobs stay the model's (vLLM's raw logprobs).
	RepetitionPenalty *float64 `json:"repetition_penalty,omitempty"`
	FrequencyPenalty  *float64 `json:"frequency_penalty,omitempty"`
	PresencePenalty   *float64 `json:"presence_penalty,omitempty"`
	// StopTokenIDs are token ids that end the completion when one is
	// generated (vLLM's stop_token_ids), as the model's EOS does:
	// finish_reason "stop", the token counted in completion_tokens, its
	// text not returned. Each must be in the vocabulary.
	StopTokenIDs []int `json:"stop_token_ids,omitempty"`
	// TruncatePromptTokens keeps only the last this many tokens of each
	// prompt (vLLM's truncate_prompt_tokens: the start of a long prompt
	// is cut, BOS included); -1 is the server's max_model_len; nil: no
	// truncation. A chat's rendered messages are truncated alike.
	TruncatePromptTokens *int `json:"truncate_prompt_tokens,omitempty"`

	// bestOf says that the body gave best_of 1 (resolve refuses it
	// with n > 1).
	bestOf bool
	// ignored are the fields of the body the server does not know, in
	// order ("stream_options.x" for one inside stream_options).
	ignored []string
	// maxTokensField is the chat field MaxTokens came from
	// (max_completion_tokens or max_tokens), named by its errors; ""
	// for a completion.
	maxTokensField string
}

// MarshalJSON writes r as the server reads it: the prompt is Prompt or,
// when Prompt is nil and Prompts is not, the array of Prompts (a batch).
func (r CompletionRequest) MarshalJSON() ([]byte, error) {
	type fields CompletionRequest // without this method
	v := struct {
		fields
		Prompt any `json:"prompt"`
	}{fields: fields(r), Prompt: r.Prompt}
	if r.Prompt == nil && r.Prompts != nil {
		v.Prompt = r.Prompts
	}
	return json.Marshal(v)
}

// StreamOptions are OpenAI's stream options.
type StreamOptions struct {
	// IncludeUsage adds a last chunk with no choices and the usage.
	IncludeUsage bool `json:"include_usage"`
}

// Prompt is a prompt string or, when IDs is not nil, token ids.
type Prompt struct {
	Text string
	IDs  []int
}

// MarshalJSON writes the string or the array of ids.
func (p Prompt) MarshalJSON() ([]byte, error) {
	if p.IDs != nil {
		return json.Marshal(p.IDs)
	}
	return json.Marshal(p.Text)
}

// QuestOptions are a request's page-selection settings; nil fields take
// the serving policy's values. The page size is the server's. The budget
// and dense layers apply per decode step on the main engine, and the
// dense selector reads every page of every layer there; a selector
// (quest, oracle, recent), GQA mode, sink or local pages other than the
// policy's put the request's sequence on an engine of its own, built for
// the request with the pages its admission reserved and released with
// it (with Config.Cluster: on the cluster's grid of its policy, which
// stays open; past Config.PolicyGrids such grids a request with yet
// other options gets 429). Either way the request decodes in the same
// batch as the others and gets the tokens it would get alone on an
// engine of its settings.
type QuestOptions struct {
	// Budget is the token budget per KV head and decode step (at least
	// one page; the page budget is Budget / page size). It overrides the
	// policy's default and per-layer budgets.
	Budget *int `json:"budget,omitempty"`
	// Selector is quest, oracle, recent or dense.
	Selector string `json:"selector,omitempty"`
	// GQA is group_max or per_head.
	GQA string `json:"gqa,omitempty"`
	// Sink and Local are the first and last pages always read (0..2^20).
	Sink  *int `json:"sink,omitempty"`
	Local *int `json:"local,omitempty"`
	// DenseLayers is the leading layers that attend densely (0..layers).
	DenseLayers *int `json:"dense_layers,omitempty"`
}

// decodeRequest reads a request body: one JSON object, no trailing
// data, no repeated fields, the JSON type of every known field checked,
// strings valid UTF-8 (no lone surrogate escapes); unknown fields are
// listed in the request's ignored. The error names the field.
func decodeRequest(body []byte) (*CompletionRequest, *apiError) {
	fields, aerr := object(body, "")
	if aerr != nil {
		return nil, aerr
	}
	req := &CompletionRequest{}
	for _, f := range fields {
		raw, key := f.raw, f.key
		known, err := sharedField(req, key, raw)
		if !known {
			switch key {
			case "prompt":
				req.Prompt, req.Prompts, err = prompts(raw)
			case "max_tokens":
				req.MaxTokens, err = integer(key, raw)
			case "logprobs":
				req.Logprobs, err = integer(key, raw)
			case "echo":
				var b *bool
				if b, err = boolean(key, raw); b != nil {
					req.Echo = *b
				}
			case "best_of", "suffix":
				if err = neutral(key, raw); err == nil && key == "best_of" {
					req.bestOf = !isNull(raw)
				}
			default:
				req.ignored = append(req.ignored, key)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	return req, nil
}

// sharedField decodes into req the field key of what a completion and
// a chat request share (model, sampling, stop, stream, n, user, quest,
// the neutral penalties); false for any other key.
func sharedField(req *CompletionRequest, key string, raw json.RawMessage) (bool, *apiError) {
	var err *apiError
	switch key {
	case "model":
		var s *string
		if s, err = str(key, raw); s != nil {
			req.Model = *s
		}
	case "temperature":
		req.Temperature, err = number(key, raw)
	case "top_p":
		req.TopP, err = number(key, raw)
	case "seed":
		req.Seed, err = integer64(key, raw)
	case "stop":
		req.Stop, err = stops(raw)
	case "stream":
		var b *bool
		if b, err = boolean(key, raw); b != nil {
			req.Stream = *b
		}
	case "stream_options":
		var ignored []string
		req.StreamOptions, ignored, err = streamOptions(raw)
		req.ignored = append(req.ignored, ignored...)
	case "n":
		req.N, err = integer(key, raw)
	case "user":
		var s *string
		if s, err = str(key, raw); s != nil {
			req.User = *s
		}
	case "quest":
		req.Quest, err = questOptions(raw)
	case "top_k":
		req.TopK, err = integer(key, raw)
	case "min_p":
		req.MinP, err = number(key, raw)
	case "stop_token_ids":
		req.StopTokenIDs, err = tokenIDs(key, raw)
	case "truncate_prompt_tokens":
		req.TruncatePromptTokens, err = integer(key, raw)
	case "repetition_penalty":
		req.RepetitionPenalty, err = number(key, raw)
	case "frequency_penalty":
		req.FrequencyPenalty, err = number(key, raw)
	case "presence_penalty":
		req.PresencePenalty, err = number(key, raw)
	case "logit_bias", "tools", "tool_choice", "functions", "function_call", "response_format":
		err = neutral(key, raw)
	default:
		return false, nil
	}
	return true, err
}

// field is one member of a JSON object, in order.
type field struct {
	key string
	raw json.RawMessage
}

// object splits one JSON object into its members, refusing repeated
// keys; prefix names the object in errors ("" for the body, "quest."
// inside it).
func object(b []byte, prefix string) ([]field, *apiError) {
	what := "the request body"
	param := ""
	if prefix != "" {
		param = strings.TrimSuffix(prefix, ".")
		what = param
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, badParam(param, "invalid_json", "%s is not valid JSON: %v", what, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, badParam(param, "invalid_type", "%s must be a JSON object", what)
	}
	var fields []field
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, badParam(param, "invalid_json", "%s is not valid JSON: %v", what, err)
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, badParam(prefix+key, "invalid_json", "%s is not valid JSON: %v", what, err)
		}
		if seen[key] {
			return nil, badParam(prefix+key, "duplicate_parameter", "%s%s appears twice", prefix, key)
		}
		seen[key] = true
		fields = append(fields, field{key, raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, badParam(param, "invalid_json", "%s is not valid JSON: %v", what, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, badParam(param, "invalid_json", "%s has data after its JSON object", what)
	}
	return fields, nil
}

// kind names the JSON type of raw for messages.
func kind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func wrongType(param, want string, raw json.RawMessage) *apiError {
	return badParam(param, "invalid_type", "%s must be %s, not %s", param, want, kind(raw))
}

// str reads a string or null.
func str(param string, raw json.RawMessage) (*string, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	raw = bytes.TrimSpace(raw)
	if kind(raw) != "a string" {
		return nil, wrongType(param, "a string", raw)
	}
	if err := checkJSONString(raw); err != nil {
		return nil, badParam(param, "invalid_string", "%s: %v", param, err)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, wrongType(param, "a string", raw)
	}
	return &s, nil
}

// checkJSONString refuses a JSON string literal holding invalid UTF-8
// or an escaped lone surrogate (which decoding would silently turn into
// U+FFFD).
func checkJSONString(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("the string is not valid UTF-8")
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' || i+1 >= len(raw) {
			continue
		}
		if raw[i+1] != 'u' {
			i++ // \" \\ \n ...: skip the escaped byte
			continue
		}
		r, ok := hex4(raw, i+2)
		if !ok {
			return errors.New("bad \\u escape")
		}
		i += 5
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return fmt.Errorf("escape \\u%04X is a lone low surrogate, not a character", r)
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := rune(0), false
			if i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				lo, ok = hex4(raw, i+3)
			}
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return fmt.Errorf("escape \\u%04X is a lone high surrogate, not a character", r)
			}
			i += 6
		}
	}
	return nil
}

// hex4 parses the 4 hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(v), err == nil
}

// integer64 reads an integer (no fraction, no exponent) or null.
func integer64(param string, raw json.RawMessage) (*int64, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	raw = bytes.TrimSpace(raw)
	if kind(raw) != "a number" {
		return nil, wrongType(param, "an integer", raw)
	}
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		if bytes.ContainsAny(raw, ".eE") {
			return nil, badParam(param, "invalid_type", "%s must be an integer, not %s", param, raw)
		}
		return nil, badParam(param, "invalid_value", "%s %s is out of range", param, raw)
	}
	return &v, nil
}

// integer reads an integer that fits 32 bits, or null.
func integer(param string, raw json.RawMessage) (*int, *apiError) {
	v, err := integer64(param, raw)
	if err != nil || v == nil {
		return nil, err
	}
	if *v < math.MinInt32 || *v > math.MaxInt32 {
		return nil, badParam(param, "invalid_value", "%s %d is out of range", param, *v)
	}
	n := int(*v)
	return &n, nil
}

// tokenIDs reads an array of integers (token ids; their range is the
// caller's to check), or null.
func tokenIDs(param string, raw json.RawMessage) ([]int, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	if kind(raw) != "an array" {
		return nil, wrongType(param, "an array of token ids", raw)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, wrongType(param, "an array of token ids", raw)
	}
	ids := make([]int, 0, len(elems))
	for i, e := range elems {
		v, err := integer(fmt.Sprintf("%s[%d]", param, i), e)
		if err != nil {
			return nil, err
		}
		if v == nil {
			return nil, badParam(fmt.Sprintf("%s[%d]", param, i), "invalid_type", "%s[%d] must be a token id, not null", param, i)
		}
		ids = append(ids, *v)
	}
	return ids, nil
}

// number reads a number or null.
func number(param string, raw json.RawMessage) (*float64, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	raw = bytes.TrimSpace(raw)
	if kind(raw) != "a number" {
		return nil, wrongType(param, "a number", raw)
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return nil, badParam(param, "invalid_value", "%s %s is out of range", param, raw)
	}
	return &v, nil
}

// boolean reads true, false or null.
func boolean(param string, raw json.RawMessage) (*bool, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var b bool
	if kind(raw) != "a boolean" || json.Unmarshal(raw, &b) != nil {
		return nil, wrongType(param, "a boolean", raw)
	}
	return &b, nil
}

// prompt reads a string, an array of token ids or null.
func prompt(raw json.RawMessage) (*Prompt, *apiError) {
	p := &Prompt{}
	switch kind(raw) {
	case "null":
		return nil, nil
	case "a string":
		s, err := str("prompt", raw)
		if err != nil {
			return nil, err
		}
		p.Text = *s
		return p, nil
	case "an array":
		// Integers straight into ints: a long prompt of ids (millions,
		// under --max-request-bytes) costs 8 bytes an id, not a
		// json.RawMessage each; anything else goes the element-wise way
		// below for an error that names the element.
		var ids []int
		if err := json.Unmarshal(raw, &ids); err == nil && !bytes.ContainsAny(raw, ".eEn") {
			p.IDs = ids
			if p.IDs == nil {
				p.IDs = []int{}
			}
			return p, nil
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, wrongType("prompt", "a string or an array of token ids", raw)
		}
		p.IDs = make([]int, 0, len(elems))
		for i, e := range elems {
			if kind(e) != "a number" {
				return nil, badParam("prompt", "invalid_type", "prompt must be a string or an array of token ids: element %d is %s", i, kind(e))
			}
			v, err := integer(fmt.Sprintf("prompt[%d]", i), e)
			if err != nil {
				err.param = "prompt"
				return nil, err
			}
			p.IDs = append(p.IDs, *v)
		}
		return p, nil
	}
	return nil, wrongType("prompt", "a string or an array of token ids", raw)
}

// prompts reads a completion's prompt: what prompt reads, or a batch of
// prompts (an array of strings or of arrays of token ids, at most
// maxPrompts).
func prompts(raw json.RawMessage) (*Prompt, []Prompt, *apiError) {
	if kind(raw) != "an array" {
		p, err := prompt(raw)
		return p, nil, err
	}
	inner := bytes.TrimSpace(bytes.TrimSpace(raw)[1:])
	if len(inner) == 0 || (inner[0] != '"' && inner[0] != '[') {
		p, err := prompt(raw) // token ids, or an error naming the element
		return p, nil, err
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, nil, wrongType("prompt", "a string, an array of token ids or an array of prompts", raw)
	}
	if len(elems) > maxPrompts {
		return nil, nil, badParam("prompt", "invalid_value", "prompt has %d prompts; at most %d are allowed", len(elems), maxPrompts)
	}
	out := make([]Prompt, 0, len(elems))
	for i, e := range elems {
		k := kind(e)
		if k != "a string" && k != "an array" {
			return nil, nil, badParam("prompt", "invalid_type", "prompt[%d] is %s: a batch of prompts holds strings or arrays of token ids", i, k)
		}
		p, err := prompt(e)
		if err != nil {
			err.message = fmt.Sprintf("prompt[%d]: %s", i, err.message)
			return nil, nil, err
		}
		out = append(out, *p)
	}
	return nil, out, nil
}

// maxPrompts bounds a batch of prompts (the choices of a request are
// bounded too: see Server.resolve).
const maxPrompts = 256

// maxStops is OpenAI's limit on stop sequences.
const maxStops = 4

// stops reads a string, an array of strings or null.
func stops(raw json.RawMessage) ([]string, *apiError) {
	switch kind(raw) {
	case "null":
		return nil, nil
	case "a string":
		s, err := str("stop", raw)
		if err != nil {
			return nil, err
		}
		return []string{*s}, nil
	case "an array":
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, wrongType("stop", "a string or an array of strings", raw)
		}
		if len(elems) > maxStops {
			return nil, badParam("stop", "invalid_value", "stop has %d sequences; at most %d are allowed", len(elems), maxStops)
		}
		out := make([]string, 0, len(elems))
		for i, e := range elems {
			if kind(e) != "a string" {
				return nil, badParam("stop", "invalid_type", "stop must be a string or an array of strings: element %d is %s", i, kind(e))
			}
			s, err := str("stop", e)
			if err != nil {
				return nil, err
			}
			out = append(out, *s)
		}
		if len(out) == 0 {
			return nil, nil
		}
		return out, nil
	}
	return nil, wrongType("stop", "a string or an array of strings", raw)
}

// streamOptions reads {"include_usage": bool} or null, and lists the
// other fields (ignored, as vLLM's continuous_usage_stats).
func streamOptions(raw json.RawMessage) (*StreamOptions, []string, *apiError) {
	if isNull(raw) {
		return nil, nil, nil
	}
	if kind(raw) != "an object" {
		return nil, nil, wrongType("stream_options", "an object", raw)
	}
	fields, err := object(raw, "stream_options.")
	if err != nil {
		return nil, nil, err
	}
	o := &StreamOptions{}
	var ignored []string
	for _, f := range fields {
		if f.key != "include_usage" {
			ignored = append(ignored, "stream_options."+f.key)
			continue
		}
		b, err := boolean("stream_options.include_usage", f.raw)
		if err != nil {
			return nil, nil, err
		}
		if b != nil {
			o.IncludeUsage = *b
		}
	}
	return o, ignored, nil
}

// questOptions reads the quest object or null.
func questOptions(raw json.RawMessage) (*QuestOptions, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	if kind(raw) != "an object" {
		return nil, wrongType("quest", "an object", raw)
	}
	fields, aerr := object(raw, "quest.")
	if aerr != nil {
		return nil, aerr
	}
	q := &QuestOptions{}
	for _, f := range fields {
		param := "quest." + f.key
		var err *apiError
		var s *string
		switch f.key {
		case "budget":
			q.Budget, err = integer(param, f.raw)
		case "selector":
			if s, err = str(param, f.raw); s != nil {
				q.Selector = *s
			}
		case "gqa":
			if s, err = str(param, f.raw); s != nil {
				q.GQA = *s
			}
		case "sink":
			q.Sink, err = integer(param, f.raw)
		case "local":
			q.Local, err = integer(param, f.raw)
		case "dense_layers":
			q.DenseLayers, err = integer(param, f.raw)
		default:
			err = badParam(param, "unknown_parameter", "Unrecognized request argument supplied: %s", param)
		}
		if err != nil {
			return nil, err
		}
	}
	return q, nil
}

// neutral accepts an OpenAI parameter the server does not implement
// only at its neutral value.
func neutral(key string, raw json.RawMessage) *apiError {
	v := string(bytes.TrimSpace(raw))
	ok := v == "null"
	switch key {
	case "best_of":
		ok = ok || v == "1"
	case "logit_bias":
		fields, err := object(raw, key+".")
		ok = ok || (err == nil && len(fields) == 0)
	case "suffix":
		ok = ok || v == `""`
	case "tools", "functions":
		ok = ok || strings.Join(strings.Fields(v), "") == "[]"
	case "tool_choice", "function_call":
		ok = ok || v == `"none"`
	case "response_format":
		fields, err := object(raw, key+".")
		ok = ok || (err == nil && len(fields) == 1 && fields[0].key == "type" && string(bytes.TrimSpace(fields[0].raw)) == `"text"`)
	}
	if !ok {
		return badParam(key, "unsupported_parameter", "%s is not supported by this server (only its default value is accepted)", key)
	}
	return nil
}
