package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/questrt/questrt/internal/memlimit"

	"github.com/questrt/questrt/internal/readlimit"
)

// ErrTensor marks a checkpoint whose tensors do not match its config: a
// missing tensor, a wrong shape, a non-float dtype.
var ErrTensor = errors.New("model: bad tensor")

// Checkpoint is an opened Hugging Face checkpoint directory: its config and
// its mapped safetensors files (one, or the shards of
// model.safetensors.index.json).
type Checkpoint struct {
	Dir    string
	Config Config
	files  []*File
	where  map[string]*File // tensor name -> file
}

// OpenCheckpoint reads dir/config.json and maps dir/model.safetensors, or
// the shards listed in dir/model.safetensors.index.json when it exists.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	cfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	ck := &Checkpoint{Dir: dir, Config: cfg, where: map[string]*File{}}
	index := filepath.Join(dir, "model.safetensors.index.json")
	b, err := readlimit.ReadFile(index, MaxMetadataFile)
	switch {
	case err == nil:
		if err := ck.openIndex(index, b); err != nil {
			ck.Close()
			return nil, err
		}
	case errors.Is(err, os.ErrNotExist):
		f, err := OpenSafetensors(filepath.Join(dir, "model.safetensors"))
		if err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
		ck.files = append(ck.files, f)
		for _, t := range f.Header.Tensors {
			ck.where[t.Name] = f
		}
	default:
		return nil, fmt.Errorf("model: %w", err)
	}
	return ck, nil
}

func (ck *Checkpoint) openIndex(path string, b []byte) error {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return fmt.Errorf("model: %s: %w: %v", path, ErrFormat, err)
	}
	if len(idx.WeightMap) == 0 {
		return fmt.Errorf("model: %s: %w: empty weight_map", path, ErrFormat)
	}
	byName := map[string]*File{}
	names := make([]string, 0, len(idx.WeightMap))
	for name := range idx.WeightMap {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		shard := idx.WeightMap[name]
		if shard == "" || filepath.Base(shard) != shard {
			return fmt.Errorf("model: %s: %w: tensor %q maps to %q, not a file name in the directory", path, ErrFormat, name, shard)
		}
		f, ok := byName[shard]
		if !ok {
			var err error
			if f, err = OpenSafetensors(filepath.Join(ck.Dir, shard)); err != nil {
				return fmt.Errorf("model: %w", err)
			}
			byName[shard] = f
			ck.files = append(ck.files, f)
		}
		if _, ok := f.Header.Tensor(name); !ok {
			return fmt.Errorf("model: %w: %s lists %q in %s, which does not hold it", ErrTensor, filepath.Base(path), name, shard)
		}
		ck.where[name] = f
	}
	return nil
}

// Close unmaps the files. Tensors returned in place become invalid.
func (ck *Checkpoint) Close() error {
	var first error
	for _, f := range ck.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	ck.files = nil
	return first
}

// Names returns the tensor names, sorted.
func (ck *Checkpoint) Names() []string {
	names := make([]string, 0, len(ck.where))
	for n := range ck.where {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Tensor returns the named tensor as float32 after checking its shape;
// alias reports a slice into the mapped file (valid until Close).
func (ck *Checkpoint) Tensor(name string, shape ...int) (v []float32, alias bool, err error) {
	f, ok := ck.where[name]
	if !ok {
		return nil, false, fmt.Errorf("%w: %s is missing from %s", ErrTensor, name, ck.Dir)
	}
	t, _ := f.Header.Tensor(name)
	if !slices.Equal(t.Shape, shape) {
		return nil, false, fmt.Errorf("%w: %s has shape %v in %s, the config needs %v", ErrTensor, name, t.Shape, filepath.Base(f.Path), shape)
	}
	v, alias, err = f.Float32(t)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s: %v", ErrTensor, filepath.Base(f.Path), err)
	}
	return v, alias, nil
}

// LoadOptions tune Load.
type LoadOptions struct {
	// MemoryLimit bounds the float32 weights converted into the heap: a
	// byte count, 0 (the memory available now) or -1 (no check).
	MemoryLimit int64
	// Workers is the goroutines of matrix products (0: GOMAXPROCS).
	Workers int
}

// Load opens the checkpoint in dir and builds the model. Weights stored as
// F32 stay in the mapped file; F16 and BF16 are converted to float32.
func Load(dir string, opt LoadOptions) (*Model, error) {
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	m, err := FromCheckpoint(ck, opt)
	if err != nil {
		ck.Close()
		return nil, err
	}
	return m, nil
}

// FromCheckpoint builds the model from an opened checkpoint, which the
// model then owns (Model.Close closes it).
func FromCheckpoint(ck *Checkpoint, opt LoadOptions) (*Model, error) {
	c := ck.Config
	need := memlimit.Mul(c.Params(), 4)
	if err := memlimit.Check(fmt.Sprintf("model: %d float32 weights of %s", c.Params(), ck.Dir), need, opt.MemoryLimit); err != nil {
		return nil, err
	}
	h, q, kv, in := c.HiddenSize, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.IntermediateSize
	m := &Model{Config: c, ck: ck, workers: opt.Workers}
	var errs []error
	get := func(name string, shape ...int) []float32 {
		v, _, err := ck.Tensor(name, shape...)
		if err != nil {
			errs = append(errs, err)
		}
		return v
	}
	m.embed = get("model.embed_tokens.weight", c.VocabSize, h)
	m.normW = get("model.norm.weight", h)
	if c.TieEmbeddings {
		m.lmHead = m.embed
	} else {
		m.lmHead = get("lm_head.weight", c.VocabSize, h)
	}
	for i := range c.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		m.layers = append(m.layers, layerWeights{
			attnNorm: get(p+"input_layernorm.weight", h),
			mlpNorm:  get(p+"post_attention_layernorm.weight", h),
			wq:       get(p+"self_attn.q_proj.weight", q, h),
			wk:       get(p+"self_attn.k_proj.weight", kv, h),
			wv:       get(p+"self_attn.v_proj.weight", kv, h),
			wo:       get(p+"self_attn.o_proj.weight", h, q),
			gate:     get(p+"mlp.gate_proj.weight", in, h),
			up:       get(p+"mlp.up_proj.weight", in, h),
			down:     get(p+"mlp.down_proj.weight", h, in),
		})
	}
	if len(errs) > 0 {
		if len(errs) > 3 {
			errs = append(errs[:3], fmt.Errorf("... and %d more tensor errors", len(errs)-3))
		}
		return nil, errors.Join(errs...)
	}
	// Tensors of a Llama checkpoint this model does not use are allowed
	// (rotary inv_freq buffers); tensors of other architectures are not.
	for _, n := range ck.Names() {
		if !strings.HasPrefix(n, "model.") && n != "lm_head.weight" {
			return nil, fmt.Errorf("%w: unexpected tensor %s (not a LlamaForCausalLM checkpoint?)", ErrUnsupported, n)
		}
	}
	m.rope = newRope(c)
	return m, nil
}
