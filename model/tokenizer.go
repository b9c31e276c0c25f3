package model

import (
	"fmt"
	"strings"
)

// Tokenizer turns text into token ids and back. Implementations are safe
// for concurrent use.
type Tokenizer interface {
	// Encode returns the ids of text, without BOS or EOS.
	Encode(text string) []int
	// Decode returns the text of ids; special tokens decode to nothing.
	Decode(ids []int) string
	// BOS and EOS are the special ids (-1: none).
	BOS() int
	EOS() int
	// VocabSize is one past the largest id.
	VocabSize() int
}

// ByteTokenizer is the tokenizer of the passkey test models: ids 0-255 are
// the bytes of the UTF-8 text, 256 is BOS and 257 is EOS (vocabularies may
// be padded past 258; such ids decode to nothing).
type ByteTokenizer struct {
	Vocab int // vocabulary size, at least 258
}

// Byte-tokenizer special ids.
const (
	ByteBOS = 256
	ByteEOS = 257
)

// NewByteTokenizer checks that cfg is a byte-level model (vocabulary of
// at least 258, BOS 256, EOS 257 where given) and returns its tokenizer.
func NewByteTokenizer(cfg Config) (*ByteTokenizer, error) {
	if cfg.VocabSize < 258 {
		return nil, fmt.Errorf("%w: vocabulary of %d is too small for the byte tokenizer (needs 258)", ErrUnsupported, cfg.VocabSize)
	}
	if (cfg.BOS != -1 && cfg.BOS != ByteBOS) || (cfg.EOS != -1 && cfg.EOS != ByteEOS) {
		return nil, fmt.Errorf("%w: bos %d / eos %d are not the byte tokenizer's %d / %d", ErrUnsupported, cfg.BOS, cfg.EOS, ByteBOS, ByteEOS)
	}
	return &ByteTokenizer{Vocab: cfg.VocabSize}, nil
}

// Encode returns the bytes of text.
func (t *ByteTokenizer) Encode(text string) []int {
	ids := make([]int, len(text))
	for i := range len(text) {
		ids[i] = int(text[i])
	}
	return ids
}

// Decode returns the bytes of the ids below 256 as a string.
func (t *ByteTokenizer) Decode(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		if id >= 0 && id < 256 {
			b.WriteByte(byte(id))
		}
	}
	return b.String()
}

// BOS returns 256.
func (t *ByteTokenizer) BOS() int { return ByteBOS }

// EOS returns 257.
func (t *ByteTokenizer) EOS() int { return ByteEOS }

// VocabSize returns the model's vocabulary size.
func (t *ByteTokenizer) VocabSize() int { return t.Vocab }

// PromptIDs returns the ids a prompt is prefilled with: tok's BOS (where
// it has one) followed by the ids of text.
func PromptIDs(tok Tokenizer, text string) []int {
	ids := tok.Encode(text)
	if tok.BOS() < 0 {
		return ids
	}
	return append([]int{tok.BOS()}, ids...)
}

// StopIDs returns the ids that end generation: cfg's EOS list where the
// config gives one, else tok's EOS (none when it has none).
func StopIDs(tok Tokenizer, cfg Config) []int {
	if len(cfg.EOSList) > 0 {
		return append([]int(nil), cfg.EOSList...)
	}
	if tok.EOS() < 0 {
		return nil
	}
	return []int{tok.EOS()}
}

// PieceDecoder is implemented by tokenizers whose Decode of a whole
// sequence is not the concatenation of its ids' Decode: SentencePiece
// decoders strip the space that starts a text, so "▁there" alone decodes
// to "there". DecodePiece returns id's text as it reads after earlier
// tokens (" there").
type PieceDecoder interface {
	DecodePiece(id int) string
}

// TokenText returns the text of id as it reads after earlier tokens,
// for streaming generated tokens one at a time: tok's DecodePiece where
// it has one, else tok.Decode([]int{id}).
func TokenText(tok Tokenizer, id int) string {
	if p, ok := tok.(PieceDecoder); ok {
		return p.DecodePiece(id)
	}
	return tok.Decode([]int{id})
}
