package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"

	"github.com/questrt/questrt/internal/readlimit"
)

// ErrUnsupported marks a checkpoint this package cannot run (another
// architecture, biases, an activation other than SiLU, ...).
var ErrUnsupported = errors.New("model: unsupported checkpoint")

// ErrConfig marks a config.json with missing or impossible values.
var ErrConfig = errors.New("model: bad config")

// Config is the part of a Hugging Face Llama config.json this package
// uses. Field names follow the JSON keys.
type Config struct {
	ModelType        string  `json:"model_type"`
	VocabSize        int     `json:"vocab_size"`
	HiddenSize       int     `json:"hidden_size"`
	IntermediateSize int     `json:"intermediate_size"`
	Layers           int     `json:"num_hidden_layers"`
	Heads            int     `json:"num_attention_heads"`
	KVHeads          int     `json:"num_key_value_heads"` // default Heads
	HeadDim          int     `json:"head_dim"`            // default HiddenSize / Heads
	MaxPositions     int     `json:"max_position_embeddings"`
	RopeTheta        float64 `json:"rope_theta"`   // default 10000
	RMSNormEps       float64 `json:"rms_norm_eps"` // default 1e-6
	HiddenAct        string  `json:"hidden_act"`   // default silu
	TieEmbeddings    bool    `json:"tie_word_embeddings"`
	AttentionBias    bool    `json:"attention_bias"`
	MLPBias          bool    `json:"mlp_bias"`
	// BOS and EOS token ids; -1 when absent. EOS may be a list in the
	// JSON: the first entry is kept in EOS, all in EOSList.
	BOS     int   `json:"-"`
	EOS     int   `json:"-"`
	EOSList []int `json:"-"`
	// RopeScaling is the optional "rope_scaling" object (Llama 3.1
	// "llama3" frequency scaling is the only kind supported).
	RopeScaling *RopeScaling `json:"rope_scaling"`
	TorchDType  string       `json:"torch_dtype"`
}

// RopeScaling is Llama 3.1's RoPE frequency scaling.
type RopeScaling struct {
	Type                 string  `json:"rope_type"`
	LegacyType           string  `json:"type"`
	Factor               float64 `json:"factor"`
	LowFreqFactor        float64 `json:"low_freq_factor"`
	HighFreqFactor       float64 `json:"high_freq_factor"`
	OriginalMaxPositions int     `json:"original_max_position_embeddings"`
}

// Kind returns the scaling's type ("rope_type", or the older "type").
func (r *RopeScaling) Kind() string {
	if r.Type != "" {
		return r.Type
	}
	return r.LegacyType
}

// ParseConfig parses a config.json, fills the defaults of Hugging Face's
// LlamaConfig and validates the result.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("%w: config.json: %v", ErrConfig, err)
	}
	var ids struct {
		BOS json.RawMessage `json:"bos_token_id"`
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if err := json.Unmarshal(b, &ids); err != nil {
		return Config{}, fmt.Errorf("%w: config.json: %v", ErrConfig, err)
	}
	var err error
	if c.BOS, _, err = tokenIDs("bos_token_id", ids.BOS); err != nil {
		return Config{}, err
	}
	if c.EOS, c.EOSList, err = tokenIDs("eos_token_id", ids.EOS); err != nil {
		return Config{}, err
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.HiddenSize / c.Heads
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if c.HiddenAct == "" {
		c.HiddenAct = "silu"
	}
	return c, c.Validate()
}

// tokenIDs reads a token id that may be null, a number or a list.
func tokenIDs(key string, raw json.RawMessage) (int, []int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return -1, nil, nil
	}
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		return one, []int{one}, nil
	}
	var list []int
	if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
		return 0, nil, fmt.Errorf("%w: %s %s: want an id or a list of ids", ErrConfig, key, raw)
	}
	return list[0], list, nil
}

// ReadConfig reads dir/config.json.
func ReadConfig(dir string) (Config, error) {
	b, err := readlimit.ReadFile(filepath.Join(dir, "config.json"), MaxMetadataFile)
	if err != nil {
		return Config{}, fmt.Errorf("model: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", filepath.Join(dir, "config.json"), err)
	}
	return c, nil
}

// Validate reports the first unsupported or impossible value.
func (c Config) Validate() error {
	switch {
	case c.ModelType != "llama":
		return fmt.Errorf("%w: model_type %q (want llama)", ErrUnsupported, c.ModelType)
	case c.HiddenAct != "silu":
		return fmt.Errorf("%w: hidden_act %q (want silu)", ErrUnsupported, c.HiddenAct)
	case c.AttentionBias:
		return fmt.Errorf("%w: attention_bias true", ErrUnsupported)
	case c.MLPBias:
		return fmt.Errorf("%w: mlp_bias true", ErrUnsupported)
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.Layers}, {"num_attention_heads", c.Heads}, {"num_key_value_heads", c.KVHeads},
		{"head_dim", c.HeadDim},
	} {
		if f.v < 1 || f.v > 1<<20 {
			return fmt.Errorf("%w: %s = %d (want 1..%d)", ErrConfig, f.name, f.v, 1<<20)
		}
	}
	switch {
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("%w: num_attention_heads %d is not a multiple of num_key_value_heads %d", ErrConfig, c.Heads, c.KVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("%w: head_dim %d is odd (RoPE rotates pairs)", ErrConfig, c.HeadDim)
	case c.MaxPositions < 0:
		return fmt.Errorf("%w: max_position_embeddings %d", ErrConfig, c.MaxPositions)
	case !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0):
		return fmt.Errorf("%w: rope_theta %v (want > 0)", ErrConfig, c.RopeTheta)
	case !(c.RMSNormEps > 0) || c.RMSNormEps > 1:
		return fmt.Errorf("%w: rms_norm_eps %v (want in (0, 1])", ErrConfig, c.RMSNormEps)
	case c.BOS >= c.VocabSize:
		return fmt.Errorf("%w: bos_token_id %d outside the vocabulary of %d", ErrConfig, c.BOS, c.VocabSize)
	}
	for _, id := range c.EOSList {
		if id < 0 || id >= c.VocabSize {
			return fmt.Errorf("%w: eos_token_id %d outside the vocabulary of %d", ErrConfig, id, c.VocabSize)
		}
	}
	if r := c.RopeScaling; r != nil {
		switch r.Kind() {
		case "", "default":
		case "llama3":
			if !(r.Factor >= 1) || !(r.LowFreqFactor > 0) || !(r.HighFreqFactor > r.LowFreqFactor) || r.OriginalMaxPositions < 1 {
				return fmt.Errorf("%w: llama3 rope_scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings >= 1: %+v", ErrConfig, *r)
			}
		default:
			return fmt.Errorf("%w: rope_scaling type %q (want llama3)", ErrUnsupported, r.Kind())
		}
	}
	return nil
}

// Group is the query heads per KV head.
func (c Config) Group() int { return c.Heads / c.KVHeads }

// Params is the number of weights of the model.
func (c Config) Params() int64 {
	h, v, i := int64(c.HiddenSize), int64(c.VocabSize), int64(c.IntermediateSize)
	q, kv := int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim)
	per := 2*h + h*q + 2*h*kv + q*h + 3*h*i
	n := v*h + int64(c.Layers)*per + h
	if !c.TieEmbeddings {
		n += v * h
	}
	return n
}
