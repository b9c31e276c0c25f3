package completion

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// defaultOpenAIVersion is the openai npm package the client test runs
// ($QUESTRT_OPENAI_VERSION overrides it): the newest release whose
// package.json supports the Node 20 of the development machines (7.x
// asks for Node 22).
const defaultOpenAIVersion = "6.49.0"

// openaiVersion is the version to run.
func openaiVersion() string {
	if v := os.Getenv("QUESTRT_OPENAI_VERSION"); v != "" {
		return v
	}
	return defaultOpenAIVersion
}

// openaiDir returns a directory whose node_modules holds openai at
// openaiVersion(): $QUESTRT_OPENAI_NODE, or a scratch directory under the
// system's temporary directory, installed there with npm when
// QUESTRT_NPM=1 (and reused by later runs). It skips the test, saying
// why, when node or the package is missing.
func openaiDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed")
	}
	version := openaiVersion()
	dir := os.Getenv("QUESTRT_OPENAI_NODE")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "questrt-openai-node-"+version)
	}
	have := func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "node_modules", "openai", "package.json"))
		var pkg struct{ Version string }
		return err == nil && json.Unmarshal(b, &pkg) == nil && pkg.Version == version
	}
	if have() {
		return dir
	}
	if os.Getenv("QUESTRT_NPM") != "1" {
		t.Skipf("openai@%s is not installed in %s (set QUESTRT_NPM=1 to install it with npm, or QUESTRT_OPENAI_NODE to a directory holding it)", version, dir)
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("QUESTRT_NPM=1 but npm is not installed")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "install", "--prefix", dir, "--no-audit", "--no-fund", "--no-save", "openai@"+version)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install openai@%s: %v\n%s", version, err, out)
	}
	if !have() {
		t.Fatalf("npm installed no openai@%s in %s", version, dir)
	}
	return dir
}

// passkeyPrompt is passkey-llama-v1's reference prompt and its greedy
// continuation (the pass key).
func passkeyPrompt(t *testing.T, dir string) (prompt, key string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Prompt string `json:"prompt"`
		Greedy string `json:"greedy_continuation_text"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return ref.Prompt, ref.Greedy
}

// TestOpenAINodeClient: the official openai npm client completes the
// passkey prompt against the handler and streams it, gets the pass key
// both ways, gets n = 2 seeded choices equal to their solo requests
// (streamed too) and a greedy chat of n = 2, lists the model, and sees the server's errors as its
// APIError subclasses with status, type, param and code.
func TestOpenAINodeClient(t *testing.T) {
	m, tok, mdir := passkeyModel(t)
	dir := openaiDir(t)
	script, err := os.ReadFile(filepath.Join("testdata", "openai_client.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	// Next to node_modules, so that the import finds the package.
	run := filepath.Join(dir, "openai_client_"+strings.ReplaceAll(t.Name(), "/", "_")+".mjs")
	if err := os.WriteFile(run, script, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(run)
	name := filepath.Base(mdir)
	cfg := testConfig(name)
	cfg.ChatTemplate = passThrough(t)
	s, ts := startServer(t, m, tok, cfg)
	prompt, key := passkeyPrompt(t, mdir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", run)
	// The greedy answer (the key) stopped at its first token not seen
	// before in it, past the first: the answer's text up to there.
	keyIDs := tok.Encode(key)
	stopAt := -1
	for i := 1; i < len(keyIDs) && stopAt < 0; i++ {
		if !slices.Contains(keyIDs[:i], keyIDs[i]) {
			stopAt = i
		}
	}
	if stopAt < 0 || len(keyIDs) != len(key) {
		t.Fatalf("the key %q (tokens %v) has no token to stop at, or not a token a byte", key, keyIDs)
	}
	const truncate = 40
	cmd.Env = append(os.Environ(), "QUESTRT_BASE_URL="+ts.URL+"/v1", "QUESTRT_MODEL="+name, "QUESTRT_PROMPT="+prompt,
		fmt.Sprintf("QUESTRT_STOP_TOKEN=%d", keyIDs[stopAt]), fmt.Sprintf("QUESTRT_TRUNCATE=%d", truncate))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var got struct {
		Version, Object, Text, Finish, Streamed, StreamFinish string
		Chunks                                                int
		Usage, StreamUsage                                    Usage
		ChatObject, ChatRole, ChatText, ChatFinish            string
		ChatStreamed, ChatStreamRole, ChatStreamFinish        string
		ChatChunks                                            int
		ChatUsage, ChatStreamUsage                            Usage
		ChatLogprobs                                          int
		ChatTopLogprobs                                       []int
		ChatLogprobTokens                                     string
		TwoIndexes                                            []int
		TwoTexts, SoloTexts, TwoStreamed, ChatTwoTexts        []string
		TwoUsage                                              Usage
		Models                                                []string
		ExtraText, ExtraIgnored, EchoText                     string
		ExtraTokens                                           []string
		ExtraLogprobs                                         []float64
		ExtraTop                                              []map[string]float64
		StopText, StopFinish, StopIgnored                     string
		TruncatedPromptTokens                                 int
		UnknownModel, BadMaxTokens, BadTemperature            *struct {
			Status                  int
			Type, Param, Code, Name string
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node printed %s: %v", out, err)
	}
	t.Logf("openai@%s: text %q, streamed %q in %d chunks, usage %+v; n = 2: %q", got.Version, got.Text, got.Streamed, got.Chunks, got.Usage, got.TwoTexts)
	if got.Version != openaiVersion() {
		t.Errorf("ran openai@%s, want %s", got.Version, openaiVersion())
	}
	if got.Object != "text_completion" || got.Text != key || got.Finish != "length" {
		t.Errorf("completion %q (%s, %s), want the pass key %q", got.Text, got.Object, got.Finish, key)
	}
	if got.Streamed != key || got.StreamFinish != "length" || got.Chunks < 3 {
		t.Errorf("stream %q (%s) in %d chunks, want the pass key %q", got.Streamed, got.StreamFinish, got.Chunks, key)
	}
	if uncached(got.Usage) != uncached(got.StreamUsage) || got.Usage.CompletionTokens != 5 || got.Usage.PagesTotal == 0 {
		t.Errorf("usage %+v, stream usage %+v", got.Usage, got.StreamUsage)
	}
	if got.ChatObject != "chat.completion" || got.ChatRole != "assistant" || got.ChatText != key || got.ChatFinish != "length" || uncached(got.ChatUsage) != uncached(got.Usage) {
		t.Errorf("chat: %s %s %q (%s), usage %+v; want the pass key %q and the completion's usage", got.ChatObject, got.ChatRole, got.ChatText, got.ChatFinish, got.ChatUsage, key)
	}
	if got.ChatLogprobs != 5 || !slices.Equal(got.ChatTopLogprobs, []int{2, 2, 2, 2, 2}) || got.ChatLogprobTokens != key {
		t.Errorf("chat logprobs: %d tokens %q, top %v; want 5 making %q, 2 alternatives each", got.ChatLogprobs, got.ChatLogprobTokens, got.ChatTopLogprobs, key)
	}
	if got.ChatStreamed != key || got.ChatStreamRole != "assistant" || got.ChatStreamFinish != "length" || got.ChatChunks < 3 || uncached(got.ChatStreamUsage) != uncached(got.Usage) {
		t.Errorf("chat stream %q (%s, role %q) in %d chunks, usage %+v; want the pass key %q", got.ChatStreamed, got.ChatStreamFinish, got.ChatStreamRole, got.ChatChunks, got.ChatStreamUsage, key)
	}
	if !slices.Equal(got.TwoIndexes, []int{0, 1}) || !slices.Equal(got.TwoTexts, got.SoloTexts) || !slices.Equal(got.TwoStreamed, got.SoloTexts) ||
		got.TwoUsage.PromptTokens != 16 || got.TwoUsage.CompletionTokens != 10 {
		t.Errorf("n = 2: indexes %v texts %q streamed %q usage %+v; want [0 1] and the solo texts %q of seeds 11 and 12, the prompt once",
			got.TwoIndexes, got.TwoTexts, got.TwoStreamed, got.TwoUsage, got.SoloTexts)
	}
	if !slices.Equal(got.ChatTwoTexts, []string{key, key}) {
		t.Errorf("chat n = 2 greedy: %q, want the pass key twice", got.ChatTwoTexts)
	}
	if len(got.Models) != 1 || got.Models[0] != name {
		t.Errorf("models %v, want [%s]", got.Models, name)
	}
	if e := got.UnknownModel; e == nil || e.Status != 404 || e.Code != "model_not_found" || e.Param != "model" || e.Name != "NotFoundError" {
		t.Errorf("unknown model: %+v", e)
	}
	if e := got.BadMaxTokens; e == nil || e.Status != 400 || e.Param != "max_tokens" || e.Type != typeInvalid || e.Name != "BadRequestError" {
		t.Errorf("bad max_tokens: %+v", e)
	}
	if got.ExtraIgnored != "" || len(got.ExtraTokens) != 24 || strings.Join(got.ExtraTokens, "") != got.ExtraText || !strings.HasPrefix(got.ExtraText, key[:1]) {
		t.Errorf("greedy chat with top_k and penalties: %q in tokens %q, ignored %q; want 24 tokens from the pass key's first, nothing ignored", got.ExtraText, got.ExtraTokens, got.ExtraIgnored)
	} else {
		checkPenalizedPicks(t, "the client's chat", got.ExtraTokens, got.ExtraLogprobs, got.ExtraTop, 1.5, 0.5)
	}
	if !strings.HasPrefix(got.EchoText, "Sure: ") || len(got.EchoText) <= len("Sure: ") {
		t.Errorf("chat echo: %q, want \"Sure: \" and the answer", got.EchoText)
	}
	if e := got.BadTemperature; e == nil || e.Status != 400 || e.Param != "temperature" || e.Name != "BadRequestError" {
		t.Errorf("bad temperature beside an unknown field: %+v", e)
	}
	if got.StopText != key[:stopAt] || got.StopFinish != "stop" || got.StopIgnored != "" {
		t.Errorf("chat with stop_token_ids [%d]: %q (%s), ignored %q; want %q, stop, nothing ignored", keyIDs[stopAt], got.StopText, got.StopFinish, got.StopIgnored, key[:stopAt])
	}
	if got.TruncatedPromptTokens != truncate {
		t.Errorf("truncate_prompt_tokens %d: prompt_tokens %d", truncate, got.TruncatedPromptTokens)
	}
	waitStats(t, s, "the client's requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	unchanged(t, s, 13)
}

// TestCurlStream: curl -N streams the passkey completion as server-sent
// events ending with [DONE].
func TestCurlStream(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	m, tok, mdir := passkeyModel(t)
	name := filepath.Base(mdir)
	s, ts := startServer(t, m, tok, testConfig(name))
	prompt, key := passkeyPrompt(t, mdir)
	body, _ := json.Marshal(map[string]any{"model": name, "prompt": prompt, "max_tokens": 5, "temperature": 0, "stream": true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "curl", "-sS", "-N", "--fail-with-body", "-H", "Content-Type: application/json", "--data-binary", "@-", ts.URL+"/v1/completions")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	text, finish, _ := streamText(t, sseEvents(t, bytes.NewReader(out)))
	if text != key || finish != "length" {
		t.Errorf("curl stream: %q (%s), want %q", text, finish, key)
	}
	unchanged(t, s, 1)
}
