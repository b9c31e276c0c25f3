package completion

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/testmodels"

	"github.com/questrt/questrt/model"
)

// writeTinyModel writes a small random Llama with the byte vocabulary
// (F32 safetensors) into a new directory named name. Its LM head rows
// come in opposite pairs for the byte ids and are zero for BOS, EOS and
// the padding ids, so a greedy decode never ends on EOS: some byte's
// logit is always at least 0.
func writeTinyModel(t testing.TB, name string, maxPos int) string {
	t.Helper()
	return writeTinyModelVocab(t, name, maxPos, 260, 256, 257)
}

// writeTinyModelVocab is writeTinyModel with a vocabulary of vocab ids
// (at least 258) and the given BOS and EOS ids in config.json.
func writeTinyModelVocab(t testing.TB, name string, maxPos, vocab, bos, eos int) string {
	t.Helper()
	const hidden, inter, layers, heads, kvHeads, headDim = 32, 48, 2, 4, 2, 8
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
		"num_attention_heads": heads, "num_key_value_heads": kvHeads, "head_dim": headDim,
		"max_position_embeddings": maxPos, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
		"hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": bos, "eos_token_id": eos,
	}
	j, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), j, 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(42, 7))
	type tensor struct {
		name  string
		shape []int
		data  []float32
	}
	mk := func(name string, scale float64, shape ...int) tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * scale)
		}
		return tensor{name, shape, x}
	}
	norm := func(name string) tensor {
		x := make([]float32, hidden)
		for i := range x {
			x[i] = 1 + float32(rng.NormFloat64()*0.1)
		}
		return tensor{name, []int{hidden}, x}
	}
	head := mk("lm_head.weight", 0.5, vocab, hidden)
	for id := range vocab {
		row := head.data[id*hidden : (id+1)*hidden]
		switch {
		case id >= 256:
			clear(row)
		case id%2 == 1:
			for i := range row {
				row[i] = -head.data[(id-1)*hidden+i]
			}
		}
	}
	ts := []tensor{head, mk("model.embed_tokens.weight", 1, vocab, hidden)}
	q, kv := heads*headDim, kvHeads*headDim
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts, norm(p+"input_layernorm.weight"), norm(p+"post_attention_layernorm.weight"),
			mk(p+"self_attn.q_proj.weight", 0.3, q, hidden), mk(p+"self_attn.k_proj.weight", 0.3, kv, hidden),
			mk(p+"self_attn.v_proj.weight", 0.3, kv, hidden), mk(p+"self_attn.o_proj.weight", 0.2, hidden, q),
			mk(p+"mlp.gate_proj.weight", 0.2, inter, hidden), mk(p+"mlp.up_proj.weight", 0.2, inter, hidden),
			mk(p+"mlp.down_proj.weight", 0.2, hidden, inter))
	}
	ts = append(ts, norm("model.norm.weight"))
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var data []byte
	for _, x := range ts {
		off := len(data)
		for _, v := range x.data {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
		}
		hdr[x.name] = map[string]any{"dtype": "F32", "shape": x.shape, "data_offsets": []int{off, len(data)}}
	}
	hj, _ := json.Marshal(hdr)
	for len(hj)%8 != 0 {
		hj = append(hj, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hj)))
	b = append(append(b, hj...), data...)
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loadModel loads the checkpoint in dir and its tokenizer.
func loadModel(t testing.TB, dir string) (*model.Model, model.Tokenizer) {
	t.Helper()
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	tok, err := model.LoadTokenizer(dir, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	return m, tok
}

// tinyModel is a tiny random model of 4096 positions.
func tinyModel(t testing.TB) (*model.Model, model.Tokenizer) {
	return loadModel(t, writeTinyModel(t, "tiny", 4096))
}

// modelsDir finds the shared test checkpoints (testmodels.Dir), or skips.
func modelsDir(t testing.TB) string {
	t.Helper()
	return testmodels.Dir(t)
}

var (
	passkeyOnce sync.Once
	passkeyM    *model.Model
	passkeyTok  model.Tokenizer
	passkeyErr  error
)

// passkeyModel loads passkey-llama-v1 once per test binary (skipping
// without the checkpoints); it returns its directory too.
func passkeyModel(t testing.TB) (*model.Model, model.Tokenizer, string) {
	t.Helper()
	dir := filepath.Join(modelsDir(t), "passkey-llama-v1")
	passkeyOnce.Do(func() {
		if passkeyM, passkeyErr = model.Load(dir, model.LoadOptions{}); passkeyErr == nil {
			passkeyTok, passkeyErr = model.LoadTokenizer(dir, passkeyM.Config)
		}
	})
	if passkeyErr != nil {
		t.Fatal(passkeyErr)
	}
	return passkeyM, passkeyTok, dir
}

// testConfig is a small serving config for tests.
func testConfig(name string) Config {
	c := DefaultConfig()
	c.ModelName = name
	c.Engines = TestEngines
	c.CapacityPages = 512
	c.MemoryLimit = -1
	c.RetryAfter = 2 * time.Second
	// The token bounds alone, so that a test's chunks do not depend on
	// the machine's speed (itl_test.go sets the latency budget).
	c.MaxITLFactor = 0
	return c
}

// startServer starts a Server and an httptest server over it, both closed
// at the test's end.
func startServer(t testing.TB, m *model.Model, tok model.Tokenizer, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	return startServerHooks(t, m, tok, cfg, hooks{})
}

// startServerHooks is startServer with the scheduler's test hooks h.
func startServerHooks(t testing.TB, m *model.Model, tok model.Tokenizer, cfg Config, h hooks) (*Server, *httptest.Server) {
	t.Helper()
	s, err := newServer(m, tok, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return s, ts
}

// post sends body to url and returns the status, the headers and the
// body.
func post(t testing.TB, url, body string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// complete posts a request that must succeed and decodes the answer.
func complete(t testing.TB, url string, req map[string]any) Completion {
	t.Helper()
	b, _ := json.Marshal(req)
	status, _, body := post(t, url+"/v1/completions", string(b))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	var c Completion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("answer (status %d) %q: %v", status, body, err)
	}
	return c
}

// sseEvents splits a stream into its data payloads.
func sseEvents(t testing.TB, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, d)
		} else if line != "" && line != ": keep-alive" {
			t.Errorf("stream line %q is neither data, a keep-alive comment nor blank", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// streamText joins a stream's chunks' text and returns the finish
// reason, checking the chunk shape and the final [DONE].
func streamText(t testing.TB, events []string) (text, finish string, usage *Usage) {
	t.Helper()
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", events)
	}
	var b strings.Builder
	for _, e := range events[:len(events)-1] {
		var c Completion
		dec := json.NewDecoder(bytes.NewReader([]byte(e)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("chunk %s: %v", e, err)
		}
		if c.Object != "text_completion" || c.ID == "" {
			t.Fatalf("chunk %s: object %q id %q", e, c.Object, c.ID)
		}
		if c.Usage != nil {
			usage = c.Usage
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("chunk %s: %d choices", e, len(c.Choices))
		}
		b.WriteString(c.Choices[0].Text)
		if f := c.Choices[0].FinishReason; f != nil {
			if finish != "" {
				t.Fatalf("two finish reasons in %q", events)
			}
			finish = *f
		}
	}
	return b.String(), finish, usage
}

// uncached is u without its cached prompt tokens: the usage of a
// request compared with that of one the prefix cache served differently.
func uncached(u Usage) Usage {
	u.PromptTokensDetails = PromptTokensDetails{}
	return u
}
