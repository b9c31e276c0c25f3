package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// small is a valid case: 2 tokens, one page, K = 2 pages.
const small = `{"page_size": 16, "budget_tokens": 32, "q_heads": 2, "kv_heads": 1, "head_dim": 2,
 "keys": [[[1, 2], [3, 4]]], "values": [[[1, 2], [3, 4]]], "query": [[1, 2], [3, 4]]}`

// advHead opens a case whose keys are [1 head][many tokens][1 dim].
const advHead = `{"page_size":1,"budget_tokens":1,"q_heads":1,"kv_heads":1,"head_dim":1,"keys":[[[1]`

// repeatReader yields head, then unit forever (or until n bytes when n > 0),
// counting what it gave.
type repeatReader struct {
	head, unit []byte
	n, read    int64
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n > 0 && r.read >= r.n {
		return 0, io.EOF
	}
	k := 0
	for k < len(p) && (r.n <= 0 || r.read < r.n) {
		var c byte
		if r.read < int64(len(r.head)) {
			c = r.head[r.read]
		} else {
			c = r.unit[(r.read-int64(len(r.head)))%int64(len(r.unit))]
		}
		p[k] = c
		k++
		r.read++
	}
	return k, nil
}

// TestDecodeLimitBoundsInput: an endless case (keys of one-number rows,
// "[1]," forever; before, Decode read it until the Go runtime died out of
// memory) is refused after InputLimit bytes with one line that says the
// bound and wraps ErrTooLarge, having read at most one byte more and
// allocated less than the limit. Inputs of exactly the bound are read.
func TestDecodeLimitBoundsInput(t *testing.T) {
	const limit = 64 << 20
	n, _, err := InputLimit(limit)
	if err != nil || n != limit/InputShare {
		t.Fatalf("InputLimit(64 MiB) = %d, %v; want %d", n, err, limit/InputShare)
	}
	r := &repeatReader{head: []byte(advHead), unit: []byte(",[1]")}
	var c *Case
	got := allocated(func() { c, err = DecodeLimit(r, limit) })
	want := fmt.Sprintf("replay case: case file is larger than %d bytes", n)
	if c != nil || !errors.Is(err, memlimit.ErrTooLarge) || !strings.HasPrefix(err.Error(), want) ||
		!strings.Contains(err.Error(), "--max-memory") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("endless input: %v, want one line starting %q, naming --max-memory", err, want)
	}
	if r.read > n+1 {
		t.Errorf("read %d bytes of an endless input, the bound is %d", r.read, n)
	}
	if got > limit {
		t.Errorf("allocated %s before refusing, more than the %s limit", memlimit.Bytes(int64(got)), memlimit.Bytes(limit))
	}
	t.Logf("refused after %d bytes, allocated %s (%.1f bytes a byte of input)", r.read, memlimit.Bytes(int64(got)), float64(got)/float64(r.read))

	// A valid case padded with white space to exactly the bound is read;
	// one more byte is refused.
	pad := func(extra int64) []byte {
		b := []byte(small)
		return append(b, bytes.Repeat([]byte{' '}, int(n+extra)-len(b))...)
	}
	if _, err := DecodeLimit(bytes.NewReader(pad(0)), limit); err != nil {
		t.Errorf("an input of exactly %d bytes: %v", n, err)
	}
	if _, err := DecodeLimit(bytes.NewReader(pad(1)), limit); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Errorf("an input of %d bytes: %v, want the size refusal", n+1, err)
	}
}

// TestInputLimit: the bound is 1/32 of the limit, of the memory available
// when that is lower (or with Auto), at most MaxCaseBytes; -1 gives the
// cap; below -1 is an error. The available memory is a fixed figure here:
// the machine's changes between two readings (a CI run once read 150 KB
// less in the test than InputLimit had).
func TestInputLimit(t *testing.T) {
	unknown := errors.New("no /proc/meminfo")
	for _, tc := range []struct {
		limit, avail int64
		availErr     error
		want         int64
		why          string
	}{
		{1 << 20, 1 << 40, nil, 1 << 15, "memory limit"},
		{1 << 20, 1 << 16, nil, 1 << 11, "available"},
		{1 << 20, 0, unknown, 1 << 15, "memory limit"},
		{31, 1 << 40, nil, 0, "memory limit"},
		{memlimit.Auto, 24013803520, nil, 24013803520 / 32, "available"},
		{memlimit.Auto, 0, unknown, MaxCaseBytes, "cap"},
		{memlimit.Auto, 32 * MaxCaseBytes, nil, MaxCaseBytes, "cap"},
		{1 << 62, 24013803520, nil, 24013803520 / 32, "available"},
		{1 << 62, 0, unknown, MaxCaseBytes, "cap"},
		{memlimit.NoLimit, 1 << 16, nil, MaxCaseBytes, "cap"},
	} {
		avail := func() (int64, error) { return tc.avail, tc.availErr }
		n, why, err := inputLimit(tc.limit, avail)
		if err != nil || n != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("limit %d, available %d (%v): %d, %q, %v; want %d and %q", tc.limit, tc.avail, tc.availErr, n, why, err, tc.want, tc.why)
		}
	}
	// The machine's own reading: in range.
	for _, limit := range []int64{memlimit.Auto, 1 << 62} {
		if n, why, err := InputLimit(limit); err != nil || n < 0 || n > MaxCaseBytes || why == "" {
			t.Errorf("InputLimit(%d) = %d, %q, %v", limit, n, why, err)
		}
	}
	if _, _, err := InputLimit(-2); err == nil || !strings.HasPrefix(err.Error(), "replay case") {
		t.Errorf("InputLimit(-2): %v", err)
	}
}

// adversarial builds an input of at most n bytes: head, unit repeated,
// tail.
func adversarial(head, unit, tail string, n int64) []byte {
	k := (int(n) - len(head) - len(tail)) / len(unit)
	b := make([]byte, 0, n)
	b = append(b, head...)
	b = append(b, bytes.Repeat([]byte(unit), k)...)
	return append(b, tail...)
}

// TestDecodeMemoryWithinLimit: the inputs that cost the most memory per
// byte (rows of one number, empty rows, empty heads, long one-row
// tensors, a long string, a long number) just under the bound make
// DecodeLimit allocate, in all (an upper bound of its peak), less than
// half the memory limit. Before, a 32 MB file of one-number rows peaked
// at 566 MiB to 794 MiB of RSS.
func TestDecodeMemoryWithinLimit(t *testing.T) {
	const limit = 64 << 20
	n, _, err := InputLimit(limit)
	if err != nil {
		t.Fatal(err)
	}
	const geom = `{"page_size":1,"budget_tokens":1,"q_heads":1,"kv_heads":1,"head_dim":1,`
	for _, tc := range []struct {
		name, head, unit, tail string
	}{
		{"one-number rows", geom + `"keys":[[`, `[1],`, `[1]]],"values":[[[1]]],"query":[[1]]}`},
		{"empty rows", geom + `"keys":[[`, `[],`, `[]]],"values":[[[1]]],"query":[[1]]}`},
		{"empty heads", geom + `"keys":[`, `[],`, `[]],"values":[[[1]]],"query":[[1]]}`},
		{"empty query rows", geom + `"keys":[[[1]]],"values":[[[1]]],"query":[`, `[],`, `[]]}`},
		{"one long row", geom + `"keys":[[[`, `1,`, `1]]],"values":[[[1]]],"query":[[1]]}`},
		{"long string", geom + `"gqa":"`, `x`, `"}`},
		{"long number", geom + `"query":[[1`, `0`, `]]}`},
		{"white space", geom, ` `, `}`},
	} {
		in := adversarial(tc.head, tc.unit, tc.tail, n)
		var c *Case
		got := allocated(func() { c, err = DecodeLimit(bytes.NewReader(in), limit) })
		if errors.Is(err, memlimit.ErrTooLarge) {
			t.Fatalf("%s: %d bytes refused as too large: %v", tc.name, len(in), err)
		}
		if err == nil && c.Tokens() == 0 {
			t.Fatalf("%s: accepted with no tokens", tc.name)
		}
		if got > limit/2 {
			t.Errorf("%s: allocated %s decoding %s, more than half the %s limit", tc.name,
				memlimit.Bytes(int64(got)), memlimit.Bytes(int64(len(in))), memlimit.Bytes(limit))
		}
		t.Logf("%s: %s of input, allocated %s (%.1f bytes a byte); %v", tc.name, memlimit.Bytes(int64(len(in))),
			memlimit.Bytes(int64(got)), float64(got)/float64(len(in)), err)
	}
}

// TestDecodeStrict: null anywhere, a field name in another case and a
// field given twice are refused with one line naming the field (before,
// encoding/json read null as 0, matched "Page_Size" to page_size and kept
// the last of duplicate fields); so is the rest of what encoding/json
// would refuse.
func TestDecodeStrict(t *testing.T) {
	if _, err := Decode(strings.NewReader(small)); err != nil {
		t.Fatalf("the base case: %v", err)
	}
	edit := func(old, new string) string {
		if !strings.Contains(small, old) {
			t.Fatalf("%q is not in the base case", old)
		}
		return strings.Replace(small, old, new, 1)
	}
	for _, tc := range []struct {
		in, want string
	}{
		{edit(`"query": [[1, 2]`, `"query": [[null, 2]`), "query[0][0] is null"},
		{edit(`"keys": [[[1, 2]`, `"keys": [[[1, null]`), "keys[0][0][1] is null"},
		{edit(`"values": [[[1, 2], [3, 4]]]`, `"values": [[[1, 2], null]]`), "values[0][1] is null"},
		{edit(`"values": [[[1, 2], [3, 4]]]`, `"values": [null]`), "values[0] is null"},
		{edit(`"values": [[[1, 2], [3, 4]]]`, `"values": null`), "values is null"},
		{edit(`"page_size": 16`, `"page_size": null`), "page_size is null"},
		{edit(`"page_size": 16`, `"page_size": 16, "gqa": null`), "gqa is null"},
		{edit(`"page_size": 16`, `"page_size": 16, "sink_pages": null`), "sink_pages is null"},
		{edit(`"page_size": 16`, `"page_size": 16, "Page_Size": 2`), `unknown field "Page_Size"`},
		{edit(`"page_size": 16`, `"PAGE_SIZE": 16`), `unknown field "PAGE_SIZE"`},
		{edit(`"query"`, `"Query"`), `unknown field "Query"`},
		{edit(`"page_size": 16`, `"page_size": 16, "page_size": 2`), `duplicate field "page_size"`},
		{edit(`"page_size": 16`, `"page_size": 16, "page\u005fsize": 2`), `duplicate field "page_size"`},
		{edit(`"query": [[1, 2], [3, 4]]`, `"query": [[1, 2], [3, 4]], "query": [[1, 2], [3, 4]]`), `duplicate field "query"`},
		{edit(`"keys"`, `"keys": [], "keys"`), `duplicate field "keys"`},
		{edit(`"page_size": 16`, `"page_size": 16.0`), "page_size 16.0"},
		{edit(`"page_size": 16`, `"page_size": 1e1`), "page_size 1e1"},
		{edit(`"page_size": 16`, `"page_size": 99999999999999999999`), "page_size 99999999999999999999"},
		{edit(`"page_size": 16`, `"page_size": "16"`), "page_size: want an integer, found a string"},
		{edit(`"page_size": 16`, `"page_size": 16, "gqa": 1`), "gqa: want a string, found a number"},
		{edit(`"query": [[1, 2]`, `"query": [[1e39, 2]`), "query[0][0]: 1e39"},
		{edit(`"query": [[1, 2]`, `"query": [[01, 2]`), `query[0][0]: malformed number "01"`},
		{edit(`"query": [[1, 2]`, `"query": [[NaN, 2]`), "query[0][0]: want a number"},
		{edit(`"query": [[1, 2]`, `"query": [[true, 2]`), "query[0][0]: want a number, found a boolean"},
		{edit(`"query": [[1, 2]`, `"query": [[[1], 2]`), "query[0][0]: want a number, found an array"},
		{edit(`"query": [[1, 2]`, `"query": [[1, 2,]`), "query[0][2]: want a number"},
		{edit(`"query": [[1, 2]`, `"query": [{"a": 1}`), "query[0]: want a row of numbers, found an object"},
		{edit(`"keys": [[[1, 2], [3, 4]]]`, `"keys": [[1, 2]]`), "keys[0][0]: want a row of numbers, found a number"},
		{edit(`"keys": [[[1, 2], [3, 4]]]`, `"keys": {}`), "keys: want an array"},
		{small + ` {}`, "trailing data"},
		{small + ` ]`, "trailing data"},
		{strings.TrimSuffix(small, "}"), "unexpected end of input"},
		{small[:len(small)/2], "unexpected end of input"},
		{"", "unexpected end of input"},
		{"null", "the case is null"},
		{"[]", "want a JSON object"},
		{"\ufeff" + small, "want a JSON object"},
		{edit(`"page_size": 16`, `"page_size": 16,`), "want a field name"},
		{edit(`"page_size": 16`, `"bugdet": 16`), `unknown field "bugdet"`},
		{edit(`"page_size": 16`, "\"page_size\": 16, \"gqa\": \"a\tb\""), "gqa: control character"},
		{edit(`"page_size": 16`, `"page_size": 16, "gqa": "\x"`), "gqa: bad string"},
	} {
		c, err := Decode(strings.NewReader(tc.in))
		if err == nil {
			t.Errorf("%.120q: accepted (page_size %d)", tc.in, c.PageSize)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "replay case: ") || strings.Contains(msg, "\n") || !strings.Contains(msg, tc.want) {
			t.Errorf("%.120q: error %q, want one 'replay case' line containing %q", tc.in, msg, tc.want)
		}
	}
}

// TestDecodeAgreesWithEncodingJSON: what the decoder accepts, encoding/json
// (with DisallowUnknownFields) reads to the same case: escapes, white
// space, number forms, fields in any order or left out.
func TestDecodeAgreesWithEncodingJSON(t *testing.T) {
	var gen bytes.Buffer
	if err := Generate(GenConfig{Tokens: 37, PageSize: 4, BudgetTokens: 12, QHeads: 6, KVHeads: 3, HeadDim: 5, GQA: "per_head", SinkPages: 1, LocalPages: 2, Seed: 2}).Encode(&gen); err != nil {
		t.Fatal(err)
	}
	marshal, _ := json.Marshal(Generate(GenConfig{Tokens: 5, PageSize: 2, BudgetTokens: 4, QHeads: 2, KVHeads: 1, HeadDim: 3, Seed: 4}))
	for _, in := range []string{
		small,
		gen.String(),
		string(marshal),
		"\r\n\t " + strings.ReplaceAll(small, ",", " \n,\t") + " \n",
		`{"page\u005fsize":16,"budget_tokens":32,"gqa":"per\u005fhead","q_heads":1,"kv_heads":1,"head_dim":1,` +
			`"keys":[[[1E2]]],"values":[[[-0]]],"query":[[1e-60]]}`,
		`{"query":[[0.5,-2.5e+3]],"values":[[[1.5e-7,3]]],"keys":[[[-1.25,2E-2]]],"head_dim":2,"kv_heads":1,"q_heads":1,"local_pages":1,"sink_pages":0,"budget_tokens":1,"page_size":1,"gqa":""}`,
		`{"page_size":1,"budget_tokens":1,"q_heads":1,"kv_heads":1,"head_dim":1,"keys":[[[3.4028234e38]]],"values":[[[1.4e-45]]],"query":[[-0.0]]}`,
	} {
		got, err := Decode(strings.NewReader(in))
		if err != nil {
			t.Fatalf("%.200q: %v", in, err)
		}
		var want Case
		dec := json.NewDecoder(strings.NewReader(in))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("%.200q: encoding/json: %v", in, err)
		}
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(&want)
		if !bytes.Equal(a, b) {
			t.Fatalf("%.200q: decoded\n%s\nencoding/json reads\n%s", in, a, b)
		}
	}
}

// TestValidateOrder: with both keys and values bad, the error names keys,
// every time (before, Validate ranged over a map: keys in some runs,
// values in others); a token count that differs names both tensors.
func TestValidateOrder(t *testing.T) {
	row := []float32{1}
	for _, tc := range []struct {
		name         string
		keys, values [][][]float32
		want         string
	}{
		{"heads", [][][]float32{{row}, {row}}, [][][]float32{{row}, {row}, {row}}, "keys has 2 heads, want kv_heads 1"},
		{"rows", [][][]float32{{{1, 2}}}, [][][]float32{{{1, 2, 3}}}, "keys[0][0]: 2 values, want head_dim 1"},
		{"values tokens", [][][]float32{{row, row, row}}, [][][]float32{{row}}, "values head 0 has 1 tokens, keys head 0 has 3"},
	} {
		for range 64 {
			c := &Case{PageSize: 1, BudgetTokens: 1, QHeads: 1, KVHeads: 1, HeadDim: 1, Keys: tc.keys, Values: tc.values, Query: [][]float32{row}}
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s: %v, want %q", tc.name, err, tc.want)
			}
		}
	}
	c := &Case{PageSize: 1, BudgetTokens: 1, QHeads: 2, KVHeads: 2, HeadDim: 1,
		Keys: [][][]float32{{row, row}, {row}}, Values: [][][]float32{{row, row}, {row, row}}, Query: [][]float32{row, row}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "keys head 1 has 1 tokens, keys head 0 has 2") {
		t.Fatalf("keys head 1: %v", err)
	}
}

// TestForcedPagesWithinBudget: sink_pages + local_pages above K = B/S is
// refused with one line naming both fields and K, huge values included
// (before, the forced pages were all read, beyond the budget); at K the
// case runs and reads K pages per KV head. GenConfig refuses the same.
func TestForcedPagesWithinBudget(t *testing.T) {
	base := GenConfig{Tokens: 256, PageSize: 16, BudgetTokens: 64, QHeads: 4, KVHeads: 2, HeadDim: 16, Seed: 1} // K = 4
	for _, sl := range [][2]int{{3, 3}, {5, 0}, {0, 5}, {100, 0}, {math.MaxInt, 0}, {math.MaxInt, math.MaxInt}, {1, math.MaxInt}} {
		g := base
		g.SinkPages, g.LocalPages = sl[0], sl[1]
		err := g.Check(memlimit.NoLimit)
		if err == nil || !strings.Contains(err.Error(), "--sink-pages") || !strings.Contains(err.Error(), "--local-pages") || !strings.Contains(err.Error(), "K = 4") {
			t.Errorf("gen sink %d local %d: %v", sl[0], sl[1], err)
		}
		c := Generate(base)
		c.SinkPages, c.LocalPages = sl[0], sl[1]
		err = c.Validate()
		if err == nil || !strings.Contains(err.Error(), "sink_pages") || !strings.Contains(err.Error(), "local_pages") || !strings.Contains(err.Error(), "K = 4") {
			t.Errorf("case sink %d local %d: %v", sl[0], sl[1], err)
		}
	}
	for _, sl := range [][2]int{{4, 0}, {0, 4}, {2, 2}, {1, 3}} {
		g := base
		g.SinkPages, g.LocalPages = sl[0], sl[1]
		if err := g.Check(memlimit.Auto); err != nil {
			t.Fatalf("gen sink %d local %d: %v", sl[0], sl[1], err)
		}
		res, err := Run(t.Context(), Generate(g), Options{})
		if err != nil {
			t.Fatalf("sink %d local %d: %v", sl[0], sl[1], err)
		}
		if res.PagesRead != 4*2 {
			t.Errorf("sink %d local %d: %d pages read, want K x kv_heads = 8", sl[0], sl[1], res.PagesRead)
		}
	}
}

// TestReplicatedNeedsQuestAtAnyCP: replicated selection with the oracle
// or recent selector is refused on one shard too, as on CP x TP shards
// and in demo (before, --cp 1 let it through).
func TestReplicatedNeedsQuestAtAnyCP(t *testing.T) {
	c := Generate(GenConfig{Tokens: 64, PageSize: 16, BudgetTokens: 32, QHeads: 2, KVHeads: 1, HeadDim: 4, Seed: 1})
	for _, cp := range []int{0, 1, 2} {
		for _, sel := range []plan.Selector{plan.Oracle, plan.Recent} {
			err := c.Check(Options{CP: cp, Selector: sel, Selection: engine.Replicated})
			if err == nil || !strings.Contains(err.Error(), "replicated selection needs the quest or dense selector") {
				t.Errorf("cp %d %v: %v", cp, sel, err)
			}
		}
		for _, sel := range []plan.Selector{plan.Quest, plan.Dense} {
			if err := c.Check(Options{CP: cp, Selector: sel, Selection: engine.Replicated}); err != nil {
				t.Errorf("cp %d %v: %v", cp, sel, err)
			}
		}
	}
}

// TestDecodeSpeed logs the decode rate of the example case and of a
// generated multi-MB case, and fails only when decoding is far slower
// than encoding/json was (a regression to a per-token reflection pass).
func TestDecodeSpeed(t *testing.T) {
	example, err := os.ReadFile("../examples/replay/case.json")
	if err != nil {
		t.Fatal(err)
	}
	var big bytes.Buffer
	if err := Generate(GenConfig{Tokens: 16384, PageSize: 16, BudgetTokens: 1024, QHeads: 8, KVHeads: 2, HeadDim: 64, Seed: 1}).Encode(&big); err != nil {
		t.Fatal(err)
	}
	for _, in := range []struct {
		name string
		b    []byte
	}{{"example", example}, {"16K tokens x 2 heads x 64", big.Bytes()}} {
		rate := func(decode func([]byte) error) float64 {
			reps := max(1, (8<<20)/len(in.b))
			start := time.Now()
			for range reps {
				if err := decode(in.b); err != nil {
					t.Fatal(err)
				}
			}
			return float64(reps*len(in.b)) / time.Since(start).Seconds() / (1 << 20)
		}
		ours := rate(func(b []byte) error { _, err := Decode(bytes.NewReader(b)); return err })
		std := rate(func(b []byte) error {
			var c Case
			if err := json.Unmarshal(b, &c); err != nil {
				return err
			}
			return c.Validate()
		})
		t.Logf("%s (%s): %.0f MiB/s (encoding/json and Validate: %.0f MiB/s)", in.name, memlimit.Bytes(int64(len(in.b))), ours, std)
		if ours < std/4 {
			t.Errorf("%s: %.0f MiB/s, less than a quarter of encoding/json's %.0f MiB/s", in.name, ours, std)
		}
	}
}

// BenchmarkDecode: the example case and a generated 44 MB one.
//
//	go test -run '^$' -bench Decode -benchmem ./replay/
func BenchmarkDecode(b *testing.B) {
	example, err := os.ReadFile("../examples/replay/case.json")
	if err != nil {
		b.Fatal(err)
	}
	var big bytes.Buffer
	if err := Generate(GenConfig{Tokens: 16384, PageSize: 16, BudgetTokens: 1024, QHeads: 8, KVHeads: 2, HeadDim: 64, Seed: 1}).Encode(&big); err != nil {
		b.Fatal(err)
	}
	for _, in := range []struct {
		name string
		b    []byte
	}{{"example", example}, {"16Kx2x64", big.Bytes()}} {
		b.Run(in.name, func(b *testing.B) {
			b.SetBytes(int64(len(in.b)))
			for b.Loop() {
				if _, err := Decode(bytes.NewReader(in.b)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
