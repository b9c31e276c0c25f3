package completion

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/chat"
	"github.com/questrt/questrt/model"
)

// passThrough is a chat template that renders the messages' contents
// one after the other: with no BOS text (the byte models' tokenizer has
// none) the server puts the BOS id first, so that a chat whose one
// message is a prompt runs exactly that completion.
func passThrough(t testing.TB) *chat.Template {
	t.Helper()
	tm, err := chat.Parse("{% for m in messages %}{{ m['content'] }}{% endfor %}", chat.Tokens{}, "pass-through")
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// chatEvents decodes a chat stream's chunks strictly: the text, the
// finish reason, the usage chunk and whether the first chunk carried the
// assistant's role (and only the first).
func chatEvents(t testing.TB, events []string) (text, finish string, usage *Usage, role bool) {
	t.Helper()
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", events)
	}
	var b strings.Builder
	for i, e := range events[:len(events)-1] {
		var c ChatCompletion
		dec := json.NewDecoder(bytes.NewReader([]byte(e)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("chunk %s: %v", e, err)
		}
		if c.Object != "chat.completion.chunk" || !strings.HasPrefix(c.ID, "chatcmpl-") {
			t.Fatalf("chunk %s: object %q id %q", e, c.Object, c.ID)
		}
		if c.Usage != nil {
			usage = c.Usage
			continue
		}
		if len(c.Choices) != 1 || c.Choices[0].Delta == nil || c.Choices[0].Message != nil {
			t.Fatalf("chunk %s: want one choice with a delta", e)
		}
		d := c.Choices[0].Delta
		if (d.Role == "assistant") != (i == 0) {
			t.Fatalf("chunk %d %s: role %q (the first chunk alone says assistant)", i, e, d.Role)
		}
		role = role || d.Role == "assistant"
		b.WriteString(d.Content)
		if f := c.Choices[0].FinishReason; f != nil {
			finish = *f
		}
	}
	return b.String(), finish, usage, role
}

// TestChatCompletions: a chat of one user message holding the passkey
// prompt, through the pass-through template, answers the pass key as the
// completion of that prompt does (same tokens, same usage), as a
// chat.completion and streamed as chat.completion.chunk events (the
// role first, the usage chunk, [DONE]); max_completion_tokens and text
// parts work as max_tokens and a string.
func TestChatCompletions(t *testing.T) {
	m, tok, mdir := passkeyModel(t)
	name := filepath.Base(mdir)
	cfg := testConfig(name)
	cfg.ChatTemplate = passThrough(t)
	s, ts := startServer(t, m, tok, cfg)
	prompt, key := passkeyPrompt(t, mdir)
	want := complete(t, ts.URL, map[string]any{"model": name, "prompt": prompt, "max_tokens": 5, "temperature": 0})
	half := len(prompt) / 2
	for _, body := range []map[string]any{
		{"model": name, "messages": []any{map[string]any{"role": "user", "content": prompt}}, "max_tokens": 5, "temperature": 0},
		{"model": name, "messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": prompt[:half]}, map[string]any{"type": "text", "text": prompt[half:]}}}},
			"max_completion_tokens": 5, "temperature": 0},
	} {
		b, _ := json.Marshal(body)
		status, _, out := post(t, ts.URL+"/v1/chat/completions", string(b))
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, out)
		}
		var c ChatCompletion
		dec := json.NewDecoder(bytes.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if c.Object != "chat.completion" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Model != name || len(c.Choices) != 1 {
			t.Fatalf("answer %s", out)
		}
		ch := c.Choices[0]
		if ch.Message == nil || ch.Message.Role != "assistant" || ch.Message.Content != key || ch.FinishReason == nil || *ch.FinishReason != "length" {
			t.Errorf("chat answer %s, want the pass key %q", out, key)
		}
		if c.Usage == nil || uncached(*c.Usage) != uncached(*want.Usage) {
			t.Errorf("chat usage %+v, the completion's %+v", c.Usage, want.Usage)
		}
	}
	b, _ := json.Marshal(map[string]any{"model": name, "messages": []any{map[string]any{"role": "user", "content": prompt}},
		"max_tokens": 5, "temperature": 0, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("stream: status %d, %s", resp.StatusCode, ct)
	}
	text, finish, usage, role := chatEvents(t, sseEvents(t, resp.Body))
	if text != key || finish != "length" || !role || usage == nil || uncached(*usage) != uncached(*want.Usage) {
		t.Errorf("chat stream %q (%s, role %t, usage %+v), want %q", text, finish, role, usage, key)
	}
	waitStats(t, s, "the chats done", func(st Stats) bool { return st.Running+st.Queued == 0 })
}

// TestChatBadRequests: every bad chat request is a 400 (404 for the
// model) naming the field, and changes nothing: no template, a template
// that refuses the conversation, and the messages' shapes.
func TestChatBadRequests(t *testing.T) {
	m, tok := tinyModel(t)
	none, tsNone := startServer(t, m, tok, testConfig("tiny"))
	status, _, body := post(t, tsNone.URL+"/v1/chat/completions", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}`)
	var e ErrorBody
	if err := json.Unmarshal(body, &e); err != nil || status != 400 || e.Error.Param == nil || *e.Error.Param != "messages" || e.Error.Code == nil ||
		*e.Error.Code != "no_chat_template" || !strings.Contains(e.Error.Message, "--chat-template") {
		t.Errorf("no template: %d %s", status, body)
	}
	unchanged(t, none, 0)

	strict, err := chat.Parse(`{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}{{ m['content'] }}{% endfor %}`, chat.Tokens{}, "strict")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("tiny")
	cfg.ChatTemplate = strict
	s, ts := startServer(t, m, tok, cfg)
	user := `{"role": "user", "content": "hi"}`
	for _, c := range []struct {
		name, body, param string
		status            int
	}{
		{"roles not alternating", `{"model": "tiny", "messages": [` + user + `, ` + user + `]}`, "messages", 400},
		{"no messages", `{"model": "tiny", "messages": []}`, "messages", 400},
		{"messages missing", `{"model": "tiny"}`, "messages", 400},
		{"messages not an array", `{"model": "tiny", "messages": "hi"}`, "messages", 400},
		{"bad role", `{"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]}`, "messages[0].role", 400},
		{"no role", `{"model": "tiny", "messages": [{"content": "hi"}]}`, "messages[0].role", 400},
		{"no content", `{"model": "tiny", "messages": [{"role": "user"}]}`, "messages[0].content", 400},
		{"image part", `{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`, "messages[0].content[0].image_url", 400},
		{"tool calls", `{"model": "tiny", "messages": [{"role": "assistant", "content": "x", "tool_calls": []}]}`, "messages[0].tool_calls", 400},
		{"tools", `{"model": "tiny", "messages": [` + user + `], "tools": [{"type": "function", "function": {"name": "f"}}]}`, "tools", 400},
		{"echo with logprobs", `{"model": "tiny", "messages": [` + user + `], "echo": true, "logprobs": true}`, "echo", 400},
		{"echo type", `{"model": "tiny", "messages": [` + user + `], "echo": 1}`, "echo", 400},
		{"logprobs", `{"model": "tiny", "messages": [` + user + `], "logprobs": 1}`, "logprobs", 400},
		{"top_logprobs", `{"model": "tiny", "messages": [` + user + `], "logprobs": true, "top_logprobs": -1}`, "top_logprobs", 400},
		{"max tokens disagree", `{"model": "tiny", "messages": [` + user + `], "max_tokens": 3, "max_completion_tokens": 4}`, "max_tokens", 400},
		{"max tokens zero", `{"model": "tiny", "messages": [` + user + `], "max_completion_tokens": 0}`, "max_completion_tokens", 400},
		{"old max tokens zero", `{"model": "tiny", "messages": [` + user + `], "max_tokens": 0}`, "max_tokens", 400},
		{"n", `{"model": "tiny", "messages": [` + user + `], "n": 17}`, "n", 400},
		{"too long", `{"model": "tiny", "messages": [{"role": "user", "content": "` + strings.Repeat("a", 4100) + `"}]}`, "messages", 400},
		{"unknown model", `{"model": "other", "messages": [` + user + `, ` + user + `]}`, "model", 404},
	} {
		status, _, body := post(t, ts.URL+"/v1/chat/completions", c.body)
		var e ErrorBody
		if err := json.Unmarshal(body, &e); err != nil || status != c.status || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s: %d %s, want %d naming %s", c.name, status, body, c.status, c.param)
		}
	}
	// The error names the field the body gave, and says nothing of a
	// completion's echo (a chat's echo does not allow max_tokens 0).
	for _, field := range []string{"max_completion_tokens", "max_tokens"} {
		_, _, body := post(t, ts.URL+"/v1/chat/completions", `{"model": "tiny", "messages": [`+user+`], "`+field+`": -1}`)
		var e ErrorBody
		if err := json.Unmarshal(body, &e); err != nil || !strings.HasPrefix(e.Error.Message, field+" -1: ") || strings.Contains(e.Error.Message, "echo") {
			t.Errorf("%s -1: %s, want a message about %s without echo", field, body, field)
		}
	}
	if status, _, body := post(t, ts.URL+"/v1/chat/completions", `{"model": "tiny", "messages": [`+user+`], "max_tokens": 2, "temperature": 0, "logprobs": false, "top_logprobs": null}`); status != 200 {
		t.Errorf("a good chat after the refusals: %d %s", status, body)
	}
	waitStats(t, s, "the chat done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	unchanged(t, s, 1)
}

// TestChatRenderOptions: vLLM's rendering fields of a chat and of
// /tokenize: add_generation_prompt false leaves the assistant's turn
// unopened; chat_template_kwargs reach the template as variables (a
// Qwen 3 style enable_thinking false); continue_final_message (with
// add_generation_prompt false) ends the prompt inside the last message,
// and a chat so asked answers as a completion of those ids; bad
// combinations and reserved or mistyped variables get 400 naming the
// field.
func TestChatRenderOptions(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	tm, err := chat.Parse("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"+
		"{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}",
		chat.Tokens{}, "tags")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ChatTemplate = tm
	cfg.PrefixCaching = false
	_, ts := startServer(t, m, tok, cfg)
	msgs := `[{"role": "user", "content": "Say it."}, {"role": "assistant", "content": "Sure, it is"}]`
	rendered := func(fields string) (string, int) {
		t.Helper()
		status, _, body := post(t, ts.URL+"/tokenize", `{"messages": `+msgs+fields+`}`)
		var tr TokenizeResponse
		if err := json.Unmarshal(body, &tr); err != nil || status != http.StatusOK {
			t.Fatalf("tokenize %s: %d %s", fields, status, body)
		}
		return tok.Decode(tr.Tokens), tr.Count
	}
	const turns = "<user>Say it.</user><assistant>Sure, it is</assistant>"
	for _, c := range []struct{ fields, want string }{
		{``, turns + "<assistant>"},
		{`, "add_generation_prompt": true`, turns + "<assistant>"},
		{`, "add_generation_prompt": false`, turns},
		{`, "chat_template_kwargs": {"enable_thinking": false}`, turns + "<assistant><think></think>"},
		{`, "chat_template_kwargs": {"enable_thinking": true}`, turns + "<assistant>"},
		{`, "add_generation_prompt": false, "continue_final_message": true`, "<user>Say it.</user><assistant>Sure, it is"},
	} {
		if got, _ := rendered(c.fields); got != c.want {
			t.Errorf("messages%s: rendered %q, want %q", c.fields, got, c.want)
		}
	}
	// A chat continuing the last message is the completion of its ids.
	_, n := rendered(`, "add_generation_prompt": false, "continue_final_message": true`)
	status, _, body := post(t, ts.URL+"/v1/chat/completions", `{"messages": `+msgs+`, "add_generation_prompt": false, "continue_final_message": true, "max_tokens": 6, "temperature": 0}`)
	var ch ChatCompletion
	if err := json.Unmarshal(body, &ch); err != nil || status != http.StatusOK {
		t.Fatalf("chat continuing the last message: %d %s", status, body)
	}
	ids := model.PromptIDs(tok, "<user>Say it.</user><assistant>Sure, it is")
	want := complete(t, ts.URL, map[string]any{"prompt": ids, "max_tokens": 6, "temperature": 0})
	if ch.Usage.PromptTokens != n || ch.Usage.PromptTokens != len(ids) || ch.Choices[0].Message.Content != want.Choices[0].Text {
		t.Errorf("chat continuing: %d prompt tokens %q; the completion of the %d ids (tokenize: %d) %q", ch.Usage.PromptTokens, ch.Choices[0].Message.Content, len(ids), n, want.Choices[0].Text)
	}
	for _, c := range []struct{ path, fields, param string }{
		{"/v1/chat/completions", `, "continue_final_message": true`, "continue_final_message"},
		{"/tokenize", `, "continue_final_message": true`, "continue_final_message"},
		{"/v1/chat/completions", `, "chat_template_kwargs": {"messages": []}`, "chat_template_kwargs.messages"},
		{"/tokenize", `, "chat_template_kwargs": {"bos_token": "x"}`, "chat_template_kwargs.bos_token"},
		{"/v1/chat/completions", `, "chat_template_kwargs": ["enable_thinking"]`, "chat_template_kwargs"},
		{"/v1/chat/completions", `, "add_generation_prompt": "no"`, "add_generation_prompt"},
	} {
		status, _, body := post(t, ts.URL+c.path, `{"messages": `+msgs+c.fields+`}`)
		if status != http.StatusBadRequest || errParam(t, body) != c.param {
			t.Errorf("%s with%s: %d %s; want 400 naming %s", c.path, c.fields, status, body, c.param)
		}
	}
}
