package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// stTensor is a tensor to write into a test safetensors file.
type stTensor struct {
	name  string
	dtype DType
	shape []int
	data  []byte
}

// writeSafetensors writes tensors in order to path.
func writeSafetensors(t testing.TB, path string, ts []stTensor) {
	t.Helper()
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var off int
	var data []byte
	for _, x := range ts {
		hdr[x.name] = map[string]any{"dtype": x.dtype, "shape": x.shape, "data_offsets": []int{off, off + len(x.data)}}
		off += len(x.data)
		data = append(data, x.data...)
	}
	j, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(j)%8 != 0 {
		j = append(j, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(j)))
	b = append(append(b, j...), data...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// encode stores float values as dtype (values must be exact in it).
func encode(dtype DType, v []float32) []byte {
	var b []byte
	for _, x := range v {
		switch dtype {
		case F32:
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		case BF16:
			b = binary.LittleEndian.AppendUint16(b, uint16(math.Float32bits(x)>>16))
		case F16:
			b = binary.LittleEndian.AppendUint16(b, float32ToFloat16(x))
		}
	}
	return b
}

// float32ToFloat16 converts normal values exactly representable in half
// precision (test data only).
func float32ToFloat16(x float32) uint16 {
	bits := math.Float32bits(x)
	sign := uint16(bits>>16) & 0x8000
	if x == 0 {
		return sign
	}
	exp := int(bits>>23&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16(bits>>13&0x3ff)
}

// tinyConfig is a small Llama with the byte vocabulary.
func tinyConfig() map[string]any {
	return map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": 260, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
		"max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
		"hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 256, "eos_token_id": 257,
		"attention_bias": false, "mlp_bias": false,
	}
}

// tinyTensors returns random weights for cfg that every dtype stores
// exactly.
func tinyTensors(cfg map[string]any, dtype DType, seed uint64) []stTensor {
	rng := rand.New(rand.NewPCG(seed, 1))
	geti := func(k string) int { return cfg[k].(int) }
	v, h, in := geti("vocab_size"), geti("hidden_size"), geti("intermediate_size")
	q, kv := geti("num_attention_heads")*geti("head_dim"), geti("num_key_value_heads")*geti("head_dim")
	mk := func(name string, scale float32, shape ...int) stTensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		x := make([]float32, n)
		for i := range x {
			// Multiples of 1/128 in [-2, 2): 8 significant bits, exact
			// in bf16 and f16.
			x[i] = float32(math.Round(rng.NormFloat64()*float64(scale)*128)) / 128
			x[i] = min(max(x[i], -2), 255.0/128)
		}
		return stTensor{name, dtype, shape, encode(dtype, x)}
	}
	norm := func(name string) stTensor {
		x := make([]float32, h)
		for i := range x {
			x[i] = 1 + float32(rng.IntN(32)-16)/64
		}
		return stTensor{name, dtype, []int{h}, encode(dtype, x)}
	}
	ts := []stTensor{mk("lm_head.weight", 0.3, v, h), mk("model.embed_tokens.weight", 1, v, h)}
	for l := range geti("num_hidden_layers") {
		p := fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts, norm(p+"input_layernorm.weight"), norm(p+"post_attention_layernorm.weight"),
			mk(p+"self_attn.q_proj.weight", 0.4, q, h), mk(p+"self_attn.k_proj.weight", 0.4, kv, h),
			mk(p+"self_attn.v_proj.weight", 0.3, kv, h), mk(p+"self_attn.o_proj.weight", 0.2, h, q),
			mk(p+"mlp.gate_proj.weight", 0.3, in, h), mk(p+"mlp.up_proj.weight", 0.3, in, h),
			mk(p+"mlp.down_proj.weight", 0.2, h, in))
	}
	return append(ts, norm("model.norm.weight"))
}

// writeTiny writes a tiny checkpoint into a new directory: one file, or
// shards files with an index.
func writeTiny(t testing.TB, cfg map[string]any, ts []stTensor, shards int) string {
	t.Helper()
	dir := t.TempDir()
	j, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), j, 0o644); err != nil {
		t.Fatal(err)
	}
	if shards <= 1 {
		writeSafetensors(t, filepath.Join(dir, "model.safetensors"), ts)
		return dir
	}
	wm := map[string]string{}
	per := (len(ts) + shards - 1) / shards
	for s := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, shards)
		part := ts[s*per : min((s+1)*per, len(ts))]
		for _, x := range part {
			wm[x.name] = name
		}
		writeSafetensors(t, filepath.Join(dir, name), part)
	}
	idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": wm})
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loadTiny writes and loads a tiny model.
func loadTiny(t testing.TB, dtype DType, shards int) *Model {
	t.Helper()
	cfg := tinyConfig()
	m, err := Load(writeTiny(t, cfg, tinyTensors(cfg, dtype, 7), shards), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func without(ts []stTensor, name string) []stTensor {
	return slices.DeleteFunc(slices.Clone(ts), func(x stTensor) bool { return x.name == name })
}
