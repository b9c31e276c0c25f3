package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// reference is testdata/expected.json: what Hugging Face's JavaScript
// Jinja renders (testdata/render.mjs says how it was made).
type reference struct {
	Renderer string `json:"renderer"`
	Results  []struct {
		Template     string `json:"template"`
		Conversation string `json:"conversation"`
		Gen          bool   `json:"add_generation_prompt"`
		Text         *string
		Error        string `json:"error"`
	} `json:"results"`
}

type cases struct {
	Tokens struct {
		BOS string `json:"bos"`
		EOS string `json:"eos"`
	} `json:"tokens"`
	Conversations map[string][]struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"conversations"`
}

func readJSON(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// TestRenderMatchesReference renders templates written as eight model
// families publish them (ChatML/Qwen, Llama 2 and 3, Mistral, Zephyr,
// Gemma, Phi-3, and one with namespace, filters and a filtered loop)
// over six conversations, with and without the generation prompt, and
// requires Hugging Face's own renderer's text byte for byte, or an error
// wrapping ErrRender where it raised (roles that do not alternate, a
// system turn a template refuses).
func TestRenderMatchesReference(t *testing.T) {
	var ref reference
	var cs cases
	readJSON(t, "expected.json", &ref)
	readJSON(t, "cases.json", &cs)
	if len(ref.Results) < 8*6*2 {
		t.Fatalf("%d reference results, want every template x conversation x generation prompt", len(ref.Results))
	}
	tmpls := map[string]*Template{}
	raised := 0
	for _, r := range ref.Results {
		tm := tmpls[r.Template]
		if tm == nil {
			src, err := os.ReadFile(filepath.Join("testdata", "templates", r.Template))
			if err != nil {
				t.Fatal(err)
			}
			if tm, err = Parse(string(src), Tokens{BOS: cs.Tokens.BOS, EOS: cs.Tokens.EOS}, r.Template); err != nil {
				t.Fatalf("%s: %v", r.Template, err)
			}
			tmpls[r.Template] = tm
		}
		var msgs []Message
		for _, m := range cs.Conversations[r.Conversation] {
			msgs = append(msgs, Message{Role: m.Role, Content: m.Content})
		}
		got, err := tm.Render(msgs, r.Gen)
		what := r.Template + " " + r.Conversation
		if r.Gen {
			what += " +generation prompt"
		}
		if r.Text == nil {
			raised++
			if !errors.Is(err, ErrRender) {
				t.Errorf("%s: rendered %q, want an error (%s raised %q)", what, got, ref.Renderer, r.Error)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v, want %q", what, err, *r.Text)
			continue
		}
		if got != *r.Text {
			t.Errorf("%s:\n got %q\nwant %q (%s)", what, got, *r.Text, ref.Renderer)
		}
	}
	if raised == 0 {
		t.Error("no reference case raised: the refusals are untested")
	}
}

// TestLoad reads templates the ways checkpoints ship them: a string, a
// list of named templates ("default" taken), special tokens as strings or
// AddedToken objects, chat_template.jinja taking precedence; and the
// refusals: no template, a list without "default", a template that does
// not compile.
func TestLoad(t *testing.T) {
	write := func(dir, name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	msgs := []Message{{Role: "user", Content: "hi"}}
	for _, c := range []struct {
		name, config, jinjaFile, want string
		err                           error
	}{
		{"string", `{"chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}", "bos_token": "<s>", "eos_token": "</s>"}`, "", "<s>hi</s>", nil},
		{"added tokens", `{"chat_template": "{{ bos_token }}|{{ eos_token }}", "bos_token": {"content": "<|begin|>", "lstrip": false}, "eos_token": null}`, "", "<|begin|>|", nil},
		{"named", `{"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default {{ messages | length }}"}]}`, "", "default 1", nil},
		{"jinja file first", `{"chat_template": "config", "bos_token": "B"}`, "file {{ bos_token }}", "file B", nil},
		{"jinja file alone", ``, "only the file", "only the file", nil},
		{"none", `{"bos_token": "<s>"}`, "", "", ErrNoTemplate},
		{"no config", ``, "", "", ErrNoTemplate},
		{"no default", `{"chat_template": [{"name": "tool_use", "template": "x"}]}`, "", "", nil},
		{"bad template", `{"chat_template": "{% for m in messages %}"}`, "", "", ErrTemplate},
	} {
		dir := t.TempDir()
		if c.config != "" {
			write(dir, "tokenizer_config.json", c.config)
		}
		if c.jinjaFile != "" {
			write(dir, "chat_template.jinja", c.jinjaFile)
		}
		tm, err := Load(dir)
		if c.want == "" {
			if err == nil || (c.err != nil && !errors.Is(err, c.err)) {
				t.Errorf("%s: %v, want %v", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got, err := tm.Render(msgs, true); err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	dir := t.TempDir()
	write(dir, "tokenizer_config.json", `{"eos_token": "<|eot|>"}`)
	file := filepath.Join(dir, "mine.jinja")
	write(file[:len(file)-len("mine.jinja")], "mine.jinja", "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}")
	tm, err := LoadFile(file, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tm.Render(msgs, false); got != "user: hi<|eot|>" || !strings.HasSuffix(tm.Source(), "mine.jinja") {
		t.Errorf("LoadFile: %q from %s", got, tm.Source())
	}
}

// TestRenderVars: further variables reach the template; the ones Render
// sets (Reserved) keep Render's values.
func TestRenderVars(t *testing.T) {
	tm, err := Parse("{{ bos_token }}{% if not enable_thinking %}[no think]{% endif %}{{ messages[0]['content'] }}{% if add_generation_prompt %}>{% endif %}", Tokens{BOS: "<s>"}, "vars")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "hi"}}
	got, err := tm.RenderVars(msgs, true, map[string]any{"enable_thinking": false, "bos_token": "EVIL", "messages": []any{}, "add_generation_prompt": false})
	if err != nil || got != "<s>[no think]hi>" {
		t.Errorf("RenderVars: %q, %v; want %q", got, err, "<s>[no think]hi>")
	}
	got, err = tm.RenderVars(msgs, false, map[string]any{"enable_thinking": true})
	if err != nil || got != "<s>hi" {
		t.Errorf("RenderVars enable_thinking true, no generation prompt: %q, %v", got, err)
	}
}
