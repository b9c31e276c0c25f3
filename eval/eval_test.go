package eval

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/internal/testmodels"

	"github.com/questrt/questrt/model"
)

// modelsDir finds the shared test checkpoints (testmodels.Dir), or skips.
func modelsDir(t testing.TB) string {
	t.Helper()
	return testmodels.Dir(t)
}

// TestPasskeyFormat: a generated prompt with the reference's depth and
// code is byte for byte the prompt the checkpoints' reference.json used.
func TestPasskeyFormat(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(modelsDir(t), "passkey-llama-v1", "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Prompt string `json:"prompt"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	p, err := Passkey(rand.New(rand.NewPCG(1, 1)), len(ref.Prompt), PasskeyOptions{Depths: []float64{4.0 / 9}})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.ReplaceAll(p.Text(), p.Answer, "48213")
	if got != ref.Prompt {
		t.Fatalf("prompt differs from the reference:\n got %q\nwant %q", got, ref.Prompt)
	}
}

func TestPasskeyPrompts(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, length := range []int{200, 2048, 8192} {
		for _, keys := range []int{1, 3} {
			p, err := Passkey(rng, length, PasskeyOptions{Keys: keys})
			if err != nil {
				t.Fatal(err)
			}
			text := p.Text()
			if d := len(text) - length; d < -len(PasskeyFiller) || d > len(PasskeyFiller) {
				t.Errorf("length %d keys %d: %d bytes", length, keys, len(text))
			}
			if len(p.Answer) != 5 || strings.Count(p.Context, p.Answer) < 1 || !strings.HasPrefix(text, PasskeyIntro) {
				t.Errorf("length %d keys %d: answer %q not in the context", length, keys, p.Answer)
			}
			if keys == 1 && p.Question != PasskeyQuestion {
				t.Errorf("question %q", p.Question)
			}
			if keys > 1 && (!strings.Contains(p.Question, "pass key of") || strings.Count(p.Context, "The pass key of") != keys) {
				t.Errorf("multi-key prompt: question %q, context %q", p.Question, p.Context[:200])
			}
		}
	}
	for _, bad := range []PasskeyOptions{{Keys: 11}, {Depths: []float64{1.5}}, {Keys: 2, Depths: []float64{0, 0.5, 1}}} {
		if _, err := Passkey(rng, 1000, bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestReadPrompts(t *testing.T) {
	in := `{"prompt": "Some text. The code is 123. What is the code? The code is ", "answer": "123", "length": 4096}
{"prompt": "x y z", "answer": "7", "question": "y z"}
`
	ps, err := ReadPrompts(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Length != 4096 || ps[0].Question != "What is the code? The code is " || ps[1].Length != 5 || ps[1].Context != "x " {
		t.Fatalf("%+v", ps)
	}
	for _, bad := range []string{`{"prompt": "a"}`, `{`, ``, `{"prompt":"ab","answer":"1","question":"zz"}`} {
		if _, err := ReadPrompts(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestPasskeyAccuracy2K: passkey-llama-v1 answers at least 95% of 40
// single-key 2K prompts with full attention (a real model check), and
// Quest at a budget covering every page matches dense exactly.
func TestPasskeyAccuracy2K(t *testing.T) {
	if testing.Short() {
		t.Skip("40 prefills of 2K tokens")
	}
	if raceEnabled {
		// The accuracy is a property of the numbers, which the run
		// without the detector checks (CI runs both); under -race the
		// 40 prefills took 3 minutes on an idle 2-core machine and 11
		// on a loaded one, for no concurrency of their own (the
		// engine's goroutines are raced by engine's and worker's tests).
		t.Skip("40 prefills of 2K tokens: checked without -race")
	}
	m, err := model.Load(filepath.Join(modelsDir(t), "passkey-llama-v1"), model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := model.NewByteTokenizer(m.Config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Budgets = []int{4096, 128}
	cfg.NewRunner = newEngineRunner
	h, err := NewHarness(m, tok, cfg, 2200)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	agg := NewAggregate(cfg)
	rng := rand.New(rand.NewPCG(12, 12))
	for range 40 {
		p, err := Passkey(rng, 2048, PasskeyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := h.Evaluate(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		full := r.Runs[0]
		if full.Output != r.Dense.Output {
			t.Errorf("full budget answered %q, dense %q", full.Output, r.Dense.Output)
		}
		agg.Add(r)
	}
	recs := agg.Records(2048)
	if len(recs) != 3 || recs[0].Selector != "dense" || recs[1].Budget != 4096 {
		t.Fatalf("records %+v", recs)
	}
	dense, full, sparse := recs[0], recs[1], recs[2]
	t.Logf("dense accuracy %.3f, quest B=4096 %.3f, quest B=128 %.3f (mass recall layer 2: %.3f)", dense.Accuracy, full.Accuracy, sparse.Accuracy, *sparse.TeacherForced.Layers[2].MassRecall)
	if dense.Accuracy < 0.95 {
		t.Errorf("dense accuracy %.3f < 0.95 on 40 prompts at 2K", dense.Accuracy)
	}
	tf := full.TeacherForced
	if *tf.TokenAgreement != 1 || *tf.MaxLogitErr > 1e-3 || tf.PagesFraction != 1 {
		t.Errorf("full budget teacher-forced: agreement %v, max logit error %v, pages %v", *tf.TokenAgreement, *tf.MaxLogitErr, tf.PagesFraction)
	}
	for _, l := range tf.Layers {
		if *l.MassRecall < 1-1e-6 || *l.Recall != 1 || *l.Cosine < 1-1e-6 {
			t.Errorf("full budget layer %d: recall %v mass %v cosine %v", l.Layer, *l.Recall, *l.MassRecall, *l.Cosine)
		}
	}
	sp := sparse.TeacherForced
	if sp.PagesFraction >= 1 || sp.Rho >= 1 || sp.Layers[2].DenseShare != 0 || sp.Layers[0].DenseShare != 1 {
		t.Errorf("budget 128: pages %v, rho %v, layer shares %v %v", sp.PagesFraction, sp.Rho, sp.Layers[0].DenseShare, sp.Layers[2].DenseShare)
	}
}
