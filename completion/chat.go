package completion

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/questrt/questrt/chat"
)

// ChatRequest is the body of POST /v1/chat/completions as this server
// reads it: OpenAI's chat completions request (text content only) and
// the "quest" extension. The messages are rendered with the model's chat
// template (Config.ChatTemplate) into the prompt, tokenized without
// adding BOS (the template writes it; see package chat), and the rest
// runs as a completion. Decoding is as for completions (known fields
// strictly, the same fields accepted only at their neutral values,
// unknown ones ignored and named in the X-Questrt-Ignored-Fields
// header); the messages' fields are all checked.
type ChatRequest struct {
	// Common holds what a chat shares with a completion (Prompt and
	// Logprobs unused: the messages are rendered into the prompt).
	// Its MaxTokens is max_completion_tokens or the older max_tokens
	// (both given: they must agree).
	Common   CompletionRequest
	Messages []chat.Message
	// Logprobs asks for each generated token's log-probability, with
	// TopLogprobs (0..20) alternatives.
	Logprobs    bool
	TopLogprobs *int
	// Echo prepends the last message's content to every choice's
	// message when that message is the assistant's (the role of the
	// answer), as vLLM's chat echo does; else there is nothing to echo.
	// Not with Logprobs.
	Echo bool

	// render is how the messages are rendered: vLLM's
	// add_generation_prompt, continue_final_message and
	// chat_template_kwargs.
	render chatOptions
}

// chatOptions are vLLM's fields that change how a chat's messages are
// rendered: add_generation_prompt (default true: open the assistant's
// turn), continue_final_message (end the prompt inside the last message,
// for the model to continue it; only with add_generation_prompt false)
// and chat_template_kwargs (further template variables).
type chatOptions struct {
	noGenerationPrompt bool
	continueFinal      bool
	vars               map[string]any
}

// field reads key into o when it is one of o's; false for another key.
func (o *chatOptions) field(key string, raw json.RawMessage) (bool, *apiError) {
	var err *apiError
	switch key {
	case "add_generation_prompt":
		var b *bool
		if b, err = boolean(key, raw); b != nil {
			o.noGenerationPrompt = !*b
		}
	case "continue_final_message":
		var b *bool
		if b, err = boolean(key, raw); b != nil {
			o.continueFinal = *b
		}
	case "chat_template_kwargs":
		if isNull(raw) {
			break
		}
		if kind(raw) != "an object" {
			return true, wrongType(key, "an object of template variables", raw)
		}
		if e := json.Unmarshal(raw, &o.vars); e != nil {
			return true, wrongType(key, "an object of template variables", raw)
		}
		for _, r := range chat.Reserved {
			if _, ok := o.vars[r]; ok {
				return true, badParam(key+"."+r, "invalid_value", "chat_template_kwargs.%s: the server sets %s (give it as a request field, or not at all)", r, r)
			}
		}
	default:
		return false, nil
	}
	return true, err
}

// check refuses contradicting options.
func (o *chatOptions) check() *apiError {
	if o.continueFinal && !o.noGenerationPrompt {
		return badParam("continue_final_message", "invalid_value", "continue_final_message true needs add_generation_prompt false (the prompt ends inside the last message, not in a new turn)")
	}
	return nil
}

// chatRoles are the roles a message may have.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// decodeChatRequest reads a chat request as decodeRequest reads a
// completion's: known fields strictly, unknown ones listed in
// Common.ignored. The messages are read strictly (a field of a message
// the server does not know would change the prompt).
func decodeChatRequest(body []byte) (*ChatRequest, *apiError) {
	fields, aerr := object(body, "")
	if aerr != nil {
		return nil, aerr
	}
	req := &ChatRequest{}
	var maxTokens, maxCompletion *int
	for _, f := range fields {
		raw, key := f.raw, f.key
		known, err := sharedField(&req.Common, key, raw)
		if !known {
			known, err = req.render.field(key, raw)
		}
		if !known {
			switch key {
			case "messages":
				req.Messages, err = chatMessages(raw)
			case "max_tokens":
				maxTokens, err = integer(key, raw)
			case "max_completion_tokens":
				maxCompletion, err = integer(key, raw)
			case "logprobs":
				var b *bool
				if b, err = boolean(key, raw); b != nil {
					req.Logprobs = *b
				}
			case "top_logprobs":
				req.TopLogprobs, err = integer(key, raw)
			case "echo":
				var b *bool
				if b, err = boolean(key, raw); b != nil {
					req.Echo = *b
				}
			default:
				req.Common.ignored = append(req.Common.ignored, key)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if t := req.TopLogprobs; t != nil {
		switch {
		case *t < 0 || *t > maxChatTopLogprobs:
			return nil, badParam("top_logprobs", "invalid_value", "top_logprobs %d: want 0..%d", *t, maxChatTopLogprobs)
		case !req.Logprobs && *t > 0:
			return nil, badParam("top_logprobs", "invalid_value", "top_logprobs needs logprobs true")
		}
	}
	if err := req.render.check(); err != nil {
		return nil, err
	}
	if req.Echo && req.Logprobs {
		return nil, badParam("echo", "invalid_value", "echo with logprobs is not supported for chat (the prompt's log-probabilities are a completion's: /v1/completions)")
	}
	req.Common.MaxTokens, req.Common.maxTokensField = maxCompletion, "max_completion_tokens"
	if maxTokens != nil {
		if maxCompletion != nil && *maxCompletion != *maxTokens {
			return nil, badParam("max_tokens", "invalid_value", "max_tokens %d and max_completion_tokens %d disagree (give one)", *maxTokens, *maxCompletion)
		}
		if maxCompletion == nil {
			req.Common.MaxTokens, req.Common.maxTokensField = maxTokens, "max_tokens"
		}
	}
	return req, nil
}

// chatMessages reads the messages: a non-empty array of objects with a
// role and a content (a string, or an array of text parts, joined).
func chatMessages(raw json.RawMessage) ([]chat.Message, *apiError) {
	if kind(raw) != "an array" {
		return nil, wrongType("messages", "an array of messages", raw)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, wrongType("messages", "an array of messages", raw)
	}
	if len(elems) == 0 {
		return nil, badParam("messages", "invalid_value", "messages must hold at least one message")
	}
	out := make([]chat.Message, 0, len(elems))
	for i, e := range elems {
		at := fmt.Sprintf("messages[%d]", i)
		fields, aerr := object(e, at+".")
		if aerr != nil {
			return nil, aerr
		}
		var m chat.Message
		var role, content bool
		for _, f := range fields {
			var err *apiError
			switch f.key {
			case "role":
				var s *string
				if s, err = str(at+".role", f.raw); err == nil {
					if s == nil || !chatRoles[*s] {
						err = badParam(at+".role", "invalid_value", "%s.role must be one of system, developer, user, assistant, tool", at)
					} else {
						m.Role, role = *s, true
					}
				}
			case "content":
				m.Content, err = chatContent(at+".content", f.raw)
				content = err == nil
			case "name":
				_, err = str(at+".name", f.raw)
			default:
				err = badParam(at+"."+f.key, "unknown_parameter", "Unrecognized message argument supplied: %s.%s (text messages only)", at, f.key)
			}
			if err != nil {
				return nil, err
			}
		}
		switch {
		case !role:
			return nil, badParam(at+".role", "missing_required_parameter", "%s has no role", at)
		case !content:
			return nil, badParam(at+".content", "missing_required_parameter", "%s has no content", at)
		}
		out = append(out, m)
	}
	return out, nil
}

// chatContent reads a message's content: a string, or an array of
// {"type": "text", "text": ...} parts (joined).
func chatContent(param string, raw json.RawMessage) (string, *apiError) {
	switch kind(raw) {
	case "a string":
		s, err := str(param, raw)
		if err != nil {
			return "", err
		}
		return *s, nil
	case "an array":
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", wrongType(param, "a string or an array of text parts", raw)
		}
		var b strings.Builder
		for i, p := range parts {
			at := fmt.Sprintf("%s[%d]", param, i)
			fields, aerr := object(p, at+".")
			if aerr != nil {
				return "", aerr
			}
			var typ, text *string
			for _, f := range fields {
				var err *apiError
				switch f.key {
				case "type":
					typ, err = str(at+".type", f.raw)
				case "text":
					text, err = str(at+".text", f.raw)
				default:
					err = badParam(at+"."+f.key, "unknown_parameter", "Unrecognized content part argument supplied: %s.%s", at, f.key)
				}
				if err != nil {
					return "", err
				}
			}
			if typ == nil || *typ != "text" || text == nil {
				return "", badParam(at, "invalid_value", "%s: only {\"type\": \"text\", \"text\": ...} parts are supported", at)
			}
			b.WriteString(*text)
		}
		return b.String(), nil
	}
	return "", wrongType(param, "a string or an array of text parts", raw)
}

// chatPromptIDs renders msgs with the server's template (as o says) and
// tokenizes the text: without BOS, which the template writes, except
// that a checkpoint whose template has no BOS text to write (no
// bos_token in tokenizer_config.json) while its tokenizer has a BOS gets
// the BOS id first, as a completion's prompt does.
func (s *Server) chatPromptIDs(msgs []chat.Message, o chatOptions) ([]int, *apiError) {
	t := s.cfg.ChatTemplate
	if t == nil {
		msg := "This model has no chat template: start the server with one (questd --chat-template FILE)."
		if s.chatErr != nil {
			msg = fmt.Sprintf("This model's chat template cannot be used (%v): start the server with another (questd --chat-template FILE).", s.chatErr)
		}
		return nil, badParam("messages", "no_chat_template", "%s", msg)
	}
	text, err := t.RenderVars(msgs, !o.noGenerationPrompt, o.vars)
	if err != nil {
		return nil, badParam("messages", "invalid_value", "%v", err)
	}
	if o.continueFinal {
		// As vLLM: the rendering up to the end of the last message's
		// content (its end-of-turn text cut).
		last := msgs[len(msgs)-1].Content
		i := strings.LastIndex(text, last)
		if last == "" || i < 0 {
			return nil, badParam("continue_final_message", "invalid_value", "the chat template's rendering does not hold the last message's content (an empty one cannot be continued)")
		}
		text = text[:i+len(last)]
	}
	ids := s.tok.Encode(text)
	if t.Tokens().BOS == "" && s.tok.BOS() >= 0 {
		ids = append([]int{s.tok.BOS()}, ids...)
	}
	if len(ids) == 0 {
		return nil, badParam("messages", "invalid_value", "the chat template rendered the messages into no tokens")
	}
	return ids, nil
}

// chatCompletions serves POST /v1/chat/completions.
func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	arrived := time.Now()
	req, aerr := decodeChatRequest(body)
	if aerr == nil {
		aerr = s.checkModel(req.Common.Model)
	}
	if aerr == nil && req.Messages == nil {
		aerr = badParam("messages", "missing_required_parameter", "you must provide a messages parameter")
	}
	var ids []int
	if aerr == nil {
		ids, aerr = s.chatPromptIDs(req.Messages, req.render)
	}
	if aerr == nil {
		creq := req.Common
		creq.Prompt = &Prompt{IDs: ids}
		var p params
		if p, aerr = s.resolve(&creq); aerr == nil {
			s.ignore(w, "/v1/chat/completions", creq.ignored)
			p.chat = true
			if last := req.Messages[len(req.Messages)-1]; req.Echo && last.Role == "assistant" && last.Content != "" {
				p.echo, p.echoes = true, []string{last.Content}
			}
			if req.Logprobs {
				p.logprobs = true
				if req.TopLogprobs != nil {
					p.topLogprobs = *req.TopLogprobs
				}
			}
			s.run(w, r, p, arrived)
			return
		}
		if aerr.param == "prompt" {
			aerr.param = "messages" // the rendered messages are the prompt
		}
	}
	s.notResolved(aerr)
	aerr.write(w)
}

// ChatCompletion is OpenAI's chat.completion object, and (as
// chat.completion.chunk, with Delta set instead of Message) each chunk of
// a stream.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
}

// ChatChoice is one answer: Message in a chat.completion, Delta in a
// chunk. FinishReason as Choice's. Logprobs is null unless the request
// asked for it (logprobs true).
type ChatChoice struct {
	Index        int           `json:"index"`
	Message      *ChatMessage  `json:"message,omitempty"`
	Delta        *ChatMessage  `json:"delta,omitempty"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// ChatMessage is the assistant's message, or a chunk's part of it (Role
// in the first chunk only).
type ChatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// chatChunk is j's chat.completion.chunk holding text; first adds the
// assistant's role.
func (s *Server) chatChunk(j *job, text string, finish *string, first bool) ChatCompletion {
	d := &ChatMessage{Content: text}
	if first {
		d.Role = "assistant"
	}
	return ChatCompletion{ID: "chat" + j.id, Object: "chat.completion.chunk", Created: j.created, Model: s.name,
		Choices: []ChatChoice{{Index: j.p.index, Delta: d, FinishReason: finish}}}
}
