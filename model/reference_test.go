package model

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/questrt/questrt/internal/testmodels"
)

// modelsDir finds the shared test checkpoints (testmodels.Dir), or skips.
func modelsDir(t testing.TB) string {
	t.Helper()
	return testmodels.Dir(t)
}

// refFile is a checkpoint's reference.json.
type refFile struct {
	Prompt    string               `json:"prompt"`
	InputIDs  []int                `json:"input_ids"`
	Positions []int                `json:"positions"`
	Logits    map[string][]float32 `json:"logits"`
	Greedy    []int                `json:"greedy_continuation_ids"`
	GreedyTxt string               `json:"greedy_continuation_text"`
}

var (
	loadMu sync.Mutex
	loaded = map[string]*Model{}
)

// testModel loads (once per test binary) one of the shared checkpoints.
func testModel(t testing.TB, name string) (*Model, *refFile) {
	t.Helper()
	dir := filepath.Join(modelsDir(t), name)
	loadMu.Lock()
	defer loadMu.Unlock()
	m, ok := loaded[name]
	if !ok {
		var err error
		if m, err = Load(dir, LoadOptions{}); err != nil {
			t.Fatal(err)
		}
		loaded[name] = m
	}
	b, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref refFile
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return m, &ref
}

// logitErr returns the max absolute error and the max error relative to
// the reference's largest magnitude.
func logitErr(got, want []float32) (abs, rel float64) {
	var scale float64
	for i, w := range want {
		abs = max(abs, math.Abs(float64(got[i])-float64(w)))
		scale = max(scale, math.Abs(float64(w)))
	}
	return abs, abs / scale
}

// TestReferenceLogits: the prompt's logits at the reference positions
// match transformers' float32 logits within 1e-4 (the issue asks 1e-3;
// measured 3e-5), with the float64
// reference attention and with the tiled float32 kernel.
func TestReferenceLogits(t *testing.T) {
	modelsDir(t) // skip the whole test, not only its subtests, without checkpoints
	for _, name := range []string{"passkey-llama-v1", "passkey-llama-v2"} {
		t.Run(name, func(t *testing.T) {
			m, ref := testModel(t, name)
			vocab := m.Config.VocabSize
			tok, err := NewByteTokenizer(m.Config)
			if err != nil {
				t.Fatal(err)
			}
			ids := append([]int{tok.BOS()}, tok.Encode(ref.Prompt)...)
			if len(ids) != len(ref.InputIDs) {
				t.Fatalf("tokenizer gives %d ids, reference %d", len(ids), len(ref.InputIDs))
			}
			for i := range ids {
				if ids[i] != ref.InputIDs[i] {
					t.Fatalf("id %d: %d, reference %d", i, ids[i], ref.InputIDs[i])
				}
			}
			for _, impl := range []struct {
				name string
				attn Attention
			}{
				{"reference", NewReference(m.Geometry())},
				{"dense", NewDense(m.Geometry(), 0)},
			} {
				logits, err := m.Forward(context.Background(), impl.attn, ids, ForwardOptions{AllLogits: true})
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for _, p := range ref.Positions {
					want := ref.Logits[strconv.Itoa(p)]
					got := logits[p*vocab : (p+1)*vocab]
					abs, rel := logitErr(got, want)
					worst = max(worst, abs)
					if abs > 1e-4 {
						t.Errorf("%s position %d: max abs error %.3g (rel %.3g) > 1e-4", impl.name, p, abs, rel)
					}
					if Argmax(got) != Argmax(want) {
						t.Errorf("%s position %d: argmax %d, reference %d", impl.name, p, Argmax(got), Argmax(want))
					}
				}
				t.Logf("%s attention: max abs logit error over positions %v: %.3g", impl.name, ref.Positions, worst)
			}
		})
	}
}
