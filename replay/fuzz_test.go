package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// fuzzLimit is the memory limit FuzzDecode runs cases under.
const fuzzLimit = 64 << 20

// FuzzDecode feeds arbitrary bytes to Decode. Rejections must be one
// "replay case" line. An accepted case must read the same through
// encoding/json (the decoder only refuses more), encode and decode back to
// itself and pass or fail Check with one line; a small one that passes
// runs (the selector and layout picked from the input) without error,
// within its footprint, and its result encodes. Nothing may panic.
//
//	go test -run '^$' -fuzz FuzzDecode -fuzztime 60s ./replay/
//
// Inputs grown from the 188 KB example take the minimizer a while (the
// fuzzer reports 0 execs/sec meanwhile); -fuzzminimizetime 5s shortens it.
func FuzzDecode(f *testing.F) {
	var files []string
	for _, pat := range []string{"testdata/*.json", "testdata/valid/*.json", "../examples/replay/*.json"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			f.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 3 {
		f.Fatalf("only %d seed files", len(files))
	}
	for _, name := range files {
		raw, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	for _, g := range []GenConfig{
		{Tokens: 5, PageSize: 2, BudgetTokens: 4, QHeads: 2, KVHeads: 1, HeadDim: 3, LocalPages: 1},
		{Tokens: 17, PageSize: 4, BudgetTokens: 8, QHeads: 4, KVHeads: 2, HeadDim: 2, GQA: "per_head", SinkPages: 1},
	} {
		var buf bytes.Buffer
		if err := Generate(g).Encode(&buf); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode(bytes.NewReader(data))
		if err != nil {
			oneLine(t, err)
			return
		}
		// The decoder is stricter than encoding/json, never looser: what
		// it accepts, encoding/json reads to the same case.
		var ref Case
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ref); err != nil {
			t.Fatalf("accepted, but encoding/json refuses it: %v", err)
		}
		if a, b := mustMarshal(t, c), mustMarshal(t, &ref); !bytes.Equal(a, b) {
			t.Fatalf("decoded differently from encoding/json:\n%.2000s\n%.2000s", a, b)
		}
		// The round trip costs two more decodes: on small inputs only, so
		// that mutants of the example case stay cheap to minimize.
		if len(data) <= 16<<10 {
			var enc bytes.Buffer
			if err := c.Encode(&enc); err != nil {
				t.Fatal(err)
			}
			back, err := Decode(bytes.NewReader(enc.Bytes()))
			if err != nil {
				t.Fatalf("an accepted case does not decode after Encode: %v", err)
			}
			want, _ := json.Marshal(c)
			got, _ := json.Marshal(back)
			if !bytes.Equal(want, got) {
				t.Fatal("Encode then Decode changed the case")
			}
		}
		// The options come from the input, so the fuzzer reaches them.
		sum := 0
		for _, b := range data {
			sum += int(b)
		}
		opt := Options{
			Selector:    plan.Selector(sum % 4),
			CP:          1 + sum/4%3,
			TP:          1 + sum/12%2,
			Selection:   engine.Selection(sum / 24 % 3),
			Placement:   plan.Placement(sum / 72 % 2),
			MemoryLimit: fuzzLimit,
		}
		opt.CP = min(opt.CP, c.Pages())
		if c.KVHeads%opt.TP != 0 {
			opt.TP = 1
		}
		if opt.Selection == engine.Replicated && (opt.Selector == plan.Oracle || opt.Selector == plan.Recent) {
			opt.Selection = engine.Exact
		}
		if err := c.Check(opt); err != nil {
			oneLine(t, err)
			return
		}
		if c.Tokens()*c.KVHeads*c.HeadDim > 1<<14 || c.QHeads*c.HeadDim > 1<<12 {
			return // valid, but keep the runs tiny
		}
		need := c.Footprint(opt)
		var res *Result
		var runErr error
		grew := allocated(func() {
			// A run that hangs fails (and the input is kept) instead of
			// stalling the fuzzer.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if res, runErr = Run(ctx, c, opt); runErr == nil {
				runErr = res.Encode(io.Discard)
			}
		})
		if runErr != nil {
			t.Fatalf("%+v: a checked case failed: %v", opt, runErr)
		}
		if grew > uint64(need) {
			t.Fatalf("%+v: allocated %d bytes, footprint %d", opt, grew, need)
		}
	})
}

func oneLine(t *testing.T, err error) {
	t.Helper()
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "replay case") {
		t.Fatalf("error %q is not one 'replay case' line", msg)
	}
}

func mustMarshal(t *testing.T, c *Case) []byte {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
