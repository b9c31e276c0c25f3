package completion

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/model"
)

// TestLoadTokenizerModelCheckpoint: a checkpoint directory whose only
// tokenizer is SentencePiece's tokenizer.model serves (as questd
// --model does): /tokenize gives BOS and then SentencePiece's own ids
// (model/testdata/spm/llama/cases.json, made by the C++ library) and a
// completion answers. A corrupt tokenizer.model refuses to load with one
// error naming it.
func TestLoadTokenizerModelCheckpoint(t *testing.T) {
	dir := writeTinyModelVocab(t, "spm", 512, 1024, 1, 2)
	b, err := os.ReadFile("../model/testdata/spm/llama/tokenizer.model")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.model"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cj, err := os.ReadFile("../model/testdata/spm/llama/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	}
	if err := json.Unmarshal(cj, &cases); err != nil {
		t.Fatal(err)
	}
	c := cases[5] // "The quick brown fox jumps over the lazy dog."
	cfg := testConfig("")
	s, err := Load(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); s.Close() })
	body, _ := json.Marshal(map[string]any{"model": "spm", "prompt": c.Text})
	status, _, resp := post(t, ts.URL+"/tokenize", string(body))
	var tr TokenizeResponse
	if err := json.Unmarshal(resp, &tr); err != nil || status != http.StatusOK {
		t.Fatalf("tokenize: %d %s", status, resp)
	}
	if want := append([]int{1}, c.IDs...); !slices.Equal(tr.Tokens, want) {
		t.Errorf("/tokenize %q: %v, want BOS then SentencePiece's ids %v", c.Text, tr.Tokens, want)
	}
	comp := complete(t, ts.URL, map[string]any{"model": "spm", "prompt": c.Text, "max_tokens": 3, "temperature": 0})
	if comp.Usage.PromptTokens != len(c.IDs)+1 || comp.Usage.CompletionTokens == 0 {
		t.Errorf("completion usage %+v, want %d prompt tokens", *comp.Usage, len(c.IDs)+1)
	}

	if err := os.WriteFile(filepath.Join(dir, "tokenizer.model"), b[:len(b)/3], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(dir, cfg)
	if !errors.Is(err, model.ErrTokenizer) || strings.Count(err.Error(), "tokenizer.model") != 1 {
		t.Errorf("corrupt tokenizer.model: %v, want one model.ErrTokenizer naming it", err)
	}
}
