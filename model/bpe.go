package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// ErrTokenizer marks a tokenizer.json that cannot be read: bad JSON,
// merges naming tokens outside the vocabulary, clashing ids.
var ErrTokenizer = errors.New("model: bad tokenizer")

// BPETokenizer is a Hugging Face tokenizer.json byte-level BPE tokenizer
// of the GPT-2 / Llama-3 family. What it supports of the file:
//
//   - model: type "BPE" with vocab and merges, the merges either as
//     "a b" strings or as ["a", "b"] pairs (the rank of a merge is its
//     index; a repeated pair keeps its last rank, as the Rust crate
//     does); ignore_merges (a whole pre-token found in the vocabulary is
//     one token, as Llama-3 sets it). dropout, byte_fallback,
//     continuing_subword_prefix and end_of_word_suffix are refused. Every
//     one of the 256 byte-level characters must be in the vocabulary, so
//     any input (invalid UTF-8 included) has an encoding.
//   - added_tokens: matched in the raw text before pre-tokenization,
//     leftmost-longest, the tokens with normalized false first and then
//     the others in the gaps (as the Rust crate does; there is no
//     normalizer), with their lstrip, rstrip and single_word flags.
//   - normalizer: null only.
//   - pre_tokenizer: Split (a Regex or String pattern, behavior
//     Isolated, invert false) any number of times, then ByteLevel
//     (add_prefix_space false; use_regex true adds GPT-2's split
//     pattern), alone or in a Sequence with ByteLevel last. Llama-3's is
//     Sequence[Split(Regex, Isolated), ByteLevel(use_regex false)]. The
//     patterns are Oniguruma patterns, compiled here with regexp2's
//     default (.NET) syntax, which has the lookahead they use: \s is
//     Unicode White_Space in both, \p{L} / \p{N} follow the Go
//     toolchain's Unicode tables (15.0 in Go 1.26), (?i) folds with Go's
//     simple folding (so (?i:'s) also matches 'ſ, as Oniguruma's Unicode
//     folding does) and \w is .NET's word class.
//     Invalid UTF-8 in the input is matched as U+FFFD, one per byte, and
//     its bytes are kept.
//   - post_processor: read for BOS and EOS only (Encode adds neither).
//   - decoder: ByteLevel only.
//
// BOS and EOS: the special tokens around $A in a TemplateProcessing
// post-processor's "single" template (also inside a Sequence), or the cls
// / sep of a Roberta or Bert processor; failing that, the added special
// tokens named <|begin_of_text|>, <s> or <|startoftext|> (BOS) and
// <|end_of_text|>, </s> or <|endoftext|> (EOS); else -1. LoadTokenizer
// replaces them by the model's config.json bos_token_id / eos_token_id
// where those are given, since config.json is what the checkpoint was
// trained and tuned with (Llama-3 Instruct stops at <|eot_id|>, not at
// the file's <|end_of_text|>).
//
// Decode skips ids it does not know (negative, past the vocabulary, or
// in a gap of a sparse one) and special added tokens, and returns the
// exact bytes of the rest: a single id may end inside a UTF-8 character,
// so decoding id by id and concatenating gives the same bytes as
// decoding all at once (the Rust crate instead replaces invalid UTF-8 in
// each result by U+FFFD). A BPETokenizer is safe for concurrent use.
type BPETokenizer struct {
	path string

	vocab        map[string]int // model tokens by their raw bytes (byte-level decoded)
	other        map[string]int // model tokens outside the byte-level alphabet
	byteID       [256]int       // id of each single-byte token
	merges       map[uint64]bpeMerge
	ignoreMerges bool

	// pieces[id] is what id decodes to; special marks special added
	// tokens (decode to nothing); known marks ids that exist.
	pieces  [][]byte
	known   []bool
	special []bool

	added []*addedMatcher // passes over the text, in order
	split []*regexp2.Regexp

	bos, eos  int
	vocabSize int

	cache *bpeCache
}

// bpeMerge is a merge's rank and the id it produces.
type bpeMerge struct {
	rank int32
	id   int32
}

// gpt2Pattern is the split pattern of ByteLevel with use_regex true (the
// Rust crate's built-in, not in the file).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// byteToRune and runeToByte are GPT-2's bytes_to_unicode and its inverse.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

// ByteLevelEncode maps bytes to GPT-2's byte-level characters (what the
// vocabulary of a byte-level tokenizer.json is written in).
func ByteLevelEncode(b []byte) string {
	var s strings.Builder
	s.Grow(2 * len(b))
	for _, c := range b {
		s.WriteRune(byteToRune[c])
	}
	return s.String()
}

// ByteLevelDecode maps byte-level characters back to bytes; ok is false
// when s holds a character outside the mapping.
func ByteLevelDecode(s string) (b []byte, ok bool) {
	b = make([]byte, 0, len(s))
	for _, r := range s {
		c, in := runeToByte[r]
		if !in {
			return nil, false
		}
		b = append(b, c)
	}
	return b, true
}

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

// LoadBPE reads a byte-level BPE tokenizer.json (see BPETokenizer for
// what of it is supported). Errors name the path and wrap ErrTokenizer
// (a file that cannot be read as a tokenizer) or ErrUnsupported (a
// feature this package does not implement).
func LoadBPE(path string) (*BPETokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	t, err := parseBPE(path, b)
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
	m := &f.Model
	if m.Type != "BPE" {
		return nil, &notBPEError{path, m.Type}
	}
	switch {
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("%w: BPE dropout %v", ErrUnsupported, *m.Dropout)
	case m.ByteFallback:
		return nil, fmt.Errorf("%w: BPE byte_fallback", ErrUnsupported)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, fmt.Errorf("%w: BPE continuing_subword_prefix %q", ErrUnsupported, *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("%w: BPE end_of_word_suffix %q", ErrUnsupported, *m.EndOfWordSuffix)
	case len(m.Vocab) == 0:
		return nil, fmt.Errorf("%w: model.vocab is missing or empty", ErrTokenizer)
	}
	if !isNull(f.Normalizer) {
		return nil, fmt.Errorf("%w: normalizer %s (only null)", ErrUnsupported, typeOf(f.Normalizer))
	}
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, err
	}
	t := &BPETokenizer{path: path, ignoreMerges: m.IgnoreMerges, cache: newBPECache(1 << 14)}

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
	for c := range 256 {
		id, ok := m.Vocab[string(byteToRune[c])]
		if !ok {
			return nil, fmt.Errorf("%w: the vocabulary lacks the byte-level token %q of byte 0x%02x (not a byte-level BPE)", ErrUnsupported, string(byteToRune[c]), c)
		}
		t.byteID[c] = id
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
		if raw, ok := ByteLevelDecode(a.Content); ok {
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
	for _, p := range passes {
		if len(p) > 0 {
			t.added = append(t.added, newAddedMatcher(p))
		}
	}

	// Pre-tokenizer.
	if t.split, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
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

func pairKey(a, b int) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

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

// preTokJSON is one pre-tokenizer component.
type preTokJSON struct {
	Type          string            `json:"type"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Pattern       struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
}

// parsePreTokenizer returns the split patterns, in order.
func parsePreTokenizer(raw json.RawMessage) ([]*regexp2.Regexp, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("%w: pre_tokenizer null (want ByteLevel, or a Sequence of Splits and ByteLevel)", ErrUnsupported)
	}
	var top preTokJSON
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("%w: pre_tokenizer: %v", ErrTokenizer, err)
	}
	parts := []json.RawMessage{raw}
	if top.Type == "Sequence" {
		parts = top.PreTokenizers
	}
	var res []*regexp2.Regexp
	for i, p := range parts {
		var c preTokJSON
		if err := json.Unmarshal(p, &c); err != nil {
			return nil, fmt.Errorf("%w: pre_tokenizer %d: %v", ErrTokenizer, i, err)
		}
		last := i == len(parts)-1
		switch c.Type {
		case "Split":
			if last {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: Split after ByteLevel (want ByteLevel last)", ErrUnsupported, i)
			}
			if c.Behavior != "Isolated" {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: Split behavior %q (only Isolated)", ErrUnsupported, i, c.Behavior)
			}
			if c.Invert {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: Split invert true", ErrUnsupported, i)
			}
			var pat string
			switch {
			case c.Pattern.Regex != nil:
				pat = *c.Pattern.Regex
			case c.Pattern.String != nil:
				if *c.Pattern.String == "" {
					return nil, fmt.Errorf("%w: pre_tokenizer %d: empty String pattern", ErrUnsupported, i)
				}
				pat = regexp2.Escape(*c.Pattern.String)
			default:
				return nil, fmt.Errorf("%w: pre_tokenizer %d: Split without a Regex or String pattern", ErrTokenizer, i)
			}
			re, err := compileSplit(pat)
			if err != nil {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: pattern %q: %v", ErrUnsupported, i, pat, err)
			}
			res = append(res, re)
		case "ByteLevel":
			if !last {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: ByteLevel before %s (want ByteLevel last)", ErrUnsupported, i, typeOf(parts[i+1]))
			}
			if c.AddPrefixSpace {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: ByteLevel add_prefix_space true", ErrUnsupported, i)
			}
			if c.UseRegex == nil || *c.UseRegex {
				res = append(res, regexp2.MustCompile(gpt2Pattern, regexp2.OptionMaxBacktrackingStackSize(-1)))
			}
			return res, nil
		default:
			return nil, fmt.Errorf("%w: pre_tokenizer %d: %s (want Split or ByteLevel)", ErrUnsupported, i, typeOf(p))
		}
	}
	return nil, fmt.Errorf("%w: pre_tokenizer has no ByteLevel (not a byte-level BPE)", ErrUnsupported)
}

// compileSplit compiles a split pattern. The backtracking stack is left
// unbounded: Llama-3's \s*[\r\n]+ backtracks over a whole whitespace run,
// so the stack grows with the input's longest run, not beyond.
func compileSplit(pat string) (*regexp2.Regexp, error) {
	return regexp2.Compile(pat, regexp2.OptionMaxBacktrackingStackSize(-1))
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

// BOS returns the beginning-of-sequence id (-1: none).
func (t *BPETokenizer) BOS() int { return t.bos }

// EOS returns the end-of-sequence id (-1: none).
func (t *BPETokenizer) EOS() int { return t.eos }

// VocabSize returns one past the largest id.
func (t *BPETokenizer) VocabSize() int { return t.vocabSize }

// Path returns the tokenizer.json the tokenizer was read from.
func (t *BPETokenizer) Path() string { return t.path }

// TokenID returns the id of a token written as in the file (byte-level
// characters, or an added token's content).
func (t *BPETokenizer) TokenID(token string) (int, bool) {
	for _, m := range t.added {
		if id, ok := m.exact(token); ok {
			return id, true
		}
	}
	if raw, ok := ByteLevelDecode(token); ok {
		if id, ok := t.vocab[string(raw)]; ok {
			return id, true
		}
	} else if id, ok := t.other[token]; ok {
		return id, true
	}
	return -1, false
}

// WithSpecial returns a copy of t with BOS and EOS set to bos and eos
// (-1: keep t's) and the vocabulary size raised to at least vocab (ids
// past the file's decode to nothing, as padding does). The copy shares
// t's tables and cache.
func (t *BPETokenizer) WithSpecial(bos, eos, vocab int) (*BPETokenizer, error) {
	c := *t
	for _, s := range []struct {
		name string
		id   int
		dst  *int
	}{{"bos", bos, &c.bos}, {"eos", eos, &c.eos}} {
		if s.id < 0 {
			continue
		}
		if s.id >= len(t.known) || !t.known[s.id] {
			return nil, fmt.Errorf("%s: %w: %s id %d is not a token of the tokenizer", t.path, ErrUnsupported, s.name, s.id)
		}
		*s.dst = s.id
	}
	c.vocabSize = max(t.vocabSize, vocab)
	return &c, nil
}

// Decode returns the bytes of ids (see BPETokenizer for what is skipped).
func (t *BPETokenizer) Decode(ids []int) string {
	n := 0
	for _, id := range ids {
		if id >= 0 && id < len(t.pieces) && !t.special[id] {
			n += len(t.pieces[id])
		}
	}
	b := make([]byte, 0, n)
	for _, id := range ids {
		if id >= 0 && id < len(t.pieces) && !t.special[id] {
			b = append(b, t.pieces[id]...)
		}
	}
	return string(b)
}

// Encode returns the ids of text, without BOS or EOS. Added tokens
// (<|begin_of_text|> and the like) written in text are encoded as
// themselves.
func (t *BPETokenizer) Encode(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	t.encodeAdded(text, 0, &ids)
	return ids
}

// encodeAdded splits s by the added tokens of pass p and onwards, and
// encodes the gaps.
func (t *BPETokenizer) encodeAdded(s string, p int, ids *[]int) {
	if p == len(t.added) {
		t.encodeText(s, ids)
		return
	}
	start := 0
	t.added[p].find(s, func(a, b, id int) {
		if a > start {
			t.encodeAdded(s[start:a], p+1, ids)
		}
		*ids = append(*ids, id)
		start = b
	})
	if start < len(s) {
		t.encodeAdded(s[start:], p+1, ids)
	}
}

// encodeText pre-tokenizes s and encodes each pre-token.
func (t *BPETokenizer) encodeText(s string, ids *[]int) {
	t.preTokenize(s, func(w string) { t.encodeWord(w, ids) })
}

// preTokenize calls emit with each pre-token of s, in order.
func (t *BPETokenizer) preTokenize(s string, emit func(string)) {
	if s == "" {
		return
	}
	if len(t.split) == 0 {
		emit(s)
		return
	}
	// Runes of s (invalid bytes as U+FFFD, one each) and the byte offset
	// of each rune, plus len(s).
	n := utf8.RuneCountInString(s)
	runes := make([]rune, 0, n)
	offs := make([]int, 0, n+1)
	for i, r := range s {
		runes = append(runes, r)
		offs = append(offs, i)
	}
	offs = append(offs, len(s))
	t.splitAt(s, runes, offs, 0, 0, len(runes), emit)
}

// splitAt applies split pattern k to the runes [lo, hi) (Isolated: the
// matches and the gaps between them are pieces) and passes each piece on.
func (t *BPETokenizer) splitAt(s string, runes []rune, offs []int, k, lo, hi int, emit func(string)) {
	if k == len(t.split) {
		emit(s[offs[lo]:offs[hi]])
		return
	}
	in := runes[lo:hi]
	pos := 0
	err := t.split[k].FindRunesMatches(in, 0, func(v regexp2.MatchView) bool {
		i, l, ok := v.GroupRange(0)
		if !ok || l == 0 {
			return true
		}
		if i > pos {
			t.splitAt(s, runes, offs, k+1, lo+pos, lo+i, emit)
		}
		t.splitAt(s, runes, offs, k+1, lo+i, lo+i+l, emit)
		pos = i + l
		return true
	})
	// An error is not expected (no timeout, unbounded stack); on one the
	// rest is one piece, so the text still round-trips.
	_ = err
	if pos < len(in) {
		t.splitAt(s, runes, offs, k+1, lo+pos, hi, emit)
	}
}

// maxCachedWord is the longest pre-token kept in the cache, in bytes.
const maxCachedWord = 128

// encodeWord appends the BPE encoding of one pre-token.
func (t *BPETokenizer) encodeWord(w string, ids *[]int) {
	switch len(w) {
	case 0:
		return
	case 1:
		*ids = append(*ids, t.byteID[w[0]])
		return
	}
	if t.ignoreMerges {
		if id, ok := t.vocab[w]; ok {
			*ids = append(*ids, id)
			return
		}
	}
	if len(w) <= maxCachedWord {
		if v, ok := t.cache.get(w); ok {
			*ids = append(*ids, v...)
			return
		}
	}
	start := len(*ids)
	*ids = t.merge(w, *ids)
	if len(w) <= maxCachedWord {
		// Cloned: w may be a slice of a long text.
		t.cache.put(strings.Clone(w), append([]int(nil), (*ids)[start:]...))
	}
}

// bpeSymbol is a symbol of a word being merged: a doubly linked list
// over the word's bytes.
type bpeSymbol struct {
	id         int32
	prev, next int32 // -1 at the ends
	dead       bool
}

// merge runs BPE on w's bytes, lowest rank first and leftmost first
// among equal ranks (the Rust crate's order), with a binary heap of
// candidate pairs: O(n log n) for n bytes. It appends the ids to ids.
func (t *BPETokenizer) merge(w string, ids []int) []int {
	n := len(w)
	var symBuf [64]bpeSymbol
	var heapBuf [64]uint64
	sym := symBuf[:0]
	if n > len(symBuf) {
		sym = make([]bpeSymbol, 0, n)
	}
	for i := range n {
		sym = append(sym, bpeSymbol{id: int32(t.byteID[w[i]]), prev: int32(i - 1), next: int32(i + 1)})
	}
	sym[n-1].next = -1
	h := bpeHeap(heapBuf[:0])
	for i := 0; i+1 < n; i++ {
		if m, ok := t.merges[pairKey(int(sym[i].id), int(sym[i+1].id))]; ok {
			h.push(uint64(uint32(m.rank))<<32 | uint64(i))
		}
	}
	for len(h) > 0 {
		top := h.pop()
		rank, pos := int32(top>>32), int32(uint32(top))
		s := &sym[pos]
		if s.dead || s.next < 0 {
			continue
		}
		nx := &sym[s.next]
		m, ok := t.merges[pairKey(int(s.id), int(nx.id))]
		if !ok || m.rank != rank {
			continue // stale: one of the pair has merged since
		}
		s.id = m.id
		nx.dead = true
		s.next = nx.next
		if s.next >= 0 {
			sym[s.next].prev = pos
			if m2, ok := t.merges[pairKey(int(s.id), int(sym[s.next].id))]; ok {
				h.push(uint64(uint32(m2.rank))<<32 | uint64(pos))
			}
		}
		if s.prev >= 0 {
			if m2, ok := t.merges[pairKey(int(sym[s.prev].id), int(s.id))]; ok {
				h.push(uint64(uint32(m2.rank))<<32 | uint64(s.prev))
			}
		}
	}
	for i := int32(0); i >= 0; i = sym[i].next {
		ids = append(ids, int(sym[i].id))
	}
	return ids
}

// bpeHeap is a min-heap of rank<<32 | position.
type bpeHeap []uint64

func (h *bpeHeap) push(v uint64) {
	*h = append(*h, v)
	a := *h
	i := len(a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if a[p] <= a[i] {
			break
		}
		a[p], a[i] = a[i], a[p]
		i = p
	}
}

func (h *bpeHeap) pop() uint64 {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(a) {
			break
		}
		c := l
		if r := l + 1; r < len(a) && a[r] < a[l] {
			c = r
		}
		if a[i] <= a[c] {
			break
		}
		a[i], a[c] = a[c], a[i]
		i = c
	}
	*h = a
	return top
}

// bpeCache maps pre-tokens to their ids. It is bounded by two
// generations of at most max entries: when the current one is full it
// becomes the old one and the old one is dropped, so recently used words
// survive. The slices are shared and never modified.
type bpeCache struct {
	mu       sync.RWMutex
	cur, old map[string][]int
	max      int
}

func newBPECache(max int) *bpeCache {
	return &bpeCache{cur: make(map[string][]int), max: max}
}

func (c *bpeCache) get(w string) ([]int, bool) {
	c.mu.RLock()
	v, ok := c.cur[w]
	if !ok {
		v, ok = c.old[w]
	}
	c.mu.RUnlock()
	return v, ok
}

func (c *bpeCache) put(w string, v []int) {
	c.mu.Lock()
	if len(c.cur) >= c.max {
		c.old, c.cur = c.cur, make(map[string][]int, c.max)
	}
	c.cur[w] = v
	c.mu.Unlock()
}

// addedMatcher finds added tokens in text: leftmost, then longest, with
// a byte trie.
type addedMatcher struct {
	nodes []addedNode
	first [256]bool
	toks  []addedTokenJSON // by trie terminal index
}

type addedNode struct {
	next map[byte]int32
	tok  int32 // index into toks, -1: none
}

func newAddedMatcher(toks []addedTokenJSON) *addedMatcher {
	m := &addedMatcher{nodes: []addedNode{{tok: -1}}}
	// Sorted for determinism; a repeated content keeps its first id.
	sort.SliceStable(toks, func(i, j int) bool { return toks[i].Content < toks[j].Content })
	for _, a := range toks {
		n := int32(0)
		for i := 0; i < len(a.Content); i++ {
			c := a.Content[i]
			if i == 0 {
				m.first[c] = true
			}
			nx, ok := m.nodes[n].next[c]
			if !ok {
				if m.nodes[n].next == nil {
					m.nodes[n].next = make(map[byte]int32)
				}
				nx = int32(len(m.nodes))
				m.nodes[n].next[c] = nx
				m.nodes = append(m.nodes, addedNode{tok: -1})
			}
			n = nx
		}
		if m.nodes[n].tok < 0 {
			m.nodes[n].tok = int32(len(m.toks))
			m.toks = append(m.toks, a)
		}
	}
	return m
}

// exact returns the id of the token whose content is s.
func (m *addedMatcher) exact(s string) (int, bool) {
	n := int32(0)
	for i := 0; i < len(s); i++ {
		nx, ok := m.nodes[n].next[s[i]]
		if !ok {
			return -1, false
		}
		n = nx
	}
	if k := m.nodes[n].tok; k >= 0 {
		return m.toks[k].ID, true
	}
	return -1, false
}

// find calls yield with the byte range and id of each match in s, in
// order and without overlaps, the ranges widened by lstrip and rstrip.
func (m *addedMatcher) find(s string, yield func(a, b, id int)) {
	prevEnd := 0
	for i := 0; i < len(s); {
		if !m.first[s[i]] {
			i++
			continue
		}
		n, best, end := int32(0), int32(-1), 0
		for j := i; j < len(s); j++ {
			nx, ok := m.nodes[n].next[s[j]]
			if !ok {
				break
			}
			n = nx
			if k := m.nodes[n].tok; k >= 0 {
				best, end = k, j+1
			}
		}
		if best < 0 {
			i++
			continue
		}
		a, b, tok := i, end, m.toks[best]
		if tok.SingleWord && (endsWithWord(s[:a]) || startsWithWord(s[b:])) {
			i = b // the Rust crate does not look inside a rejected match
			continue
		}
		if tok.LStrip {
			a = max(a-trailingSpace(s[prevEnd:a]), prevEnd)
		}
		if tok.RStrip {
			b += leadingSpace(s[b:])
		}
		yield(a, b, tok.ID)
		prevEnd, i = b, b
	}
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' }

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}

func trailingSpace(s string) int {
	return len(s) - len(strings.TrimRightFunc(s, unicode.IsSpace))
}

func leadingSpace(s string) int {
	return len(s) - len(strings.TrimLeftFunc(s, unicode.IsSpace))
}

// LoadTokenizer returns the tokenizer of the checkpoint in dir whose
// config is cfg: the byte-level BPE of dir/tokenizer.json when that file
// exists and is a BPE model, with cfg's bos_token_id / eos_token_id
// (where given) as BOS / EOS and cfg's vocabulary size as VocabSize when
// larger (the model must cover every id of the file); otherwise the
// byte tokenizer, which checks that cfg is a byte-level model. A BPE
// file with features this package lacks is an error, not a fallback.
func LoadTokenizer(dir string, cfg Config) (Tokenizer, error) {
	path := filepath.Join(dir, "tokenizer.json")
	t, err := LoadBPE(path)
	var nb *notBPEError
	switch {
	case err == nil:
		if t.VocabSize() > cfg.VocabSize {
			return nil, fmt.Errorf("%s: %w: the tokenizer has ids up to %d but the model's vocabulary is %d", path, ErrUnsupported, t.VocabSize()-1, cfg.VocabSize)
		}
		return t.WithSpecial(cfg.BOS, cfg.EOS, cfg.VocabSize)
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
