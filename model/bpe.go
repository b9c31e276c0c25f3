package model

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/dlclark/regexp2/v2"
)

// ErrTokenizer marks a tokenizer.json that cannot be read: bad JSON,
// merges naming tokens outside the vocabulary, clashing ids.
var ErrTokenizer = errors.New("model: bad tokenizer")

// BPETokenizer is a Hugging Face tokenizer.json BPE tokenizer: the
// byte-level BPE of the GPT-2 / Llama-3 family (a ByteLevel decoder),
// described here, or the SentencePiece-style BPE of Llama-2, Mistral and
// TinyLlama (any other decoder), described in spm.go. What the
// byte-level path supports of the file:
//
//   - model: type "BPE" with vocab and merges, the merges either as
//     "a b" strings or as ["a", "b"] pairs (the rank of a merge is its
//     index; a repeated pair keeps its last rank, as the Rust crate
//     does); ignore_merges (a whole pre-token found in the vocabulary is
//     one token, as Llama-3 sets it). dropout, byte_fallback,
//     continuing_subword_prefix and end_of_word_suffix are refused
//     (both paths refuse dropout and the prefix and suffix). Every
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

	// added are the passes over the text: the tokens with normalized
	// false over the raw text, then those with normalized true over the
	// normalized gaps (nil: none).
	added [2]*addedMatcher
	split []*regexp2.Regexp

	// spm is the SentencePiece-style configuration (nil: byte-level).
	spm *spmConfig

	bos, eos  int
	vocabSize int

	cache *bpeCache
}

// bpeMerge is a merge's rank and the id it produces.
type bpeMerge struct {
	rank int32
	id   int32
}

func pairKey(a, b int) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

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
		if m == nil {
			continue
		}
		if id, ok := m.exact(token); ok {
			return id, true
		}
	}
	if t.spm != nil {
		id, ok := t.vocab[token]
		if !ok {
			id = -1
		}
		return id, ok
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
	if t.spm != nil {
		return t.spm.decode(t, ids, false)
	}
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
	t.encodeAdded(text, 0, true, &ids)
	return ids
}

// encodeAdded splits s by the added tokens of pass p and onwards, and
// encodes the gaps; the normalizer runs before pass 1 (the tokens with
// normalized true are found in the normalized text). first tells that
// s starts the text.
func (t *BPETokenizer) encodeAdded(s string, p int, first bool, ids *[]int) {
	if p == 1 && t.spm != nil {
		s = t.spm.normalize(s)
	}
	if p == len(t.added) {
		t.encodeText(s, first, ids)
		return
	}
	if t.added[p] == nil {
		t.encodeAdded(s, p+1, first, ids)
		return
	}
	start := 0
	t.added[p].find(s, func(a, b, id int) {
		if a > start {
			t.encodeAdded(s[start:a], p+1, first && start == 0, ids)
		}
		*ids = append(*ids, id)
		start = b
	})
	if start < len(s) {
		t.encodeAdded(s[start:], p+1, first && start == 0, ids)
	}
}

// encodeText pre-tokenizes s and encodes each pre-token.
func (t *BPETokenizer) encodeText(s string, first bool, ids *[]int) {
	if t.spm != nil {
		t.spm.preTokenize(s, first, func(w string) { t.encodeWord(w, ids) })
		return
	}
	t.preTokenize(s, func(w string) { t.encodeWord(w, ids) })
}

// maxCachedWord is the longest pre-token kept in the cache, in bytes.
const maxCachedWord = 128

// encodeWord appends the BPE encoding of one pre-token.
func (t *BPETokenizer) encodeWord(w string, ids *[]int) {
	switch {
	case len(w) == 0:
		return
	case len(w) == 1 && t.spm == nil:
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
