package model

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLoadDTypesAndShards: the same weights stored as F32 (one file), BF16
// (one file) and F16 (three shards with an index) load to the same model:
// bit-identical logits. F32 tensors are used in place from the mapping.
func TestLoadDTypesAndShards(t *testing.T) {
	ids := []int{256, 'h', 'e', 'l', 'l', 'o', ' ', 'w'}
	var want []float32
	for _, c := range []struct {
		dtype  DType
		shards int
	}{{F32, 1}, {BF16, 1}, {F16, 3}, {BF16, 2}} {
		m := loadTiny(t, c.dtype, c.shards)
		got, err := m.Forward(context.Background(), NewReference(m.Geometry()), ids, ForwardOptions{AllLogits: true})
		if err != nil {
			t.Fatal(err)
		}
		if want == nil {
			want = got
			_, alias, err := m.ck.Tensor("model.norm.weight", m.Config.HiddenSize)
			if err != nil || !alias {
				t.Errorf("F32 tensor: alias %v, err %v; want it in place", alias, err)
			}
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s in %d shards: logits differ from F32", c.dtype, c.shards)
		}
	}
}

// TestLoadErrors: each broken checkpoint is refused with an error that
// names the problem and matches the package's sentinel.
func TestLoadErrors(t *testing.T) {
	base := tinyConfig()
	ts := tinyTensors(base, BF16, 1)
	with := func(k string, v any) map[string]any {
		c := map[string]any{}
		for k2, v2 := range base {
			c[k2] = v2
		}
		c[k] = v
		return c
	}
	reshaped := slices.Clone(ts)
	for i, x := range reshaped {
		if x.name == "model.layers.0.self_attn.k_proj.weight" {
			// Same bytes, transposed shape: passes the file format, not the model.
			reshaped[i].shape = []int{x.shape[1], x.shape[0]}
		}
	}
	intTensor := slices.Clone(ts)
	for i, x := range intTensor {
		if x.name == "model.norm.weight" {
			intTensor[i] = stTensor{x.name, "I16", x.shape, x.data}
		}
	}
	cases := []struct {
		name   string
		cfg    map[string]any
		ts     []stTensor
		shards int
		edit   func(t *testing.T, dir string)
		is     error
		msg    string
	}{
		{name: "missing tensor", cfg: base, ts: without(ts, "model.layers.1.mlp.up_proj.weight"), is: ErrTensor, msg: "model.layers.1.mlp.up_proj.weight is missing"},
		{name: "missing lm head", cfg: base, ts: without(ts, "lm_head.weight"), is: ErrTensor, msg: "lm_head.weight"},
		{name: "wrong shape", cfg: base, ts: reshaped, is: ErrTensor, msg: "k_proj.weight has shape [32 16]"},
		{name: "integer dtype", cfg: base, ts: intTensor, is: ErrTensor, msg: "I16"},
		{name: "model type", cfg: with("model_type", "mistral"), ts: ts, is: ErrUnsupported, msg: `model_type "mistral"`},
		{name: "attention bias", cfg: with("attention_bias", true), ts: ts, is: ErrUnsupported, msg: "attention_bias"},
		{name: "activation", cfg: with("hidden_act", "gelu"), ts: ts, is: ErrUnsupported, msg: "gelu"},
		{name: "rope scaling", cfg: with("rope_scaling", map[string]any{"rope_type": "yarn", "factor": 4.0}), ts: ts, is: ErrUnsupported, msg: "yarn"},
		{name: "bad llama3 scaling", cfg: with("rope_scaling", map[string]any{"rope_type": "llama3", "factor": 8.0}), ts: ts, is: ErrConfig, msg: "llama3"},
		{name: "heads not a multiple", cfg: with("num_key_value_heads", 3), ts: ts, is: ErrConfig, msg: "not a multiple"},
		{name: "odd head dim", cfg: with("head_dim", 7), ts: ts, is: ErrConfig, msg: "odd"},
		{name: "negative size", cfg: with("hidden_size", -32), ts: ts, is: ErrConfig, msg: "hidden_size = -32"},
		{name: "rope theta", cfg: with("rope_theta", -1.0), ts: ts, is: ErrConfig, msg: "rope_theta"},
		{name: "eos outside vocab", cfg: with("eos_token_id", []int{257, 999}), ts: ts, is: ErrConfig, msg: "eos_token_id 999"},
		{name: "config type", cfg: with("num_hidden_layers", "two"), ts: ts, is: ErrConfig, msg: "num_hidden_layers"},
		{name: "truncated", cfg: base, ts: ts, is: ErrFormat, msg: "truncated", edit: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors")
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-10); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "truncated header", cfg: base, ts: ts, is: ErrFormat, msg: "truncated", edit: func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, "model.safetensors"), 100); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "index names a tensor the shard lacks", cfg: base, ts: ts, shards: 2, is: ErrTensor, msg: "does not hold it", edit: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors.index.json")
			b, _ := os.ReadFile(p)
			var idx map[string]map[string]string
			json.Unmarshal(b, &idx)
			idx["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
			b, _ = json.Marshal(idx)
			os.WriteFile(p, b, 0o644)
		}},
		{name: "index path outside the directory", cfg: base, ts: ts, shards: 2, is: ErrFormat, msg: "not a file name", edit: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors.index.json")
			b, _ := os.ReadFile(p)
			b = []byte(strings.Replace(string(b), `"model-00001-of-00002.safetensors"`, `"../model-00001-of-00002.safetensors"`, 1))
			os.WriteFile(p, b, 0o644)
		}},
		{name: "no config", cfg: base, ts: ts, is: os.ErrNotExist, msg: "config.json", edit: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "config.json"))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeTiny(t, c.cfg, c.ts, c.shards)
			if c.edit != nil {
				c.edit(t, dir)
			}
			m, err := Load(dir, LoadOptions{})
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q: want %v containing %q", err, c.is, c.msg)
			}
		})
	}
}

// header builds a safetensors prefix around a JSON header.
func header(j string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(j))), j...)
}

func TestParseHeader(t *testing.T) {
	good := `{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	b := append(header(good), make([]byte, 20)...)
	h, err := ParseHeader(b, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Tensors) != 2 || h.Tensors[0].Name != "a" || h.Tensors[1].Elements() != 6 || h.Metadata["format"] != "pt" || h.DataStart != int64(8+len(good)) {
		t.Fatalf("parsed %+v", h)
	}
	for _, c := range []struct {
		name string
		json string
		data int
		msg  string
	}{
		{"bad json", `{"a":`, 0, "header JSON"},
		{"unknown dtype", `{"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}}`, 1, "unknown dtype"},
		{"size mismatch", `{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8, "needs 3*4 bytes"},
		{"reversed", `{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 8, "reversed"},
		{"past the end", `{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, 8, "truncated"},
		{"overlap", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12, "overlap"},
		{"negative dim", `{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`, 0, "out of range"},
		{"overflow", `{"a":{"dtype":"F32","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,0]}}`, 0, "overflows"},
		{"no offsets", `{"a":{"dtype":"F32","shape":[1]}}`, 4, "data_offsets"},
		{"metadata", `{"__metadata__":{"a":1}}`, 0, "__metadata__"},
	} {
		b := append(header(c.json), make([]byte, c.data)...)
		if _, err := ParseHeader(b, int64(len(b))); err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.msg)
		}
	}
	huge := binary.LittleEndian.AppendUint64(nil, 1<<40)
	if _, err := ParseHeader(huge, 1<<41); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("huge header: %v", err)
	}
	if _, err := ParseHeader([]byte{1, 2}, 2); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("short file: %v", err)
	}
}

// FuzzParseHeader: any input either fails with ErrFormat or yields
// tensors inside the data section, sorted and disjoint.
func FuzzParseHeader(f *testing.F) {
	f.Add(header(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), int64(8))
	f.Add(header(`{"__metadata__":{"k":"v"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"x":{"dtype":"U8","shape":[],"data_offsets":[8,9]}}`), int64(9))
	f.Add(header(`{}`), int64(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, int64(0))
	f.Fuzz(func(t *testing.T, b []byte, extra int64) {
		if extra < 0 || extra > 1<<40 {
			extra = 0
		}
		size := int64(len(b)) + extra
		h, err := ParseHeader(b, size)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v is not ErrFormat", err)
			}
			return
		}
		var prev int64
		for _, x := range h.Tensors {
			if x.Begin < prev || x.End < x.Begin || h.DataStart+x.End > size || x.End-x.Begin != x.Elements()*int64(x.DType.Size()) {
				t.Fatalf("tensor %+v out of order or bounds (data start %d, size %d)", x, h.DataStart, size)
			}
			prev = x.End
		}
	})
}

// TestFloat16: every half-precision bit pattern converts to its exact
// value.
func TestFloat16(t *testing.T) {
	for u := range 1 << 16 {
		h := uint16(u)
		sign := 1.0
		if h>>15 != 0 {
			sign = -1
		}
		e, m := int(h>>10&0x1f), float64(h&0x3ff)
		var want float64
		switch e {
		case 0:
			want = sign * m * math.Pow(2, -24)
		case 31:
			if m != 0 {
				if got := Float16ToFloat32(h); !math.IsNaN(float64(got)) {
					t.Fatalf("%#04x: %v, want NaN", h, got)
				}
				continue
			}
			want = sign * math.Inf(1)
		default:
			want = sign * (1 + m/1024) * math.Pow(2, float64(e-15))
		}
		if got := Float16ToFloat32(h); float64(got) != want || math.Signbit(float64(got)) != (sign < 0) {
			t.Fatalf("%#04x: %v, want %v", h, got, want)
		}
	}
}
