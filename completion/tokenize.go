package completion

import (
	"net/http"

	"github.com/questrt/questrt/chat"
	"github.com/questrt/questrt/model"
)

// TokenizeResponse is the answer of POST /tokenize (vLLM's): the prompt's
// token ids as a completion or a chat would prefill them, their count and
// the context bound.
type TokenizeResponse struct {
	Tokens      []int `json:"tokens"`
	Count       int   `json:"count"`
	MaxModelLen int   `json:"max_model_len,omitempty"`
	// TokenStrs is each token's text as logprobs name it, with
	// return_token_strs true (vLLM's); else null.
	TokenStrs []string `json:"token_strs"`
}

// DetokenizeResponse is the answer of POST /detokenize: the text of the
// ids.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// tokenize serves POST /tokenize: {"model", "prompt"} (a string: with
// BOS where the tokenizer has one, as a completion's; add_special_tokens
// false leaves it out) or {"model", "messages"} (rendered with the chat
// template, as a chat's); the model may be left out, as vLLM's, and
// return_token_strs true adds each token's text. Unknown fields are
// ignored and named as a completion's are. Nothing is admitted or run.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	ids, strs, ignored, aerr := s.tokenizeBody(body)
	if aerr != nil {
		s.invalid()
		aerr.write(w)
		return
	}
	s.ignore(w, "/tokenize", ignored)
	resp := TokenizeResponse{Tokens: ids, Count: len(ids), MaxModelLen: s.maxContext}
	if strs {
		resp.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			resp.TokenStrs[i] = model.TokenText(s.tok, id)
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// tokenizeBody reads a /tokenize body: the ids, whether the tokens'
// texts are asked for, and the ignored fields.
func (s *Server) tokenizeBody(body []byte) ([]int, bool, []string, *apiError) {
	fields, aerr := object(body, "")
	if aerr != nil {
		return nil, false, nil, aerr
	}
	var name, text *string
	var msgs []chat.Message
	var ignored []string
	special, strs := true, false
	var render chatOptions
	for _, f := range fields {
		known, err := render.field(f.key, f.raw)
		if err != nil {
			return nil, false, nil, err
		}
		if known {
			continue
		}
		switch f.key {
		case "model":
			name, err = str(f.key, f.raw)
		case "prompt":
			text, err = str(f.key, f.raw)
		case "messages":
			msgs, err = chatMessages(f.raw)
		case "add_special_tokens":
			var b *bool
			if b, err = boolean(f.key, f.raw); b != nil {
				special = *b
			}
		case "return_token_strs":
			var b *bool
			if b, err = boolean(f.key, f.raw); b != nil {
				strs = *b
			}
		default:
			ignored = append(ignored, f.key)
		}
		if err != nil {
			return nil, false, nil, err
		}
	}
	modelName := ""
	if name != nil {
		modelName = *name
	}
	if err := s.checkModel(modelName); err != nil {
		return nil, false, nil, err
	}
	switch {
	case (text == nil) == (msgs == nil):
		return nil, false, nil, badParam("prompt", "invalid_value", "give a prompt or messages (one of them)")
	case msgs != nil:
		if err := render.check(); err != nil {
			return nil, false, nil, err
		}
		ids, err := s.chatPromptIDs(msgs, render)
		return ids, strs, ignored, err
	case !special:
		return s.tok.Encode(*text), strs, ignored, nil
	}
	return model.PromptIDs(s.tok, *text), strs, ignored, nil
}

// detokenize serves POST /detokenize: {"model", "tokens": [ids]} (the
// model may be left out; unknown fields are ignored and named).
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	fields, aerr := object(body, "")
	var name *string
	var ids *Prompt
	var ignored []string
	for _, f := range fields {
		if aerr != nil {
			break
		}
		switch f.key {
		case "model":
			name, aerr = str(f.key, f.raw)
		case "tokens":
			if kind(f.raw) != "an array" {
				aerr = wrongType("tokens", "an array of token ids", f.raw)
				break
			}
			if ids, aerr = prompt(f.raw); aerr != nil {
				aerr = badParam("tokens", "invalid_type", "tokens must be an array of token ids")
			}
		default:
			ignored = append(ignored, f.key)
		}
	}
	if aerr == nil {
		modelName := ""
		if name != nil {
			modelName = *name
		}
		aerr = s.checkModel(modelName)
	}
	if aerr == nil && ids == nil {
		aerr = badParam("tokens", "missing_required_parameter", "you must provide a tokens parameter")
	}
	if aerr == nil {
		for i, id := range ids.IDs {
			if id < 0 || id >= s.m.Config.VocabSize {
				aerr = badParam("tokens", "invalid_value", "token %d at index %d is outside the vocabulary of %d", id, i, s.m.Config.VocabSize)
				break
			}
		}
	}
	if aerr != nil {
		s.invalid()
		aerr.write(w)
		return
	}
	s.ignore(w, "/detokenize", ignored)
	writeJSON(w, http.StatusOK, DetokenizeResponse{Prompt: s.tok.Decode(ids.IDs)})
}
