package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/questrt/questrt/internal/readlimit"
)

// This file picks a checkpoint directory's tokenizer and applies its
// tokenizer_config.json.

// LoadTokenizer returns the tokenizer of the checkpoint in dir whose
// config is cfg: the BPE of dir/tokenizer.json when that file exists and
// is a BPE model, else that of SentencePiece's dir/tokenizer.model when
// that file exists and is a BPE model (see LoadSPModel), with cfg's
// bos_token_id / eos_token_id
// (where given) as BOS / EOS and cfg's vocabulary size as VocabSize when
// larger (the model must cover every id of the file); otherwise the
// byte tokenizer, which checks that cfg is a byte-level model. A BPE
// file with features this package lacks is an error, not a fallback.
//
// dir/tokenizer_config.json, where it exists, decides whether prompts
// start with BOS, as transformers does: add_bos_token false gives the
// BPE tokenizer no BOS (PromptIDs adds none); add_bos_token true with no
// BOS from the files above takes bos_token's id.
func LoadTokenizer(dir string, cfg Config) (Tokenizer, error) {
	path := filepath.Join(dir, "tokenizer.json")
	t, err := LoadBPE(path)
	if errors.Is(err, fs.ErrNotExist) {
		path = filepath.Join(dir, "tokenizer.model")
		t, err = LoadSPModel(path)
	}
	var nb *notBPEError
	switch {
	case err == nil:
		if t.VocabSize() > cfg.VocabSize {
			return nil, fmt.Errorf("%s: %w: the tokenizer has ids up to %d but the model's vocabulary is %d", path, ErrUnsupported, t.VocabSize()-1, cfg.VocabSize)
		}
		if t, err = t.WithSpecial(cfg.BOS, cfg.EOS, cfg.VocabSize); err != nil {
			return nil, err
		}
		if err := applyTokenizerConfig(t, filepath.Join(dir, "tokenizer_config.json")); err != nil {
			return nil, err
		}
		return t, nil
	case errors.Is(err, fs.ErrNotExist):
		return NewByteTokenizer(cfg)
	case errors.As(err, &nb):
		bt, berr := NewByteTokenizer(cfg)
		if berr != nil {
			return nil, fmt.Errorf("%w; %v", berr, err)
		}
		return bt, nil
	default:
		return nil, err
	}
}

// applyTokenizerConfig sets t's BOS from the add_bos_token and bos_token
// of the tokenizer_config.json at path (none: nothing to do).
func applyTokenizerConfig(t *BPETokenizer, path string) error {
	b, err := readlimit.ReadFile(path, MaxMetadataFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("model: %w", err)
	}
	var c struct {
		AddBOS *bool           `json:"add_bos_token"`
		BOS    json.RawMessage `json:"bos_token"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("%s: %w: %v", path, ErrTokenizer, err)
	}
	switch {
	case c.AddBOS == nil:
	case !*c.AddBOS:
		t.bos = -1
	case t.bos < 0 && !isNull(c.BOS):
		// A string, or an AddedToken object with its content.
		var name string
		if json.Unmarshal(c.BOS, &name) != nil {
			var obj struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(c.BOS, &obj); err != nil {
				return fmt.Errorf("%s: %w: bos_token is neither a string nor an object with content: %v", path, ErrTokenizer, err)
			}
			name = obj.Content
		}
		id, ok := t.TokenID(name)
		if !ok {
			return fmt.Errorf("%s: %w: bos_token %q is not a token of the tokenizer", path, ErrTokenizer, name)
		}
		t.bos = id
	}
	return nil
}
