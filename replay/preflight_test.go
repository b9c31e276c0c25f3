package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// allocated returns the bytes f allocates on the heap (all of them, freed
// or not: an upper bound of its peak).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestFootprintBoundsAllocations: over single-shard and CP x TP runs of
// every selection, placement and selector, everything Run and Encode
// allocate stays within the footprint Check tests against the limit.
func TestFootprintBoundsAllocations(t *testing.T) {
	geoms := []GenConfig{
		{Tokens: 1, PageSize: 16, BudgetTokens: 32, QHeads: 4, KVHeads: 2, HeadDim: 8},
		{Tokens: 1000, PageSize: 16, BudgetTokens: 160, QHeads: 8, KVHeads: 4, HeadDim: 16, LocalPages: 1},
		{Tokens: 777, PageSize: 1, BudgetTokens: 40, QHeads: 8, KVHeads: 1, HeadDim: 4, GQA: "per_head"},
		{Tokens: 3, PageSize: 4096, BudgetTokens: 4096, QHeads: 16, KVHeads: 2, HeadDim: 64},
		{Tokens: 4096, PageSize: 64, BudgetTokens: 512, QHeads: 4, KVHeads: 4, HeadDim: 128, SinkPages: 1, LocalPages: 1},
	}
	opts := []Options{
		{Selector: plan.Quest},
		{Selector: plan.Oracle},
		{Selector: plan.Recent},
		{Selector: plan.Dense},
		{Selector: plan.Quest, CP: 2, Selection: engine.Exact},
		{Selector: plan.Quest, CP: 3, TP: 2, Selection: engine.Union, Placement: plan.Contiguous},
		{Selector: plan.Quest, CP: 4, Selection: engine.Replicated},
		{Selector: plan.Oracle, CP: 2, TP: 2, Selection: engine.Exact},
	}
	for i, g := range geoms {
		g.Seed = uint64(i + 1)
		c := Generate(g)
		for _, o := range opts {
			o.CP = min(o.CP, c.Pages())
			if c.KVHeads%max(o.TP, 1) != 0 {
				continue
			}
			o.MemoryLimit = memlimit.NoLimit
			need := c.Footprint(o)
			var runErr error
			got := allocated(func() {
				var res *Result
				if res, runErr = Run(context.Background(), c, o); runErr == nil {
					runErr = res.Encode(io.Discard)
				}
			})
			if runErr != nil {
				t.Fatalf("geometry %d %+v: %v", i, o, runErr)
			}
			if need < 0 || got > uint64(need) {
				t.Errorf("geometry %d %+v: allocated %s, footprint %s", i, o, memlimit.Bytes(int64(got)), memlimit.Bytes(need))
			}
			t.Logf("geometry %d cp %d tp %d %v %v: allocated %s of a footprint of %s", i, o.CP, o.TP, o.Selector, o.Selection,
				memlimit.Bytes(int64(got)), memlimit.Bytes(need))
		}
	}
}

// TestCheckRefusesHugeGeometry: sizes derived from page_size (the page
// pools, the attention's per-slot logits) are refused before anything is
// allocated, with one line that names page_size and wraps ErrTooLarge.
// Before the preflight, the second case passed the pool check (1 GiB of
// pools) and then asked the kernels for 64 GiB of logits.
func TestCheckRefusesHugeGeometry(t *testing.T) {
	one := func(x float32) []float32 { return []float32{x} }
	for _, tc := range []struct {
		name  string
		c     *Case
		limit int64
	}{
		{"page pools", &Case{PageSize: 1 << 40, BudgetTokens: 1 << 40, QHeads: 1, KVHeads: 1, HeadDim: 1,
			Keys: [][][]float32{{one(1)}}, Values: [][][]float32{{one(1)}}, Query: [][]float32{one(1)}}, 1 << 30},
		{"logits", &Case{PageSize: 1 << 27, BudgetTokens: 1 << 27, QHeads: 64, KVHeads: 1, HeadDim: 1,
			Keys: [][][]float32{{one(1)}}, Values: [][][]float32{{one(1)}}, Query: slicesOf(64, one(1))}, 8 << 30},
		{"overflow", &Case{PageSize: math.MaxInt64, BudgetTokens: math.MaxInt64, QHeads: 1, KVHeads: 1, HeadDim: 1,
			Keys: [][][]float32{{one(1), one(2)}}, Values: [][][]float32{{one(1), one(2)}}, Query: [][]float32{one(1)}}, memlimit.NoLimit},
	} {
		if err := tc.c.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var err error
		got := allocated(func() { _, err = Run(context.Background(), tc.c, Options{MemoryLimit: tc.limit}) })
		if !errors.Is(err, memlimit.ErrTooLarge) || !strings.Contains(err.Error(), "page_size") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line naming page_size and wrapping ErrTooLarge", tc.name, err)
		}
		if got > 1<<20 {
			t.Errorf("%s: allocated %s before refusing", tc.name, memlimit.Bytes(int64(got)))
		}
	}
}

func slicesOf(n int, row []float32) [][]float32 {
	out := make([][]float32, n)
	for i := range out {
		out[i] = row
	}
	return out
}

// TestRankCapacity: the pool of every CP rank holds exactly the largest
// share of pages that the engine's placement gives a rank.
func TestRankCapacity(t *testing.T) {
	const block = 64
	for _, place := range []plan.Placement{plan.Striped, plan.Contiguous} {
		for p := 1; p <= 300; p += 7 {
			for cp := 1; cp <= p; cp += 1 + cp/3 {
				count := make([]int, cp)
				for g := range p {
					r := g % cp
					if place == plan.Contiguous {
						r = (g / block) % cp
					}
					count[r]++
				}
				want := max(slicesMax(count), 1)
				if got := rankCapacity(p, cp, place, block); got != want {
					t.Fatalf("%v p %d cp %d: capacity %d, want %d", place, p, cp, got, want)
				}
			}
		}
	}
}

func slicesMax(a []int) int {
	m := a[0]
	for _, x := range a {
		m = max(m, x)
	}
	return m
}

// TestCPRanksGetTheirShare: a striped run with as many CP ranks as pages
// fits a limit set to its footprint, which the old layout (every rank's
// pool as large as the whole sequence: 64 x 65 pages here) exceeded many
// times over; contiguous runs too (its ranks' pools hold the largest
// share, rank 0's blocks); both give the single-shard result. More CP
// ranks than pages are refused with the limit in the message.
func TestCPRanksGetTheirShare(t *testing.T) {
	c := Generate(GenConfig{Tokens: 1024, PageSize: 16, BudgetTokens: 128, QHeads: 2, KVHeads: 1, HeadDim: 128, Seed: 3})
	single, err := Run(context.Background(), c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, place := range []plan.Placement{plan.Striped, plan.Contiguous} {
		o := Options{CP: c.Pages(), Placement: place}
		o.MemoryLimit = c.Footprint(o)
		if old := int64(c.Pages()) * int64(c.Pages()+1) * (2*16*128*4 + 2*128*4); place == plan.Striped && old < 4*o.MemoryLimit {
			t.Fatalf("test geometry too small: old pools %s vs footprint %s", memlimit.Bytes(old), memlimit.Bytes(o.MemoryLimit))
		}
		res, err := Run(context.Background(), c, o)
		if err != nil {
			t.Fatalf("%v: %v", place, err)
		}
		for h := range res.SelectedPages {
			if !slicesEqual(res.SelectedPages[h], single.SelectedPages[h]) {
				t.Fatalf("%v head %d: pages %v, single %v", place, h, res.SelectedPages[h], single.SelectedPages[h])
			}
		}
	}
	tiny := Generate(GenConfig{Tokens: 1, PageSize: 16, BudgetTokens: 16, QHeads: 1, KVHeads: 1, HeadDim: 4})
	var runErr error
	got := allocated(func() { _, runErr = Run(context.Background(), tiny, Options{CP: 10000}) })
	if runErr == nil || !strings.Contains(runErr.Error(), "at most 1") {
		t.Fatalf("cp 10000 on one page: %v", runErr)
	}
	if got > 1<<20 {
		t.Fatalf("cp 10000 allocated %s before refusing", memlimit.Bytes(int64(got)))
	}
}

func slicesEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestValueLimit: a case whose dot products or value sums exceed
// ValueLimit is refused by Validate with one line (before, it ran and
// ended in "json: unsupported value: NaN"); a case at the limit runs, and
// its result is finite and encodes.
func TestValueLimit(t *testing.T) {
	for _, f := range []string{"testdata/dot_overflow.json", "testdata/value_sum_overflow.json"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Decode(bytes.NewReader(raw))
		if err == nil || !strings.Contains(err.Error(), "float32-safe limit") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v", f, err)
		}
	}
	raw, err := os.ReadFile("testdata/valid/at_value_limit.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{{Selector: plan.Quest}, {Selector: plan.Oracle}, {Selector: plan.Dense}, {CP: 3}, {CP: 2, Selection: engine.Replicated}} {
		res, err := Run(context.Background(), c, o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		var buf bytes.Buffer
		if err := res.Encode(&buf); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		for _, row := range append(append([][]float32{res.LSE}, res.Output...), res.Scores...) {
			for _, x := range row {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("%+v: non-finite %v in %s", o, x, buf.String())
				}
			}
		}
	}
}

// TestZeroReferenceRelL2: when the dense output is zero and Quest's is
// not, rel_l2 is null in the JSON and abs_l2 gives the error (before, the
// NaN made the encoding fail).
func TestZeroReferenceRelL2(t *testing.T) {
	raw, err := os.ReadFile("testdata/valid/zero_reference.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), c, Options{Selector: plan.Quest})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := res.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if v, ok := m["rel_l2"]; !ok || v != nil {
		t.Fatalf("rel_l2 = %v (present %v), want null", v, ok)
	}
	if m["abs_l2"] != 1.0 {
		t.Fatalf("abs_l2 = %v, want 1 (output 1, dense 0)", m["abs_l2"])
	}
	dense, err := Run(context.Background(), c, Options{Selector: plan.Dense})
	if err != nil {
		t.Fatal(err)
	}
	if dense.RelL2 == nil || *dense.RelL2 != 0 || dense.AbsL2 != 0 {
		t.Fatalf("dense selector: rel_l2 %v abs_l2 %v, want 0 and 0", dense.RelL2, dense.AbsL2)
	}
}

// TestCaseEncodeRoundTrip: Encode writes what Decode reads back exactly,
// and the same case gives the same bytes.
func TestCaseEncodeRoundTrip(t *testing.T) {
	for _, g := range []GenConfig{
		{Tokens: 1, PageSize: 16, BudgetTokens: 16, QHeads: 1, KVHeads: 1, HeadDim: 1, Seed: 1},
		{Tokens: 37, PageSize: 4, BudgetTokens: 12, QHeads: 6, KVHeads: 3, HeadDim: 5, GQA: "per_head", SinkPages: 1, LocalPages: 2, Seed: 2},
	} {
		c := Generate(g)
		var a, b bytes.Buffer
		if err := c.Encode(&a); err != nil {
			t.Fatal(err)
		}
		if err := Generate(g).Encode(&b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Fatal("same config, different bytes")
		}
		back, err := Decode(bytes.NewReader(a.Bytes()))
		if err != nil {
			t.Fatalf("%v\n%s", err, a.String())
		}
		want, _ := json.Marshal(c)
		got, _ := json.Marshal(back)
		if !bytes.Equal(want, got) {
			t.Fatalf("round trip differs:\n%s\n%s", want, got)
		}
	}
}

// TestGenConfigCheck: bad and oversize geometries are refused with one
// line, before anything is allocated; a field out of its range names its
// flag, the value and the range, upper bound included ("--tokens 0: want
// 1..16777216"; before, "tokens 0 must be positive").
func TestGenConfigCheck(t *testing.T) {
	ok := GenConfig{Tokens: 256, PageSize: 16, BudgetTokens: 64, QHeads: 4, KVHeads: 2, HeadDim: 16, GQA: "group_max"}
	if err := ok.Check(memlimit.Auto); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*GenConfig)
	}{
		{"tokens", func(g *GenConfig) { g.Tokens = 0 }},
		{"tokens", func(g *GenConfig) { g.Tokens = math.MaxInt }},
		{"page-size", func(g *GenConfig) { g.PageSize = -1 }},
		{"--page-size 1125899906842624: want 1..16777216", func(g *GenConfig) { g.PageSize, g.BudgetTokens = 1<<50, 1<<50 }},
		{"page_size", func(g *GenConfig) { g.PageSize, g.BudgetTokens = MaxGenTokens, MaxGenTokens }}, // the memory check
		{"budget", func(g *GenConfig) { g.BudgetTokens = 15 }},
		{"q-heads", func(g *GenConfig) { g.QHeads = 3 }},
		{"kv-heads", func(g *GenConfig) { g.KVHeads, g.QHeads = math.MaxInt, math.MaxInt }},
		{"head-dim", func(g *GenConfig) { g.HeadDim = math.MaxInt / 2 }},
		{"--sink-pages -1: want 0..4", func(g *GenConfig) { g.SinkPages = -1 }},
		{"--local-pages -1: want 0..4", func(g *GenConfig) { g.LocalPages = -1 }},
		{"--sink-pages 3 + --local-pages 2: want at most K = 4", func(g *GenConfig) { g.SinkPages, g.LocalPages = 3, 2 }},
		{"--tokens 0: want 1..16777216", func(g *GenConfig) { g.Tokens = 0 }},
		{"--tokens 16777217: want 1..16777216", func(g *GenConfig) { g.Tokens = MaxGenTokens + 1 }},
		{"--q-heads 0: want 1..1024", func(g *GenConfig) { g.QHeads = 0 }},
		{"--q-heads 2048: want 1..1024", func(g *GenConfig) { g.QHeads = 2048 }},
		{"--kv-heads 0: want 1..1024", func(g *GenConfig) { g.KVHeads = 0 }},
		{"--head-dim 4097: want 1..4096", func(g *GenConfig) { g.HeadDim = 4097 }},
		{"--budget 15: want 16..16777216", func(g *GenConfig) { g.BudgetTokens = 15 }},
		{"--budget 16777232: want 16..16777216", func(g *GenConfig) { g.BudgetTokens = MaxGenTokens + 16 }},
		{"--gqa \"mean\": want group_max or per_head", func(g *GenConfig) { g.GQA = "mean" }},
	} {
		g := ok
		tc.edit(&g)
		var err error
		if got := allocated(func() { err = g.Check(1 << 30) }); got > 1<<20 {
			t.Errorf("%s: check allocated %s", tc.name, memlimit.Bytes(int64(got)))
		}
		if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%+v: error %v, want one line naming %s", g, err, tc.name)
		}
	}
}

// TestAppendFloat32: Encode writes numbers exactly as encoding/json does.
func TestAppendFloat32(t *testing.T) {
	xs := []float32{0, 1, -1, 0.1, 1e-6, 9.999999e-7, -1e-7, 1e20, 1e21, 3.4028235e38, -1.1754944e-38, 1.4e-45, 123456789, 1.5e-10}
	for i := range 20000 {
		xs = append(xs, math.Float32frombits(uint32(i)*2654435761))
	}
	for _, x := range xs {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			continue
		}
		want, _ := json.Marshal(x)
		if got := appendFloat32(nil, x); string(got) != string(want) {
			t.Fatalf("%v: wrote %s, encoding/json writes %s", x, got, want)
		}
	}
}

// TestGenerateWithinCheck: what Generate and Encode allocate stays within
// the memory GenConfig.Check tests for the case.
func TestGenerateWithinCheck(t *testing.T) {
	for _, g := range []GenConfig{
		{Tokens: 256, PageSize: 16, BudgetTokens: 64, QHeads: 4, KVHeads: 2, HeadDim: 16},
		{Tokens: 5000, PageSize: 1, BudgetTokens: 64, QHeads: 3, KVHeads: 3, HeadDim: 1},
		{Tokens: 3000, PageSize: 7, BudgetTokens: 64, QHeads: 2, KVHeads: 1, HeadDim: 33},
		{Tokens: 10, PageSize: 4, BudgetTokens: 64, QHeads: 8, KVHeads: 1, HeadDim: 9000},
	} {
		limit := int64(0)
		for lo, hi := int64(1), int64(1<<32); lo < hi; { // the smallest limit Check accepts
			mid := (lo + hi) / 2
			if err := g.Check(mid); err != nil {
				lo = mid + 1
			} else {
				hi = mid
			}
			limit = lo
		}
		got := allocated(func() { Generate(g).Encode(io.Discard) })
		if got > uint64(limit) {
			t.Errorf("%+v: allocated %s, checked for %s", g, memlimit.Bytes(int64(got)), memlimit.Bytes(limit))
		}
	}
}
