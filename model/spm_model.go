package model

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// This file reads SentencePiece's tokenizer.model (its ModelProto, the
// file Llama-2 and Mistral checkpoints ship beside or instead of a
// tokenizer.json) with protowire, and turns it into the tokenizer.json
// that Hugging Face's LlamaConverter writes for it, so it takes the
// SentencePiece-style path of spm.go and gives the same ids:
//
//   - vocabulary: every piece, its id its index; merges: for each NORMAL
//     or USER_DEFINED piece, each split into two pieces at a character
//     boundary, ordered by the piece's score (highest first; equal
//     scores by piece id, then by the halves' ids), which is
//     SentencePiece's BPE order (the pair whose merged piece scores
//     highest merges first).
//   - added tokens: CONTROL and UNKNOWN pieces (special: matched in the
//     text, decoded to nothing) and USER_DEFINED pieces (matched in the
//     text, decoded as written), none normalized.
//   - normalizer: Prepend("▁") when add_dummy_prefix, then Replace(" ",
//     "▁"); decoder: Replace("▁", " "), ByteFallback, Fuse, and
//     Strip(" ", 1, 0) when add_dummy_prefix.
//   - model: BPE with trainer_spec's byte_fallback, unk_id as unk_token
//     (fuse_unk, as the converter sets it); BOS and EOS are trainer_spec's
//     bos_id and eos_id (-1: none).
//
// Refused with ErrUnsupported: a model_type other than BPE (Unigram,
// Word, Char: as a tokenizer.json of another model type, LoadTokenizer
// falls back to the byte tokenizer), a normalizer with a
// precompiled_charsmap (NFKC and the like), remove_extra_whitespaces,
// escape_whitespaces false and treat_whitespace_as_suffix.
//
// Where this differs from SentencePiece itself (as the tokenizer.json
// does): control pieces written in the text (<s>) are matched as their
// ids where SentencePiece encodes their characters.

// SentencePiece ModelProto field numbers and piece types
// (sentencepiece_model.proto).
const (
	spmFieldPieces     = 1
	spmFieldTrainer    = 2
	spmFieldNormalizer = 3

	spmPieceText  = 1
	spmPieceScore = 2
	spmPieceType  = 3

	spmTrainerModelType     = 3
	spmTrainerWhitespaceSfx = 24
	spmTrainerByteFallback  = 35
	spmTrainerUnkID         = 40
	spmTrainerBOSID         = 41
	spmTrainerEOSID         = 42

	spmNormName          = 1
	spmNormCharsmap      = 2
	spmNormDummyPrefix   = 3
	spmNormRemoveExtraWS = 4
	spmNormEscapeWS      = 5

	spmNormal      = 1
	spmUnknown     = 2
	spmControl     = 3
	spmUserDefined = 4
	spmUnused      = 5
	spmByte        = 6

	spmModelUnigram = 1
	spmModelBPE     = 2
)

// spmPiece is one piece of a ModelProto.
type spmPiece struct {
	text  string
	score float32
	typ   int
}

// spmModel is the part of a ModelProto read here, with the proto's
// defaults where a field is absent.
type spmModel struct {
	pieces []spmPiece

	modelType          int
	byteFallback       bool
	unk, bos, eos      int
	whitespaceAsSuffix bool

	normName       string
	charsmap       int // bytes of precompiled_charsmap
	dummyPrefix    bool
	removeExtraWS  bool
	escapeWS       bool
	sawTrainerSpec bool
}

// LoadSPModel reads a SentencePiece tokenizer.model (see spm_model.go
// for what of it is supported). Errors name the path and wrap
// ErrTokenizer (a file that is not a readable ModelProto, or pieces and
// ids that do not fit) or ErrUnsupported.
func LoadSPModel(path string) (*BPETokenizer, error) { return loadTokenizerFile(path, parseSPModel) }

func parseSPModel(path string, b []byte) (*BPETokenizer, error) {
	m, err := decodeSPModel(b)
	if err != nil {
		return nil, err
	}
	switch {
	case m.modelType != spmModelBPE:
		name := map[int]string{spmModelUnigram: "Unigram", 3: "Word", 4: "Char"}[m.modelType]
		if name == "" {
			name = fmt.Sprintf("type %d", m.modelType)
		}
		return nil, &notBPEError{path, "SentencePiece " + name}
	case m.charsmap > 0:
		return nil, fmt.Errorf("%w: SentencePiece normalizer %q with a precompiled_charsmap (only identity)", ErrUnsupported, m.normName)
	case m.removeExtraWS:
		return nil, fmt.Errorf("%w: SentencePiece normalizer remove_extra_whitespaces true", ErrUnsupported)
	case !m.escapeWS:
		return nil, fmt.Errorf("%w: SentencePiece normalizer escape_whitespaces false", ErrUnsupported)
	case m.whitespaceAsSuffix:
		return nil, fmt.Errorf("%w: SentencePiece treat_whitespace_as_suffix true", ErrUnsupported)
	case len(m.pieces) == 0:
		return nil, fmt.Errorf("%w: the model has no pieces", ErrTokenizer)
	case len(m.pieces) > 1<<24:
		return nil, fmt.Errorf("%w: %d pieces", ErrTokenizer, len(m.pieces))
	}
	f, err := m.tokenizerJSON()
	if err != nil {
		return nil, err
	}
	t, err := buildBPE(path, f)
	if err != nil {
		return nil, err
	}
	t.bos, t.eos = -1, -1
	for _, s := range []struct {
		name string
		id   int
		dst  *int
	}{{"bos_id", m.bos, &t.bos}, {"eos_id", m.eos, &t.eos}} {
		switch {
		case s.id < 0:
		case s.id >= len(m.pieces):
			return nil, fmt.Errorf("%w: trainer_spec %s %d is past the %d pieces", ErrTokenizer, s.name, s.id, len(m.pieces))
		default:
			*s.dst = s.id
		}
	}
	return t, nil
}

// tokenizerJSON returns the tokenizer.json of m (see spm_model.go).
func (m *spmModel) tokenizerJSON() (*tokenizerJSON, error) {
	f := &tokenizerJSON{}
	f.Model.Type = "BPE"
	f.Model.ByteFallback = m.byteFallback
	f.Model.FuseUnk = true
	f.Model.Vocab = make(map[string]int, len(m.pieces))
	for id, p := range m.pieces {
		if !utf8.ValidString(p.text) || p.text == "" {
			return nil, fmt.Errorf("%w: piece %d %q is empty or not UTF-8", ErrTokenizer, id, p.text)
		}
		if o, dup := f.Model.Vocab[p.text]; dup {
			return nil, fmt.Errorf("%w: pieces %d and %d are both %q", ErrTokenizer, o, id, p.text)
		}
		f.Model.Vocab[p.text] = id
		switch p.typ {
		case spmControl, spmUnknown, spmUserDefined:
			f.AddedTokens = append(f.AddedTokens, addedTokenJSON{ID: id, Content: p.text, Special: p.typ != spmUserDefined})
		case spmNormal, spmUnused, spmByte:
		default:
			return nil, fmt.Errorf("%w: piece %d %q has type %d", ErrTokenizer, id, p.text, p.typ)
		}
	}
	if m.unk >= 0 {
		if m.unk >= len(m.pieces) {
			return nil, fmt.Errorf("%w: trainer_spec unk_id %d is past the %d pieces", ErrTokenizer, m.unk, len(m.pieces))
		}
		unk := m.pieces[m.unk].text
		f.Model.UnkToken = &unk
	}

	// Merges: every split of a mergeable piece into two pieces, in
	// SentencePiece's order.
	type merge struct {
		l, r  string
		score float32
		id    int
		li    int
		ri    int
	}
	var ms []merge
	for id, p := range m.pieces {
		if p.typ != spmNormal && p.typ != spmUserDefined {
			continue
		}
		for i := range p.text { // at each character boundary
			if i == 0 {
				continue
			}
			l, r := p.text[:i], p.text[i:]
			li, okL := f.Model.Vocab[l]
			ri, okR := f.Model.Vocab[r]
			if okL && okR {
				ms = append(ms, merge{l, r, p.score, id, li, ri})
			}
		}
	}
	slices.SortFunc(ms, func(a, b merge) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		if c := cmp.Compare(a.id, b.id); c != 0 {
			return c
		}
		if c := cmp.Compare(a.li, b.li); c != 0 {
			return c
		}
		return cmp.Compare(a.ri, b.ri)
	})
	pairs := make([][2]string, len(ms))
	for i, x := range ms {
		pairs[i] = [2]string{x.l, x.r}
	}
	var err error
	if f.Model.Merges, err = json.Marshal(pairs); err != nil {
		return nil, fmt.Errorf("%w: merges: %v", ErrTokenizer, err)
	}

	// Normalizer and decoder as LlamaConverter writes them.
	replace := func(from, to string) map[string]any {
		return map[string]any{"type": "Replace", "pattern": map[string]any{"String": from}, "content": to}
	}
	norm := []any{replace(" ", spmReplacement)}
	dec := []any{replace(spmReplacement, " "), map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"}}
	if m.dummyPrefix {
		norm = append([]any{map[string]any{"type": "Prepend", "prepend": spmReplacement}}, norm...)
		dec = append(dec, map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0})
	}
	if f.Normalizer, err = json.Marshal(map[string]any{"type": "Sequence", "normalizers": norm}); err != nil {
		return nil, fmt.Errorf("%w: normalizer: %v", ErrTokenizer, err)
	}
	if f.Decoder, err = json.Marshal(map[string]any{"type": "Sequence", "decoders": dec}); err != nil {
		return nil, fmt.Errorf("%w: decoder: %v", ErrTokenizer, err)
	}
	return f, nil
}

// decodeSPModel reads the fields of a ModelProto that spmModel holds;
// fields it does not know are skipped, as protobuf does.
func decodeSPModel(b []byte) (*spmModel, error) {
	m := &spmModel{
		modelType: spmModelUnigram, unk: 0, bos: 1, eos: 2,
		dummyPrefix: true, removeExtraWS: true, escapeWS: true,
	}
	err := walkProto(b, "ModelProto", func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == spmFieldPieces && typ == protowire.BytesType:
			p := spmPiece{typ: spmNormal}
			at := fmt.Sprintf("piece %d", len(m.pieces))
			err := walkProto(v, at, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == spmPieceText && typ == protowire.BytesType:
					p.text = string(v)
				case num == spmPieceScore && typ == protowire.Fixed32Type:
					p.score = math.Float32frombits(uint32(x))
				case num == spmPieceType && typ == protowire.VarintType:
					p.typ = int(int32(x))
				}
				return nil
			})
			m.pieces = append(m.pieces, p)
			return err
		case num == spmFieldTrainer && typ == protowire.BytesType:
			m.sawTrainerSpec = true
			return walkProto(v, "trainer_spec", func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
				if typ != protowire.VarintType {
					return nil
				}
				switch num {
				case spmTrainerModelType:
					m.modelType = int(int32(x))
				case spmTrainerWhitespaceSfx:
					m.whitespaceAsSuffix = x != 0
				case spmTrainerByteFallback:
					m.byteFallback = x != 0
				case spmTrainerUnkID:
					m.unk = int(int32(x))
				case spmTrainerBOSID:
					m.bos = int(int32(x))
				case spmTrainerEOSID:
					m.eos = int(int32(x))
				}
				return nil
			})
		case num == spmFieldNormalizer && typ == protowire.BytesType:
			return walkProto(v, "normalizer_spec", func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == spmNormName && typ == protowire.BytesType:
					m.normName = string(v)
				case num == spmNormCharsmap && typ == protowire.BytesType:
					m.charsmap = len(v)
				case num == spmNormDummyPrefix && typ == protowire.VarintType:
					m.dummyPrefix = x != 0
				case num == spmNormRemoveExtraWS && typ == protowire.VarintType:
					m.removeExtraWS = x != 0
				case num == spmNormEscapeWS && typ == protowire.VarintType:
					m.escapeWS = x != 0
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !m.sawTrainerSpec {
		return nil, fmt.Errorf("%w: not a SentencePiece model: no trainer_spec", ErrTokenizer)
	}
	return m, nil
}

// walkProto calls field with each field of the message b: its number,
// wire type, and its bytes (length-delimited) or value (varint, fixed32,
// fixed64). Groups are skipped. A malformed message is an ErrTokenizer
// naming at and the offset.
func walkProto(b []byte, at string, field func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		if n < 0 {
			return fmt.Errorf("%w: %s: byte %d: bad field tag: %v", ErrTokenizer, at, off, protowire.ParseError(n))
		}
		off += n
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b[off:])
		case protowire.Fixed32Type:
			var y uint32
			y, n = protowire.ConsumeFixed32(b[off:])
			x = uint64(y)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b[off:])
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b[off:])
		default:
			n = protowire.ConsumeFieldValue(num, typ, b[off:])
		}
		if n < 0 {
			return fmt.Errorf("%w: %s: byte %d: field %d: %v", ErrTokenizer, at, off, num, protowire.ParseError(n))
		}
		off += n
		if err := field(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
