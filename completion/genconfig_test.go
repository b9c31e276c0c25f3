package completion

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLoadSampling: generation_config.json's temperature and top_p, greedy
// for do_sample false, its eos_token_id (an id or a list, kept with
// do_sample false), none without the file, refusals outside the API's
// ranges.
func TestLoadSampling(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		name, body string
		temp, top  *float64
		eos        []int
		wantErr    bool
		noFile     bool
	}{
		{name: "no file", noFile: true},
		{name: "values", body: `{"temperature": 0.6, "top_p": 0.9, "bos_token_id": 1}`, temp: f(0.6), top: f(0.9)},
		{name: "do_sample false", body: `{"do_sample": false, "temperature": 0.6}`, temp: f(0)},
		{name: "temperature only", body: `{"temperature": 0.7}`, temp: f(0.7)},
		{name: "temperature too high", body: `{"temperature": 3}`, wantErr: true},
		{name: "top_p too high", body: `{"top_p": 1.5}`, wantErr: true},
		{name: "not JSON", body: `{`, wantErr: true},
		{name: "eos id", body: `{"eos_token_id": 2}`, eos: []int{2}},
		{name: "eos list", body: `{"eos_token_id": [128001, 128009], "temperature": 0.6}`, temp: f(0.6), eos: []int{128001, 128009}},
		{name: "eos with do_sample false", body: `{"do_sample": false, "eos_token_id": [7]}`, temp: f(0), eos: []int{7}},
		{name: "eos null", body: `{"eos_token_id": null}`},
		{name: "eos string", body: `{"eos_token_id": "</s>"}`, wantErr: true},
		{name: "eos negative", body: `{"eos_token_id": [-1]}`, wantErr: true},
	} {
		dir := t.TempDir()
		if !c.noFile {
			if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(c.body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := LoadSampling(dir)
		if (err != nil) != c.wantErr {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		eq := func(a, b *float64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
		if !eq(got.Temperature, c.temp) || !eq(got.TopP, c.top) || !slices.Equal(got.EOS, c.eos) {
			t.Errorf("%s: %+v", c.name, got)
		}
	}
}

// TestSamplingDefaults: a request without temperature or top_p takes the
// checkpoint's; one that gives them keeps its own.
func TestSamplingDefaults(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	zero, top := 0.0, 0.8
	cfg.Sampling = Sampling{Temperature: &zero, TopP: &top}
	s, _ := startServer(t, m, tok, cfg)
	p, err := s.resolve(&CompletionRequest{Model: "tiny", Prompt: &Prompt{Text: "x"}})
	if err != nil || p.temperature != 0 || p.topP != 0.8 {
		t.Errorf("defaults: temperature %v top_p %v (%v), want 0 and 0.8", p.temperature, p.topP, err)
	}
	one, half := 1.0, 0.5
	p, err = s.resolve(&CompletionRequest{Model: "tiny", Prompt: &Prompt{Text: "x"}, Temperature: &one, TopP: &half})
	if err != nil || p.temperature != 1 || p.topP != 0.5 {
		t.Errorf("the request's own: temperature %v top_p %v (%v), want 1 and 0.5", p.temperature, p.topP, err)
	}
}

// TestGenerationConfigEOS: an end token that only generation_config.json
// lists (as Llama 3 Instruct lists <|eot_id|>) ends a served completion
// as config.json's EOS does: a greedy completion of a checkpoint whose
// generation_config.json names its own i-th token (one not generated
// before) stops there, finish_reason stop, with the text of the tokens
// before it; the same checkpoint without the file runs to max_tokens.
// An id outside the vocabulary stops Load, naming the file.
func TestGenerationConfigEOS(t *testing.T) {
	dir := writeTinyModel(t, "tiny", 4096)
	body := `{"model": "tiny", "prompt": "Where does the turn end?", "max_tokens": 12, "temperature": 0}`
	plainSrv, err := Load(dir, testConfig("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	plainTS := httptestServer(t, plainSrv)
	plain := completeBody(t, plainTS, body)
	out := record(t, plainTS, plain.ID).OutputTokens
	if len(out) != 12 || *plain.Choices[0].FinishReason != "length" {
		t.Fatalf("greedy completion: %d tokens, finish %s; want 12, length (a tiny random model: pick another prompt)", len(out), *plain.Choices[0].FinishReason)
	}
	at := -1
	for i := 1; i < len(out) && at < 0; i++ {
		if !slices.Contains(out[:i], out[i]) {
			at = i
		}
	}
	if at < 0 {
		t.Fatalf("greedy tokens %v repeat one token", out)
	}
	want := completeBody(t, plainTS, strings.Replace(body, `"max_tokens": 12`, fmt.Sprintf(`"max_tokens": %d`, at), 1)).Choices[0].Text
	write := func(ids string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": `+ids+`}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("[257, %d]", out[at]))
	s, err := Load(dir, testConfig("tiny"))
	if err != nil {
		t.Fatal(err)
	}
	got := completeBody(t, httptestServer(t, s), body)
	if ch := got.Choices[0]; ch.Text != want || *ch.FinishReason != "stop" || got.Usage.CompletionTokens != at+1 {
		t.Errorf("with generation_config.json's eos_token_id [257, %d] (token %d of %v): %q (%s, %d tokens); want %q, stop, %d",
			out[at], at, out, ch.Text, *ch.FinishReason, got.Usage.CompletionTokens, want, at+1)
	}
	write("[260]")
	if s, err := Load(dir, testConfig("tiny")); err == nil || !strings.Contains(err.Error(), "generation_config.json") {
		if s != nil {
			s.Close()
		}
		t.Errorf("eos_token_id 260 of a vocabulary of 260: %v, want an error naming generation_config.json", err)
	}
}

// completeBody posts a completion body that must succeed.
func completeBody(t *testing.T, url, body string) Completion {
	t.Helper()
	var req map[string]any
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	return complete(t, url, req)
}
