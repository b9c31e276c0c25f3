package model

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file is the SentencePiece-style path of BPETokenizer: the
// tokenizer.json of Llama-2, Mistral and TinyLlama (a BPE over
// characters, spaces written as U+2581, bytes outside the vocabulary as
// <0xXX> tokens). What it supports of the file:
//
//   - model: BPE with byte_fallback (a character outside the vocabulary
//     is the <0xXX> tokens of its UTF-8 bytes where all exist), unk_token
//     and fuse_unk (otherwise a run of unknown characters is one unk
//     token, or one each without fuse_unk; without unk_token they are
//     dropped, as the Rust crate does), ignore_merges.
//   - normalizer: null, Prepend, Replace with a String pattern, or a
//     Sequence of those (Llama-2's is Sequence[Prepend("▁"), Replace(" ",
//     "▁")]). Prepend adds nothing to an empty text.
//   - pre_tokenizer: null or Metaspace (replacement, prepend_scheme
//     always / first / never, or the older add_prefix_space; split), also
//     alone in a Sequence. "first" prepends only to the text before the
//     first added token.
//   - decoder: Metaspace, or a Sequence of Replace (String pattern),
//     ByteFallback, Fuse, Strip and Metaspace.
//
// Decode joins the tokens as the decoder says, except that ByteFallback
// keeps the exact bytes of <0xXX> tokens where the Rust crate writes
// U+FFFD for bytes that are not valid UTF-8 (as the byte-level path, so a
// character split over ids decodes the same id by id).

// spmReplacement is SentencePiece's space, U+2581.
const spmReplacement = "\u2581"

// spmConfig is the SentencePiece-style part of a BPETokenizer.
type spmConfig struct {
	norm []normStep
	meta *metaspace // nil: no pre-tokenizer
	dec  []decStep

	byteFallback bool
	unk          int // -1: none
	fuseUnk      bool

	// safeSplit: no vocabulary token holds U+2581 after another
	// character and U+2581 is a token, so no merge crosses the start of a
	// U+2581 run, and words are split there for the cache.
	safeSplit bool
}

// normStep is a Prepend (from "") or a Replace step of a normalizer.
type normStep struct{ from, to string }

type metaspace struct {
	rep   string
	mode  string // "always", "first", "never"
	split bool
}

type decStep struct {
	typ         string // Replace, ByteFallback, Fuse, Strip, Metaspace
	from, to    string
	strip       rune
	start, stop int
	prepend     bool // Metaspace: strips the first token's leading space
}

// setup reads the model's byte tokens and unk, and decides safeSplit.
func (c *spmConfig) setup(t *BPETokenizer, vocab map[string]int, byteFallback bool, unk *string, fuseUnk bool) error {
	c.byteFallback, c.fuseUnk = byteFallback, fuseUnk
	for b := range 256 {
		t.byteID[b] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			t.byteID[b] = id
		}
	}
	if unk != nil {
		id, ok := vocab[*unk]
		if !ok {
			return fmt.Errorf("%w: unk_token %q is not in the vocabulary", ErrTokenizer, *unk)
		}
		c.unk = id
	}
	// Safe only where every U+2581 of every token is in its leading run.
	_, c.safeSplit = vocab[spmReplacement]
	for tok := range vocab {
		if strings.Contains(strings.TrimLeft(tok, spmReplacement), spmReplacement) {
			c.safeSplit = false
			break
		}
	}
	return nil
}

// normalize applies the normalizer.
func (c *spmConfig) normalize(s string) string {
	for _, n := range c.norm {
		if n.from == "" {
			if s != "" {
				s = n.to + s
			}
			continue
		}
		s = strings.ReplaceAll(s, n.from, n.to)
	}
	return s
}

// preTokenize applies the pre-tokenizer to s (first: s starts the text)
// and calls emit with each word, split further where safeSplit allows.
func (c *spmConfig) preTokenize(s string, first bool, emit func(string)) {
	if s == "" {
		return
	}
	if m := c.meta; m != nil {
		s = strings.ReplaceAll(s, " ", m.rep)
		if !strings.HasPrefix(s, m.rep) && (m.mode == "always" || m.mode == "first" && first) {
			s = m.rep + s
		}
		if m.split {
			// MergedWithNext: each replacement starts a word.
			for s != "" {
				skip := 0
				if strings.HasPrefix(s, m.rep) {
					skip = len(m.rep)
				}
				j := strings.Index(s[skip:], m.rep)
				if j < 0 {
					emit(s)
					return
				}
				emit(s[:skip+j])
				s = s[skip+j:]
			}
			return
		}
	}
	if !c.safeSplit {
		emit(s)
		return
	}
	// Split before each U+2581 that follows another character.
	start := 0
	for i := 1; i < len(s); {
		j := strings.Index(s[i:], spmReplacement)
		if j < 0 {
			break
		}
		i += j
		if !strings.HasSuffix(s[:i], spmReplacement) && i > start {
			emit(s[start:i])
			start = i
		}
		i += len(spmReplacement)
	}
	emit(s[start:])
}

// symbols appends w's initial BPE symbols: a character's token, else its
// byte tokens, else unk.
func (c *spmConfig) symbols(t *BPETokenizer, w string, sym []bpeSymbol) []bpeSymbol {
	pendingUnk := false
	flush := func() {
		if pendingUnk {
			sym = append(sym, bpeSymbol{id: int32(c.unk)})
			pendingUnk = false
		}
	}
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		ch := w[i : i+n]
		i += n
		if id, ok := t.vocab[ch]; ok {
			flush()
			sym = append(sym, bpeSymbol{id: int32(id)})
			continue
		}
		if c.byteFallback {
			all := true
			for k := 0; k < len(ch); k++ {
				all = all && t.byteID[ch[k]] >= 0
			}
			if all {
				flush()
				for k := 0; k < len(ch); k++ {
					sym = append(sym, bpeSymbol{id: int32(t.byteID[ch[k]])})
				}
				continue
			}
		}
		if c.unk < 0 {
			continue
		}
		if !c.fuseUnk {
			flush()
		}
		pendingUnk = true
	}
	flush()
	return sym
}

// decode runs the decoder over the tokens of ids; cont (a piece that
// continues a text) keeps what the decoder strips at a text's start.
func (c *spmConfig) decode(t *BPETokenizer, ids []int, cont bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < len(t.pieces) && t.known[id] && !t.special[id] {
			toks = append(toks, string(t.pieces[id]))
		}
	}
	fused := false
	for _, s := range c.dec {
		switch s.typ {
		case "Replace":
			for i := range toks {
				toks[i] = strings.ReplaceAll(toks[i], s.from, s.to)
			}
		case "Metaspace":
			for i := range toks {
				toks[i] = strings.ReplaceAll(toks[i], s.from, s.to)
				if i == 0 && s.prepend && !cont {
					toks[i] = strings.TrimPrefix(toks[i], " ")
				}
			}
		case "ByteFallback":
			toks = byteFallback(toks)
		case "Fuse":
			toks = []string{strings.Join(toks, "")}
			fused = true
		case "Strip":
			for i := range toks {
				start := s.start
				if cont && fused && i == 0 {
					start = 0
				}
				toks[i] = stripRune(toks[i], s.strip, start, s.stop)
			}
		}
	}
	return strings.Join(toks, "")
}

// byteFallback turns each run of <0xXX> tokens into one token of those
// bytes.
func byteFallback(toks []string) []string {
	out := toks[:0]
	var run []byte
	for _, tok := range toks {
		if b, ok := byteToken(tok); ok {
			run = append(run, b)
			continue
		}
		if len(run) > 0 {
			out = append(out, string(run))
			run = run[:0]
		}
		out = append(out, tok)
	}
	if len(run) > 0 {
		out = append(out, string(run))
	}
	return out
}

// byteToken parses a <0xXX> token.
func byteToken(s string) (byte, bool) {
	if len(s) != 6 || !strings.HasPrefix(s, "<0x") || s[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(s[3:5], 16, 8)
	return byte(v), err == nil
}

// stripRune removes up to start leading and stop trailing r.
func stripRune(s string, r rune, start, stop int) string {
	for ; start > 0; start-- {
		c, n := utf8.DecodeRuneInString(s)
		if n == 0 || c != r {
			break
		}
		s = s[n:]
	}
	for ; stop > 0; stop-- {
		c, n := utf8.DecodeLastRuneInString(s)
		if n == 0 || c != r {
			break
		}
		s = s[:len(s)-n]
	}
	return s
}

// DecodePiece returns the text of id as it reads after earlier tokens:
// for the SentencePiece path without the leading space that the decoder
// strips at the start of a text (Decode of "▁Hello" alone is "Hello",
// DecodePiece " Hello"), so the pieces of a generated sequence
// concatenate to its text after a prompt. For the byte-level path it is
// Decode([]int{id}).
func (t *BPETokenizer) DecodePiece(id int) string {
	if t.spm != nil {
		return t.spm.decode(t, []int{id}, true)
	}
	return t.Decode([]int{id})
}
