package completion

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestDecodeRequest: the strict decoder reads every field of the API
// and the quest object.
func TestDecodeRequest(t *testing.T) {
	body := `{"model": "m", "prompt": "caf\u00e9 \ud83d\ude00", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
		"seed": -3, "stop": ["\n", "END"], "stream": true, "stream_options": {"include_usage": true}, "n": 1, "user": "u",
		"quest": {"budget": 64, "selector": "dense", "gqa": "group_max", "sink": 0, "local": 1, "dense_layers": 2}}`
	req, err := decodeRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	i := func(v int) *int { return &v }
	f := func(v float64) *float64 { return &v }
	seed := int64(-3)
	want := &CompletionRequest{Model: "m", Prompt: &Prompt{Text: "café 😀"}, MaxTokens: i(5), Temperature: f(0.5), TopP: f(0.9),
		Seed: &seed, Stop: []string{"\n", "END"}, Stream: true, StreamOptions: &StreamOptions{IncludeUsage: true}, N: i(1), User: "u",
		Quest: &QuestOptions{Budget: i(64), Selector: "dense", GQA: "group_max", Sink: i(0), Local: i(1), DenseLayers: i(2)}}
	if !reflect.DeepEqual(req, want) {
		t.Fatalf("decoded %+v\nwant %+v", req, want)
	}
	req, err = decodeRequest([]byte(`{"model": "m", "prompt": [256, 1, 2], "stop": "x", "max_tokens": null, "quest": null}`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(req.Prompt.IDs, []int{256, 1, 2}) || !reflect.DeepEqual(req.Stop, []string{"x"}) || req.MaxTokens != nil || req.Quest != nil {
		t.Fatalf("decoded %+v", req)
	}
}

// TestMarshalRequest: a CompletionRequest marshals to the JSON the
// server reads back into an equal request: a batch of prompts (strings
// or token ids) as the array prompt, a single prompt as a string or ids.
func TestMarshalRequest(t *testing.T) {
	n, maxTokens, seed := 2, 8, int64(-1)
	for _, req := range []*CompletionRequest{
		{Model: "m", Prompts: []Prompt{{Text: "a"}, {Text: "The rain"}}, N: &n, MaxTokens: &maxTokens, Seed: &seed, Echo: true},
		{Model: "m", Prompts: []Prompt{{IDs: []int{256, 1, 2}}, {IDs: []int{256}}}, Stop: []string{"x"}},
		{Model: "m", Prompts: []Prompt{{Text: "one"}}},
		{Model: "m", Prompt: &Prompt{Text: "single"}, Stream: true, StreamOptions: &StreamOptions{IncludeUsage: true}},
		{Model: "m", Prompt: &Prompt{IDs: []int{1, 2}}, Quest: &QuestOptions{Selector: "dense"}},
	} {
		for _, v := range []any{req, *req} {
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			got, aerr := decodeRequest(b)
			if aerr != nil {
				t.Fatalf("%s: %v", b, aerr)
			}
			if !reflect.DeepEqual(got, req) {
				t.Errorf("%s decoded to %+v, want %+v", b, got, req)
			}
		}
	}
	b, err := json.Marshal(CompletionRequest{Model: "m", Prompts: []Prompt{{Text: "a"}, {IDs: []int{3}}}})
	if want := `{"model":"m","prompt":["a",[3]]}`; err != nil || string(b) != want {
		t.Errorf("marshalled %s (%v), want %s", b, err, want)
	}
}

// TestCheckJSONString: escaped surrogates must pair; other escapes
// and literal characters pass.
func TestCheckJSONString(t *testing.T) {
	for s, ok := range map[string]bool{
		`"plain"`:            true,
		`"\ud83d\ude00"`:     true,
		`"\\ud800"`:          true, // an escaped backslash, then text
		`"a\"\ud800"`:        false,
		`"\ud800"`:           false,
		`"\ud800\u0041"`:     false,
		`"\ude00"`:           false,
		`"\u00e9\n\t\u0000"`: true,
		"\"\xff\"":           false,
		`"\uD83D\uDE00"`:     true,
	} {
		if err := checkJSONString([]byte(s)); (err == nil) != ok {
			t.Errorf("%s: %v, want ok %v", s, err, ok)
		}
	}
}

// TestStopText: stop strings spanning tokens are found, the text before
// them released, partial matches and partial characters held back.
func TestStopText(t *testing.T) {
	for _, c := range []struct {
		stops  []string
		tokens []string
		want   []string // released after each token
		stop   int      // index of the token that stops (-1: none)
	}{
		{nil, []string{"ab", "c"}, []string{"ab", "c"}, -1},
		{[]string{"END"}, []string{"xE", "N", "Dy"}, []string{"x", "", ""}, 2},
		{[]string{"END"}, []string{"xE", "Nq"}, []string{"x", "ENq"}, -1},
		{[]string{"\n\n", "##"}, []string{"a\n", "#", "#b"}, []string{"a", "\n", ""}, 2},
		{[]string{"bc", "abcd"}, []string{"abcd"}, []string{"a"}, 0},
		{[]string{"cd", "abcd"}, []string{"abcd"}, []string{""}, 0},
		{nil, []string{"caf\xc3", "\xa9!"}, []string{"caf", "é!"}, -1},
		{nil, []string{"\xf0\x9f", "\x98", "\x80x"}, []string{"", "", "😀x"}, -1},
		{[]string{"é"}, []string{"caf\xc3", "\xa9!"}, []string{"caf", ""}, 1},
	} {
		st := newStopText(c.stops)
		stopped := -1
		for i, tk := range c.tokens {
			out, s := st.add(tk)
			if string(out) != c.want[i] {
				t.Errorf("stops %q tokens %q: after %d released %q, want %q", c.stops, c.tokens, i, out, c.want[i])
			}
			if s {
				stopped = i
				break
			}
		}
		if stopped != c.stop {
			t.Errorf("stops %q tokens %q: stopped at %d, want %d", c.stops, c.tokens, stopped, c.stop)
		}
	}
}

// TestStopTextProperty: over random texts, token splits and stop
// strings, the released text is the text cut before the first stop
// string that occurs in it (all of it when none does), and every piece
// of valid UTF-8 input is released whole-character.
func TestStopTextProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "\n", "é", "😀", "ab"}
	pick := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 5000 {
		text := pick(rng.IntN(30))
		var stops []string
		for range rng.IntN(3) {
			stops = append(stops, pick(1+rng.IntN(3)))
		}
		// The reference: the first byte at which a stop string ends
		// cuts the text where it starts (the longest of those ending
		// there).
		want, wantStop := text, false
	scan:
		for e := 1; e <= len(text); e++ {
			cut := -1
			for _, s := range stops {
				if strings.HasSuffix(text[:e], s) && (cut < 0 || e-len(s) < cut) {
					cut = e - len(s)
				}
			}
			if cut >= 0 {
				want, wantStop = text[:cut], true
				break scan
			}
		}
		// Split at random byte offsets (tokens may split characters).
		st := newStopText(stops)
		var got strings.Builder
		stopped := false
		for rest := text; rest != "" && !stopped; {
			n := 1 + rng.IntN(min(len(rest), 5))
			out, s := st.add(rest[:n])
			rest = rest[n:]
			if !utf8.Valid(out) {
				t.Fatalf("text %q stops %q: released %q, not whole characters", text, stops, out)
			}
			got.Write(out)
			stopped = s
		}
		if !stopped {
			got.Write(st.flush())
		}
		if got.String() != want || stopped != wantStop {
			t.Fatalf("text %q stops %q: released %q (stopped %v), want %q (%v)", text, stops, got.String(), stopped, want, wantStop)
		}
	}
}

// FuzzDecodeRequest: the decoder never panics; what it accepts has
// valid UTF-8 strings and decodes the same after a round trip through
// its own JSON.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model": "m", "prompt": "x"}`,
		`{"model": "m", "prompt": [1, 2], "stop": ["a"], "quest": {"budget": 32}}`,
		`{"model": "m", "prompt": "\ud800"}`,
		`{"model": "m", "prompt": "x", "stream": true, "stream_options": {"include_usage": false}}`,
		`{"a": 1, "a": 2}`,
		`[`, `{}`, `{"logit_bias": {}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodeRequest(b)
		if err != nil {
			if err.status != 400 || err.message == "" {
				t.Fatalf("error %+v", err)
			}
			return
		}
		strs := append([]string{req.Model, req.User}, req.Stop...)
		if req.Prompt != nil {
			strs = append(strs, req.Prompt.Text)
		}
		// U+FFFD only where the body wrote it (decoding replaces bad
		// UTF-8 and lone surrogates with it: those must be refused).
		fffd := strings.Contains(string(b), "\ufffd") || strings.Contains(strings.ToLower(string(b)), `\ufffd`)
		for _, s := range strs {
			if !utf8.ValidString(s) || (strings.ContainsRune(s, utf8.RuneError) && !fffd) {
				t.Fatalf("accepted %q with string %q", b, s)
			}
		}
		again, err2 := json.Marshal(req)
		if err2 != nil {
			t.Fatal(err2)
		}
		req2, err := decodeRequest(again)
		if err != nil {
			t.Fatalf("round trip of %s: %v", again, err)
		}
		if !reflect.DeepEqual(req, req2) {
			t.Fatalf("round trip: %+v, then %+v", req, req2)
		}
	})
}

// TestPromptIDsFastPath: arrays of ids decode as before through the
// fast path, and what it must not take (null, fractions, exponents,
// strings, overflow) is refused naming the element, as before.
func TestPromptIDsFastPath(t *testing.T) {
	for _, c := range []struct {
		raw  string
		ids  []int
		fail string
	}{
		{raw: `[1, 2, 3]`, ids: []int{1, 2, 3}},
		{raw: `[]`, ids: []int{}},
		{raw: `[-1]`, ids: []int{-1}},
		{raw: `[1, null]`, fail: "element 1"},
		{raw: `[1, 2.5]`, fail: "prompt"},
		{raw: `[1, 1e3]`, fail: "prompt"},
		{raw: `[1, "2"]`, fail: "element 1"},
		{raw: `[99999999999999999999]`, fail: "prompt"},
	} {
		p, err := prompt([]byte(c.raw))
		if c.fail != "" {
			if err == nil || !strings.Contains(err.message, c.fail) {
				t.Errorf("%s: %+v, %v; want an error naming %q", c.raw, p, err, c.fail)
			}
			continue
		}
		if err != nil || !slices.Equal(p.IDs, c.ids) || p.IDs == nil {
			t.Errorf("%s: %+v, %v; want %v", c.raw, p, err, c.ids)
		}
	}
}
