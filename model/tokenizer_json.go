package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/questrt/questrt/internal/readlimit"
)

// This file reads a tokenizer.json into a BPETokenizer: the model's
// vocabulary and merges, the added tokens, the post-processor's BOS and
// EOS, and which path (byte-level or SentencePiece-style) it takes.

// tokenizerJSON is the part of tokenizer.json read here.
type tokenizerJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         struct {
		Type                    string          `json:"type"`
		Vocab                   map[string]int  `json:"vocab"`
		Merges                  json.RawMessage `json:"merges"`
		IgnoreMerges            bool            `json:"ignore_merges"`
		Dropout                 *float64        `json:"dropout"`
		ByteFallback            bool            `json:"byte_fallback"`
		ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
		UnkToken                *string         `json:"unk_token"`
		FuseUnk                 bool            `json:"fuse_unk"`
		EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	} `json:"model"`
}

type addedTokenJSON struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// notBPEError is LoadBPE's error for a tokenizer.json of another model
// type; LoadTokenizer falls back to the byte tokenizer on it.
type notBPEError struct{ path, typ string }

func (e *notBPEError) Error() string {
	return fmt.Sprintf("%s: %v: model type %q (only BPE is supported)", e.path, ErrUnsupported, e.typ)
}

func (e *notBPEError) Unwrap() error { return ErrUnsupported }

// Limits of the checkpoint files read whole, checked from their size
// before reading (a larger file is refused with readlimit.ErrTooLarge):
// the tokenizer's vocabulary and merges, and the JSON metadata
// (config.json, tokenizer_config.json, the safetensors index).
const (
	MaxTokenizerFile = 256 << 20
	MaxMetadataFile  = 64 << 20
)

// LoadBPE reads a byte-level BPE tokenizer.json (see BPETokenizer for
// what of it is supported). Errors name the path and wrap ErrTokenizer
// (a file that cannot be read as a tokenizer) or ErrUnsupported (a
// feature this package does not implement).
func LoadBPE(path string) (*BPETokenizer, error) { return loadTokenizerFile(path, parseBPE) }

// loadTokenizerFile reads path (at most MaxTokenizerFile bytes) and
// parses it; an error names the path, except a notBPEError, which
// names it itself.
func loadTokenizerFile(path string, parse func(path string, b []byte) (*BPETokenizer, error)) (*BPETokenizer, error) {
	b, err := readlimit.ReadFile(path, MaxTokenizerFile)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	t, err := parse(path, b)
	if err != nil {
		var nb *notBPEError
		if errors.As(err, &nb) {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

func parseBPE(path string, b []byte) (*BPETokenizer, error) {
	var f tokenizerJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokenizer, err)
	}
	return buildBPE(path, &f)
}

// buildBPE makes the tokenizer that f describes (read from a
// tokenizer.json, or made from a tokenizer.model by spm_model.go).
func buildBPE(path string, f *tokenizerJSON) (*BPETokenizer, error) {
	m := &f.Model
	if m.Type != "BPE" {
		return nil, &notBPEError{path, m.Type}
	}
	// A decoder other than ByteLevel marks the SentencePiece-style path.
	var spm *spmConfig
	if !isByteLevelDecoder(f.Decoder) {
		var err error
		if spm, err = parseSPM(f); err != nil {
			return nil, err
		}
	}
	switch {
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("%w: BPE dropout %v", ErrUnsupported, *m.Dropout)
	case m.ByteFallback && spm == nil:
		return nil, fmt.Errorf("%w: BPE byte_fallback with a ByteLevel decoder", ErrUnsupported)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, fmt.Errorf("%w: BPE continuing_subword_prefix %q", ErrUnsupported, *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("%w: BPE end_of_word_suffix %q", ErrUnsupported, *m.EndOfWordSuffix)
	case len(m.Vocab) == 0:
		return nil, fmt.Errorf("%w: model.vocab is missing or empty", ErrTokenizer)
	}
	if spm == nil {
		if !isNull(f.Normalizer) {
			return nil, fmt.Errorf("%w: normalizer %s (only null with a ByteLevel decoder)", ErrUnsupported, typeOf(f.Normalizer))
		}
		if err := checkDecoder(f.Decoder); err != nil {
			return nil, err
		}
	}
	t := &BPETokenizer{path: path, ignoreMerges: m.IgnoreMerges, cache: newBPECache(1 << 14), spm: spm}

	// Vocabulary: ids, and tokens by raw bytes.
	maxID := -1
	for tok, id := range m.Vocab {
		if id < 0 || id > 1<<24 {
			return nil, fmt.Errorf("%w: vocab id %d of %q out of range", ErrTokenizer, id, tok)
		}
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID > 1<<24 {
			return nil, fmt.Errorf("%w: added token id %d of %q out of range", ErrTokenizer, a.ID, a.Content)
		}
		if a.Content == "" {
			return nil, fmt.Errorf("%w: added token %d is empty", ErrTokenizer, a.ID)
		}
		maxID = max(maxID, a.ID)
	}
	t.vocabSize = maxID + 1
	t.pieces = make([][]byte, t.vocabSize)
	t.known = make([]bool, t.vocabSize)
	t.special = make([]bool, t.vocabSize)
	t.vocab = make(map[string]int, len(m.Vocab))
	owner := make(map[int]string, len(m.Vocab))
	for tok, id := range m.Vocab {
		if o, dup := owner[id]; dup {
			a, b := min(o, tok), max(o, tok)
			return nil, fmt.Errorf("%w: vocab id %d belongs to both %q and %q", ErrTokenizer, id, a, b)
		}
		owner[id] = tok
		t.known[id] = true
		if spm != nil {
			// SentencePiece-style: tokens are their own UTF-8.
			t.pieces[id] = []byte(tok)
			t.vocab[tok] = id
			continue
		}
		raw, ok := ByteLevelDecode(tok)
		if !ok {
			// Not byte-level: no input reaches it; it decodes to its own
			// UTF-8, as the ByteLevel decoder does.
			t.pieces[id] = []byte(tok)
			if t.other == nil {
				t.other = make(map[string]int)
			}
			t.other[tok] = id
			continue
		}
		t.pieces[id] = raw
		t.vocab[string(raw)] = id
	}
	if spm != nil {
		if err := spm.setup(t, m.Vocab, m.ByteFallback, m.UnkToken, m.FuseUnk); err != nil {
			return nil, err
		}
	} else {
		for c := range 256 {
			id, ok := m.Vocab[string(byteToRune[c])]
			if !ok {
				return nil, fmt.Errorf("%w: the vocabulary lacks the byte-level token %q of byte 0x%02x (not a byte-level BPE)", ErrUnsupported, string(byteToRune[c]), c)
			}
			t.byteID[c] = id
		}
	}

	// Merges.
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	t.merges = make(map[uint64]bpeMerge, len(pairs))
	for rank, p := range pairs {
		a, okA := m.Vocab[p[0]]
		b, okB := m.Vocab[p[1]]
		c, okC := m.Vocab[p[0]+p[1]]
		switch {
		case !okA:
			return nil, fmt.Errorf("%w: merge %d (%q %q): %q is not in the vocabulary", ErrTokenizer, rank, p[0], p[1], p[0])
		case !okB:
			return nil, fmt.Errorf("%w: merge %d (%q %q): %q is not in the vocabulary", ErrTokenizer, rank, p[0], p[1], p[1])
		case !okC:
			return nil, fmt.Errorf("%w: merge %d (%q %q): the merged %q is not in the vocabulary", ErrTokenizer, rank, p[0], p[1], p[0]+p[1])
		}
		t.merges[pairKey(a, b)] = bpeMerge{rank: int32(rank), id: int32(c)}
	}

	// Added tokens.
	var passes [2][]addedTokenJSON
	for _, a := range f.AddedTokens {
		if o, dup := owner[a.ID]; dup && o != a.Content {
			return nil, fmt.Errorf("%w: added token %q has id %d of the vocabulary's %q", ErrTokenizer, a.Content, a.ID, o)
		}
		owner[a.ID] = a.Content
		t.known[a.ID] = true
		t.special[a.ID] = a.Special
		if raw, ok := ByteLevelDecode(a.Content); ok && spm == nil {
			t.pieces[a.ID] = raw
		} else {
			t.pieces[a.ID] = []byte(a.Content)
		}
		// The Rust crate matches the tokens with normalized false first,
		// then the others in the gaps.
		if a.Normalized {
			passes[1] = append(passes[1], a)
		} else {
			passes[0] = append(passes[0], a)
		}
	}
	for i, p := range passes {
		if len(p) > 0 {
			t.added[i] = newAddedMatcher(p)
		}
	}

	// Pre-tokenizer (the SentencePiece path read its own).
	if spm == nil {
		if t.split, err = parsePreTokenizer(f.PreTokenizer); err != nil {
			return nil, err
		}
	}

	// BOS and EOS.
	t.bos, t.eos = -1, -1
	byName := func(name string) int {
		for _, a := range f.AddedTokens {
			if a.Content == name {
				return a.ID
			}
		}
		if id, ok := m.Vocab[name]; ok {
			return id
		}
		return -1
	}
	if t.bos, t.eos, err = postProcessorSpecials(f.PostProcessor, byName); err != nil {
		return nil, err
	}
	for _, n := range []string{"<|begin_of_text|>", "<s>", "<|startoftext|>"} {
		if id := specialNamed(f.AddedTokens, n); t.bos < 0 && id >= 0 {
			t.bos = id
		}
	}
	for _, n := range []string{"<|end_of_text|>", "</s>", "<|endoftext|>"} {
		if id := specialNamed(f.AddedTokens, n); t.eos < 0 && id >= 0 {
			t.eos = id
		}
	}
	return t, nil
}

func specialNamed(added []addedTokenJSON, name string) int {
	for _, a := range added {
		if a.Special && a.Content == name {
			return a.ID
		}
	}
	return -1
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

// typeOf returns the "type" of a tokenizer.json component, for errors.
func typeOf(raw json.RawMessage) string {
	var c struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(raw, &c) != nil || c.Type == "" {
		return "(no type)"
	}
	return strconv.Quote(c.Type)
}

// parseMerges reads merges in either encoding.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		out := make([][2]string, len(strs))
		for i, s := range strs {
			a, b, ok := strings.Cut(s, " ")
			if !ok || a == "" || b == "" || strings.Contains(b, " ") {
				return nil, fmt.Errorf("%w: merge %d %q is not two tokens separated by a space", ErrTokenizer, i, s)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var lists [][]string
	if err := json.Unmarshal(raw, &lists); err != nil {
		return nil, fmt.Errorf("%w: merges: want a list of \"a b\" strings or of [a, b] pairs: %v", ErrTokenizer, err)
	}
	out := make([][2]string, len(lists))
	for i, l := range lists {
		if len(l) != 2 || l[0] == "" || l[1] == "" {
			return nil, fmt.Errorf("%w: merge %d %q is not a pair of tokens", ErrTokenizer, i, l)
		}
		out[i] = [2]string{l[0], l[1]}
	}
	return out, nil
}

func checkDecoder(raw json.RawMessage) error {
	var d struct {
		Type     string            `json:"type"`
		Decoders []json.RawMessage `json:"decoders"`
	}
	if isNull(raw) {
		return fmt.Errorf("%w: decoder null (want ByteLevel)", ErrUnsupported)
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("%w: decoder: %v", ErrTokenizer, err)
	}
	if d.Type == "Sequence" && len(d.Decoders) == 1 {
		return checkDecoder(d.Decoders[0])
	}
	if d.Type != "ByteLevel" {
		return fmt.Errorf("%w: decoder %q (want ByteLevel)", ErrUnsupported, d.Type)
	}
	return nil
}

// postProcessorSpecials returns the BOS and EOS a post-processor adds.
func postProcessorSpecials(raw json.RawMessage, byName func(string) int) (bos, eos int, err error) {
	bos, eos = -1, -1
	if isNull(raw) {
		return
	}
	var p struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int `json:"ids"`
		} `json:"special_tokens"`
		CLS []json.RawMessage `json:"cls"`
		SEP []json.RawMessage `json:"sep"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return -1, -1, fmt.Errorf("%w: post_processor: %v", ErrTokenizer, err)
	}
	switch p.Type {
	case "Sequence":
		for _, q := range p.Processors {
			b, e, err := postProcessorSpecials(q, byName)
			if err != nil {
				return -1, -1, err
			}
			if b >= 0 {
				bos = b
			}
			if e >= 0 {
				eos = e
			}
		}
	case "TemplateProcessing":
		id := func(name string) int {
			if st, ok := p.SpecialTokens[name]; ok && len(st.IDs) == 1 {
				return st.IDs[0]
			}
			return byName(name)
		}
		seen := false
		for _, it := range p.Single {
			switch {
			case it.Sequence != nil:
				seen = true
			case it.SpecialToken != nil && !seen && bos < 0:
				bos = id(it.SpecialToken.ID)
			case it.SpecialToken != nil && seen:
				eos = id(it.SpecialToken.ID)
			}
		}
	case "RobertaProcessing", "BertProcessing":
		pairID := func(v []json.RawMessage) int {
			var n int
			if len(v) == 2 && json.Unmarshal(v[1], &n) == nil {
				return n
			}
			return -1
		}
		bos, eos = pairID(p.CLS), pairID(p.SEP)
	}
	return bos, eos, nil
}
