// Package chat renders conversations into prompts with the chat template
// of a Hugging Face checkpoint: the Jinja source in tokenizer_config.json
// ("chat_template", a string or a list of named templates, "default"
// taken) or in chat_template.jinja beside it, or a file an operator
// names. Rendering follows transformers' apply_chat_template: the
// template sees messages (role and content of each), add_generation_prompt,
// bos_token and eos_token (the checkpoint's special tokens as text) and
// the functions raise_exception and strftime_now; the rendered text is
// tokenized without adding BOS (the template writes it where the model
// wants it).
//
// The Jinja engine is github.com/ardanlabs/jinja (pure Go, no
// dependencies, written for LLM chat templates); TestRenderMatchesReference
// checks it against Hugging Face's own JavaScript implementation
// (@huggingface/jinja) on templates of several model families.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Errors callers act on.
var (
	// ErrNoTemplate: the checkpoint ships no chat template.
	ErrNoTemplate = errors.New("chat: the model has no chat template")
	// ErrTemplate: a template that does not compile.
	ErrTemplate = errors.New("chat: bad chat template")
	// ErrRender: the template refused the conversation (its
	// raise_exception, say "roles must alternate") or failed on it; the
	// message says why.
	ErrRender = errors.New("chat: the chat template failed on the messages")
)

// Message is one turn of a conversation.
type Message struct {
	Role    string
	Content string
}

// Tokens are the special tokens a template may write, as text (empty when
// the checkpoint names none).
type Tokens struct {
	BOS, EOS string
}

// Template is a compiled chat template; safe for concurrent use.
type Template struct {
	t      *jinja.Template
	tokens Tokens
	source string // where it came from, for messages
}

// Parse compiles a template's source; source names it in errors (a file,
// "tokenizer_config.json").
func Parse(src string, tokens Tokens, source string) (*Template, error) {
	if strings.TrimSpace(src) == "" {
		return nil, fmt.Errorf("%w: %s is empty", ErrTemplate, source)
	}
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTemplate, source, err)
	}
	return &Template{t: t, tokens: tokens, source: source}, nil
}

// Tokens returns the special tokens the template is rendered with.
func (t *Template) Tokens() Tokens { return t.tokens }

// Source says where the template came from.
func (t *Template) Source() string { return t.source }

// Render renders msgs; addGenerationPrompt asks the template to open the
// assistant's turn. A template's refusal or failure wraps ErrRender.
func (t *Template) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.RenderVars(msgs, addGenerationPrompt, nil)
}

// Reserved are the template variables Render sets, which vars may not
// set.
var Reserved = []string{"messages", "add_generation_prompt", "bos_token", "eos_token"}

// RenderVars is Render with further template variables (vLLM's and
// transformers' chat_template_kwargs, such as Qwen 3's enable_thinking):
// JSON values (nil, bool, float64, string, []any, map[string]any); none
// of them Reserved.
func (t *Template) RenderVars(msgs []Message, addGenerationPrompt bool, vars map[string]any) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	ctx := make(map[string]any, len(vars)+4)
	for k, v := range vars {
		ctx[k] = v
	}
	ctx["messages"] = list
	ctx["add_generation_prompt"] = addGenerationPrompt
	ctx["bos_token"] = t.tokens.BOS
	ctx["eos_token"] = t.tokens.EOS
	out, err := t.t.Render(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrRender, err)
	}
	return out, nil
}

// maxConfigBytes bounds tokenizer_config.json and template files read
// (real ones are tens of KiB; a vocabulary-carrying config a few MiB).
const maxConfigBytes = 64 << 20

// Load returns the chat template of the checkpoint in dir: its
// chat_template.jinja, else tokenizer_config.json's chat_template, with
// the config's bos_token and eos_token. ErrNoTemplate when it has none.
func Load(dir string) (*Template, error) {
	tokens, tmpl, err := readConfig(dir)
	if err != nil {
		return nil, err
	}
	if b, err := readLimited(filepath.Join(dir, "chat_template.jinja")); err == nil {
		return Parse(string(b), tokens, "chat_template.jinja")
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if tmpl == "" {
		return nil, fmt.Errorf("%w (no chat_template in %s)", ErrNoTemplate, filepath.Join(dir, "tokenizer_config.json"))
	}
	return Parse(tmpl, tokens, "tokenizer_config.json")
}

// LoadFile returns the template in file with the special tokens of the
// checkpoint in dir (none when dir is "" or has no tokenizer_config.json).
func LoadFile(file, dir string) (*Template, error) {
	b, err := readLimited(file)
	if err != nil {
		return nil, err
	}
	var tokens Tokens
	if dir != "" {
		if tokens, _, err = readConfig(dir); err != nil {
			return nil, err
		}
	}
	return Parse(string(b), tokens, file)
}

// readConfig reads dir's tokenizer_config.json (absent: no tokens and no
// template).
func readConfig(dir string) (Tokens, string, error) {
	path := filepath.Join(dir, "tokenizer_config.json")
	b, err := readLimited(path)
	if errors.Is(err, os.ErrNotExist) {
		return Tokens{}, "", nil
	}
	if err != nil {
		return Tokens{}, "", err
	}
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return Tokens{}, "", fmt.Errorf("chat: %s: %w", path, err)
	}
	var tokens Tokens
	if tokens.BOS, err = tokenText(cfg.BOS); err != nil {
		return Tokens{}, "", fmt.Errorf("chat: %s: bos_token: %w", path, err)
	}
	if tokens.EOS, err = tokenText(cfg.EOS); err != nil {
		return Tokens{}, "", fmt.Errorf("chat: %s: eos_token: %w", path, err)
	}
	tmpl, err := templateText(cfg.ChatTemplate)
	if err != nil {
		return Tokens{}, "", fmt.Errorf("chat: %s: chat_template: %w", path, err)
	}
	return tokens, tmpl, nil
}

// tokenText reads a special token: a string, an AddedToken object
// ({"content": ...}), or null.
func tokenText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", fmt.Errorf("want a string or an object with content, got %.40s", raw)
	}
	return *obj.Content, nil
}

// templateText reads chat_template: a string, or a list of {name,
// template} whose "default" is taken.
func templateText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("want a string or a list of named templates, got %.40s", raw)
	}
	var names []string
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
		names = append(names, n.Name)
	}
	return "", fmt.Errorf("no template named default among %v", names)
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("chat: %s: %w", path, err)
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("chat: %s: more than the %d bytes read", path, maxConfigBytes)
	}
	return b, nil
}
