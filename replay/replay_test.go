package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// refScores computes each query head's min/max bound per page in float64
// straight from the case's keys.
func refScores(c *Case) [][]float64 {
	n := c.Tokens()
	pages := (n + c.PageSize - 1) / c.PageSize
	g := c.QHeads / c.KVHeads
	out := make([][]float64, c.QHeads)
	for h := range c.QHeads {
		out[h] = make([]float64, pages)
		for p := range pages {
			var u float64
			for j := range c.HeadDim {
				lo, hi := math.Inf(1), math.Inf(-1)
				for t := p * c.PageSize; t < min((p+1)*c.PageSize, n); t++ {
					x := float64(c.Keys[h/g][t][j])
					lo, hi = min(lo, x), max(hi, x)
				}
				q := float64(c.Query[h][j])
				u += max(q*lo, q*hi)
			}
			out[h][p] = u
		}
	}
	return out
}

// refSelect picks pages like the policy, from float64 scores: forced sink
// and local pages, then the best of the rest (ties to the lower index). It
// also returns the smallest score gap at the selection boundary.
func refSelect(c *Case, scores []float64) ([]int32, float64) {
	pages := len(scores)
	k := c.BudgetTokens / c.PageSize
	if k >= pages {
		all := make([]int32, pages)
		for i := range all {
			all[i] = int32(i)
		}
		return all, math.Inf(1)
	}
	sink := min(c.SinkPages, pages)
	local := min(c.LocalPages, pages-sink)
	var sel []int32
	for p := range sink {
		sel = append(sel, int32(p))
	}
	for p := pages - local; p < pages; p++ {
		sel = append(sel, int32(p))
	}
	var cand []int
	for p := sink; p < pages-local; p++ {
		cand = append(cand, p)
	}
	sort.SliceStable(cand, func(a, b int) bool { return scores[cand[a]] > scores[cand[b]] })
	rank := min(max(k-sink-local, 0), len(cand))
	gap := math.Inf(1)
	if rank > 0 && rank < len(cand) {
		gap = scores[cand[rank-1]] - scores[cand[rank]]
	}
	for _, p := range cand[:rank] {
		sel = append(sel, int32(p))
	}
	slices.Sort(sel)
	return sel, gap
}

func refAttend(c *Case, h int, pages []int32) ([]float64, float64) {
	g := c.QHeads / c.KVHeads
	n := c.Tokens()
	scale := 1 / math.Sqrt(float64(c.HeadDim))
	var logits []float64
	var toks []int
	for _, p := range pages {
		for t := int(p) * c.PageSize; t < min(int(p+1)*c.PageSize, n); t++ {
			var x float64
			for j := range c.HeadDim {
				x += float64(c.Query[h][j]) * float64(c.Keys[h/g][t][j])
			}
			logits = append(logits, x*scale)
			toks = append(toks, t)
		}
	}
	m := slices.Max(logits)
	var z float64
	for _, x := range logits {
		z += math.Exp(x - m)
	}
	o := make([]float64, c.HeadDim)
	for i, t := range toks {
		w := math.Exp(logits[i]-m) / z
		for j := range o {
			o[j] += w * float64(c.Values[h/g][t][j])
		}
	}
	return o, m + math.Log(z)
}

// TestRoundTrip generates cases, writes them as JSON, reads them back, runs
// them and checks the result against the float64 reference.
func TestRoundTrip(t *testing.T) {
	cases := []GenConfig{
		{Tokens: 1, PageSize: 16, BudgetTokens: 32, QHeads: 4, KVHeads: 2, HeadDim: 8},
		{Tokens: 15, PageSize: 16, BudgetTokens: 16, QHeads: 4, KVHeads: 4, HeadDim: 8, LocalPages: 1},
		{Tokens: 16, PageSize: 16, BudgetTokens: 16, QHeads: 2, KVHeads: 1, HeadDim: 16},
		{Tokens: 17, PageSize: 16, BudgetTokens: 16, QHeads: 2, KVHeads: 1, HeadDim: 16},
		{Tokens: 500, PageSize: 16, BudgetTokens: 64, QHeads: 8, KVHeads: 2, HeadDim: 16},
		{Tokens: 500, PageSize: 16, BudgetTokens: 64, QHeads: 8, KVHeads: 2, HeadDim: 16, GQA: "per_head"},
		{Tokens: 999, PageSize: 4, BudgetTokens: 40, QHeads: 4, KVHeads: 1, HeadDim: 32, SinkPages: 1, LocalPages: 2},
		{Tokens: 300, PageSize: 1, BudgetTokens: 7, QHeads: 2, KVHeads: 2, HeadDim: 4, LocalPages: 1},
	}
	for i, g := range cases {
		g.Seed = uint64(i + 1)
		gen := Generate(g)
		raw, err := json.Marshal(gen)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Decode(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		res, err := Run(context.Background(), c, Options{Selector: plan.Quest})
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		var buf bytes.Buffer
		if err := res.Encode(&buf); err != nil {
			t.Fatal(err)
		}
		var back Result
		if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
			t.Fatalf("case %d: result is not valid JSON: %v", i, err)
		}
		scores := refScores(c)
		g2 := c.QHeads / c.KVHeads
		for h := range c.QHeads {
			row := scores[h]
			if c.GQA != "per_head" {
				row = slices.Clone(row)
				for h2 := h / g2 * g2; h2 < (h/g2+1)*g2; h2++ {
					for p := range row {
						row[p] = max(row[p], scores[h2][p])
					}
				}
			}
			for p, want := range row {
				if got := back.Scores[h][p]; math.Abs(float64(got)-want) > 1e-4*max(1, math.Abs(want)) {
					t.Fatalf("case %d head %d page %d: score %v, want %v", i, h, p, got, want)
				}
			}
			want, gap := refSelect(c, row)
			if gap > 1e-3 && !slices.Equal(back.SelectedPages[h], want) {
				t.Fatalf("case %d head %d: selected %v, want %v", i, h, back.SelectedPages[h], want)
			}
			wo, wl := refAttend(c, h, back.SelectedPages[h])
			if math.Abs(float64(back.LSE[h])-wl) > 1e-5*max(1, math.Abs(wl)) {
				t.Fatalf("case %d head %d: lse %v, want %v", i, h, back.LSE[h], wl)
			}
			for j := range wo {
				if math.Abs(float64(back.Output[h][j])-wo[j]) > 1e-5 {
					t.Fatalf("case %d head %d: output[%d] %v, want %v", i, h, j, back.Output[h][j], wo[j])
				}
			}
		}
		if back.MassRecall <= 0 || back.MassRecall > 1+1e-6 || back.Recall < 0 || back.Recall > 1 {
			t.Fatalf("case %d: recall %v mass %v out of [0,1]", i, back.Recall, back.MassRecall)
		}
	}
}

// TestDenseSelectorIsExact: the dense selector reads every page, so the
// result equals dense attention.
func TestDenseSelectorIsExact(t *testing.T) {
	c := Generate(GenConfig{Tokens: 333, PageSize: 16, BudgetTokens: 32, QHeads: 4, KVHeads: 2, HeadDim: 16, Seed: 9})
	res, err := Run(context.Background(), c, Options{Selector: plan.Dense})
	if err != nil {
		t.Fatal(err)
	}
	if res.Recall != 1 || math.Abs(res.MassRecall-1) > 1e-5 || res.RelL2 == nil || *res.RelL2 > 1e-6 || res.AbsL2 > 1e-6 || res.PagesRead != 2*res.Pages {
		t.Fatalf("dense: recall %v mass %v rel_l2 %v abs_l2 %v pages %d/%d", res.Recall, res.MassRecall, res.RelL2, res.AbsL2, res.PagesRead, res.Pages)
	}
	if res.Scores != nil {
		t.Fatalf("dense selector reported scores")
	}
}

// TestBadFiles: every file in testdata is malformed, or too large to run
// anywhere; each must be rejected by Decode or, with the default options,
// by Check, with a one-line error. (Valid files live in testdata/valid.)
func TestBadFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad files: %v", err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Decode(bytes.NewReader(raw))
		if err == nil {
			err = c.Check(Options{})
		}
		if err == nil {
			t.Errorf("%s: accepted", f)
			continue
		}
		if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "replay case") {
			t.Errorf("%s: error %q is not one 'replay case' line", f, err)
		}
	}
}

// TestShardedReplayMatchesSingle: exact and replicated selection over CP x
// TP shards reproduce the single-shard result (same pages, outputs within
// fp32 tolerance); union runs and reads its quota.
func TestShardedReplayMatchesSingle(t *testing.T) {
	c := Generate(GenConfig{Tokens: 1000, PageSize: 16, BudgetTokens: 160, QHeads: 8, KVHeads: 4, HeadDim: 16, LocalPages: 1, Seed: 5})
	single, err := Run(context.Background(), c, Options{Selector: plan.Quest})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{
		{CP: 2, TP: 1, Selection: engine.Exact},
		{CP: 3, TP: 2, Selection: engine.Exact, Placement: plan.Contiguous},
		{CP: 4, TP: 4, Selection: engine.Replicated},
		{CP: 1, TP: 2, Selection: engine.Exact},
	} {
		got, err := Run(context.Background(), c, o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		for h := range c.QHeads {
			if !slices.Equal(got.SelectedPages[h], single.SelectedPages[h]) {
				t.Fatalf("%+v head %d: pages %v, single %v", o, h, got.SelectedPages[h], single.SelectedPages[h])
			}
			if !slices.Equal(got.Scores[h], single.Scores[h]) {
				t.Fatalf("%+v head %d: scores differ", o, h)
			}
			for j := range got.Output[h] {
				if math.Abs(float64(got.Output[h][j]-single.Output[h][j])) > 1e-5 {
					t.Fatalf("%+v head %d: output %v vs %v", o, h, got.Output[h][j], single.Output[h][j])
				}
			}
		}
	}
	u, err := Run(context.Background(), c, Options{CP: 4, Selection: engine.Union})
	if err != nil {
		t.Fatal(err)
	}
	for h, sel := range u.SelectedPages {
		// K = 10 pages: tail + 9 ranked; union reads up to 4*ceil(9/4) = 12 ranked.
		if len(sel) < 10 || len(sel) > 13 {
			t.Fatalf("union head %d reads %d pages", h, len(sel))
		}
	}
}
