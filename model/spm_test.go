package model

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The expected ids and texts of testdata/spm/mistral/cases_*.json come
// from @huggingface/tokenizers (cross-checked with mistral-tokenizer-js),
// not from this package: see testdata/spm/README.md.

const mistralDir = "testdata/spm/mistral"

// spmVariant edits the Mistral file into the form of a cases file, as
// gen.mjs does.
func spmVariant(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(mistralDir, "tokenizer.json")
	replace := map[string]any{"type": "Replace", "pattern": map[string]any{"String": "\u2581"}, "content": " "}
	seq := func(d ...any) map[string]any { return map[string]any{"type": "Sequence", "decoders": d} }
	switch name {
	case "llama2":
		return path
	case "metaspace":
		return editTokenizer(t, path, func(m map[string]any) {
			m["normalizer"] = nil
			m["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false}
			m["decoder"] = seq(replace, map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"}, map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0})
		})
	case "metaspace_always":
		return editTokenizer(t, path, func(m map[string]any) {
			m["normalizer"] = nil
			m["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": false}
			m["decoder"] = seq(map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": false}, map[string]any{"type": "Fuse"})
		})
	}
	t.Fatalf("no variant %q", name)
	return ""
}

var spmVariants = []string{"llama2", "metaspace", "metaspace_always"}

// TestSPMReference: the cut-down Mistral tokenizer, in Llama-2's
// normalizer form and in two Metaspace forms, matches the reference's
// ids and decoded text on every case.
func TestSPMReference(t *testing.T) {
	for _, v := range spmVariants {
		t.Run(v, func(t *testing.T) {
			tok := loadBPE(t, spmVariant(t, v))
			if tok.BOS() != 1 || tok.EOS() != 2 {
				t.Errorf("BOS %d EOS %d, want 1 2 (<s>, </s>)", tok.BOS(), tok.EOS())
			}
			cs := readBPECases(t, filepath.Join(mistralDir, "cases_"+v+".json"))
			checkBPECases(t, tok, cs, false)
		})
	}
}

// spmText is random text for the SentencePiece tests: randomText without
// "<" (no added tokens) and without U+2581 (which decodes to a space).
func spmText(r *rand.Rand, n int) string {
	s := randomText(r, n)
	return strings.NewReplacer("<", "(", "\u2581", "_").Replace(s)
}

// TestSPMRoundTrip: in Llama-2's normalizer form, Decode(Encode(s)) is
// s (the prepended space is stripped) and the pieces of Encode(s)
// concatenate to " " + s, for random UTF-8 and random bytes.
func TestSPMRoundTrip(t *testing.T) {
	tok := loadBPE(t, spmVariant(t, "llama2"))
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 2000 {
		var s string
		if i%2 == 0 {
			s = spmText(r, r.IntN(60))
		} else {
			b := make([]byte, r.IntN(40))
			for j := range b {
				const alphabet = " a1\n\t\xe6\x97\xa5\xf0\x9f\x98\x80\xff\xc3"
				b[j] = alphabet[r.IntN(len(alphabet))]
			}
			s = string(b)
		}
		ids := tok.Encode(s)
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() || id <= 2 {
				t.Fatalf("Encode(%q) gives id %d", s, id)
			}
		}
		if got := tok.Decode(ids); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
		}
		var b strings.Builder
		for _, id := range ids {
			b.WriteString(TokenText(tok, id))
		}
		if want := " " + s; s != "" && b.String() != want {
			t.Fatalf("pieces of %q: %q, want %q", s, b.String(), want)
		}
	}
}

// TestSPMSplit: Metaspace with split true encodes each word (a "▁" and
// what follows up to the next one) on its own; with split false a run of
// spaces can be one token.
func TestSPMSplit(t *testing.T) {
	meta := func(split bool) *BPETokenizer {
		return loadBPE(t, editTokenizer(t, spmVariant(t, "metaspace"), func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": split}
		}))
	}
	split, whole := meta(true), meta(false)
	words := regexp.MustCompile("^[^\u2581]+|\u2581[^\u2581]*")
	r := rand.New(rand.NewPCG(7, 8))
	for range 500 {
		s := spmText(r, r.IntN(40))
		var want []int
		for _, w := range words.FindAllString(strings.ReplaceAll(s, " ", "\u2581"), -1) {
			want = append(want, whole.Encode(w)...)
		}
		if got := split.Encode(s); !slices.Equal(got, want) {
			t.Fatalf("split Encode(%q) = %v, word by word %v", s, got, want)
		}
	}
	// A token of two or more U+2581 (Mistral has them, for indentation).
	hasRun := func(tok *BPETokenizer, ids []int) bool {
		for _, id := range ids {
			if p := TokenText(tok, id); len(p) >= 2 && strings.Trim(p, " ") == "" {
				return true
			}
		}
		return false
	}
	if got := whole.Encode("a    b"); !hasRun(whole, got) {
		t.Errorf("split false: %v has no token of several spaces", got)
	}
	if got := split.Encode("a    b"); hasRun(split, got) {
		t.Errorf("split true: %v has a token of several spaces", got)
	}
}

// TestSPMUnknown: without byte_fallback an unknown character is unk,
// a run of them one unk with fuse_unk, and dropped without unk_token.
func TestSPMUnknown(t *testing.T) {
	base := spmVariant(t, "llama2")
	// "▁x" is 1318 and "▁" 28705 in Mistral's vocabulary; 𝐀 and 𝐁 are
	// not in it (the cases encode them as bytes).
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want []int
	}{
		{"byte fallback", func(map[string]any) {}, []int{28705, 243, 160, 147, 131, 243, 160, 147, 132, 1318}},
		{"fused unk", func(m map[string]any) { modelOf(m)["byte_fallback"] = false }, []int{28705, 0, 1318}},
		{"unk each", func(m map[string]any) { modelOf(m)["byte_fallback"] = false; modelOf(m)["fuse_unk"] = false }, []int{28705, 0, 0, 1318}},
		{"no unk", func(m map[string]any) { modelOf(m)["byte_fallback"] = false; modelOf(m)["unk_token"] = nil }, []int{28705, 1318}},
	} {
		tok := loadBPE(t, editTokenizer(t, base, tc.edit))
		if got := tok.Encode("\U0001d400\U0001d401 x"); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSPMErrors: unsupported SentencePiece-style files fail with the
// path and the reason.
func TestSPMErrors(t *testing.T) {
	base := spmVariant(t, "llama2")
	set := func(key string, v any) func(map[string]any) {
		return func(m map[string]any) { m[key] = v }
	}
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		is   error
		want string
	}{
		{"decoder", set("decoder", map[string]any{"type": "CTC"}), ErrUnsupported, `decoder "CTC"`},
		{"decoder step", set("decoder", map[string]any{"type": "Sequence", "decoders": []any{map[string]any{"type": "Fuse"}, map[string]any{"type": "WordPiece"}}}), ErrUnsupported, `decoder 1: "WordPiece"`},
		{"strip content", set("decoder", map[string]any{"type": "Strip", "content": "ab", "start": 1}), ErrTokenizer, "Strip content"},
		{"normalizer", set("normalizer", map[string]any{"type": "NFKC"}), ErrUnsupported, `normalizer "NFKC"`},
		{"regex replace", set("normalizer", map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": " +"}, "content": "\u2581"}), ErrUnsupported, "Regex"},
		{"pre-tokenizer", set("pre_tokenizer", map[string]any{"type": "Whitespace"}), ErrUnsupported, `pre_tokenizer "Whitespace"`},
		{"prepend scheme", set("pre_tokenizer", map[string]any{"type": "Metaspace", "prepend_scheme": "sometimes"}), ErrUnsupported, "prepend_scheme"},
		{"unk token", func(m map[string]any) { modelOf(m)["unk_token"] = "<nope>" }, ErrTokenizer, `unk_token "<nope>"`},
		{"dropout", func(m map[string]any) { modelOf(m)["dropout"] = 0.1 }, ErrUnsupported, "dropout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := editTokenizer(t, base, tc.edit)
			_, err := LoadBPE(p)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Errorf("error %v: want %v, %q and the path", err, tc.is, tc.want)
			}
		})
	}
}

// TestSPMLoadTokenizer: a checkpoint directory with the Mistral files
// gives the SentencePiece tokenizer, BOS per tokenizer_config.json, and
// pieces that keep the space Decode strips.
func TestSPMLoadTokenizer(t *testing.T) {
	cfg := Config{VocabSize: 32000, BOS: 1, EOS: 2}
	tok, err := LoadTokenizer(mistralDir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 22557 1526 is the reference's "Hello world" (cases_llama2.json).
	if got := PromptIDs(tok, "Hello world"); !slices.Equal(got, []int{1, 22557, 1526}) {
		t.Errorf("PromptIDs = %v, want [1 22557 1526]", got)
	}
	if got := StopIDs(tok, Config{}); !slices.Equal(got, []int{2}) {
		t.Errorf("StopIDs = %v", got)
	}
	if d, p := tok.Decode([]int{1526}), TokenText(tok, 1526); d != "world" || p != " world" {
		t.Errorf("Decode %q, TokenText %q; want \"world\", \" world\"", d, p)
	}
	if p := TokenText(tok, 13); p != "\n" { // <0x0A>
		t.Errorf("TokenText(<0x0A>) = %q", p)
	}

	withConfig := func(conf string) string {
		dir := t.TempDir()
		b, err := os.ReadFile(filepath.Join(mistralDir, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	noBOS, err := LoadTokenizer(withConfig(`{"add_bos_token": false, "bos_token": "<s>"}`), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := PromptIDs(noBOS, "Hello world"); !slices.Equal(got, []int{22557, 1526}) {
		t.Errorf("add_bos_token false: PromptIDs = %v", got)
	}
	// add_bos_token true names the BOS where nothing else does.
	dir := withConfig(`{"add_bos_token": true, "bos_token": {"content": "</s>"}}`)
	if tok, err := LoadTokenizer(dir, Config{VocabSize: 32000, BOS: -1, EOS: -1}); err != nil || tok.BOS() != 1 {
		t.Errorf("file's BOS kept: %v, %v", tok, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), mustEdit(t, func(m map[string]any) { m["post_processor"] = nil; m["added_tokens"] = []any{} }), 0o644); err != nil {
		t.Fatal(err)
	}
	if tok, err := LoadTokenizer(dir, Config{VocabSize: 32000, BOS: -1, EOS: -1}); err != nil || tok.BOS() != 2 {
		t.Errorf("bos_token object: BOS %v, %v; want 2", tok, err)
	}
	for conf, want := range map[string]string{
		`{"add_bos_token": true, "bos_token": "<nope>"}`: `bos_token "<nope>"`,
		`{"add_bos_token": "yes"}`:                       "cannot unmarshal",
	} {
		dir := withConfig(conf)
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), mustEdit(t, func(m map[string]any) { m["post_processor"] = nil; m["added_tokens"] = []any{} }), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadTokenizer(dir, Config{VocabSize: 32000, BOS: -1, EOS: -1}); !errors.Is(err, ErrTokenizer) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "tokenizer_config.json") {
			t.Errorf("%s: %v", conf, err)
		}
	}
}

// mustEdit returns the Mistral tokenizer.json changed by edit.
func mustEdit(t *testing.T, edit func(map[string]any)) []byte {
	b, err := os.ReadFile(editTokenizer(t, filepath.Join(mistralDir, "tokenizer.json"), edit))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzSPM: Encode never panics, gives ids in range, and round-trips
// text without added tokens or U+2581 in the normalizer form.
func FuzzSPM(f *testing.F) {
	tok := loadBPE(f, spmVariant(f, "llama2"))
	for _, c := range readBPECases(f, filepath.Join(mistralDir, "cases_llama2.json")) {
		f.Add(c.Text)
	}
	f.Add("\xff\xfe a\x80b \xe6\x97")
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("Encode(%q) gives id %d", s, id)
			}
		}
		if strings.Contains(s, "<") || strings.Contains(s, "\u2581") {
			return
		}
		if got := tok.Decode(ids); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
	})
}
