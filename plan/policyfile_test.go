package plan

import (
	"bytes"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestPolicyFileExample(t *testing.T) {
	src := `# calibrated
page_size: 16
budget: 1024
sink: 1
local: 2
gqa: per_head
selector: quest
dense: [0, 1, 4]
layer_budget:
  2: 256
  3: 512
`
	p, err := ReadPolicyFile(strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	want := Policy{PageSize: 16, BudgetTokens: 1024, SinkPages: 1, LocalPages: 2, DenseLayers: 2, GQA: PerHead, Selector: Quest,
		LayerBudget: map[int]int{2: 256, 3: 512, 4: DenseBudget}}
	if !policyEqual(p, want) {
		t.Fatalf("got %+v, want %+v", p, want)
	}
	for l, dense := range []bool{true, true, false, false, true, false} {
		if p.IsDenseLayer(l) != dense {
			t.Errorf("layer %d: dense %v, want %v", l, p.IsDenseLayer(l), dense)
		}
	}
	// Layer 4 plans dense at a long context, layer 5 at the default budget.
	if pl, _ := p.Plan(4, 1<<20, 0); !pl.Dense {
		t.Errorf("layer 4 at 1M pages: %+v, want dense", pl)
	}
	if pl, _ := p.Plan(5, 1000, 0); pl.Dense || pl.K != 64 {
		t.Errorf("layer 5: %+v, want K = 1024/16 = 64", pl)
	}
	if pl, _ := p.Plan(2, 1000, 0); pl.K != 16 {
		t.Errorf("layer 2: %+v, want K = 256/16 = 16", pl)
	}
}

func TestPolicyFileDefaults(t *testing.T) {
	p, err := ReadPolicyFile(strings.NewReader(""))
	if err != nil || !policyEqual(p, DefaultPolicy()) {
		t.Fatalf("empty file: %+v, %v; want the default policy", p, err)
	}
	p, err = ReadPolicyFile(strings.NewReader("dense: []\n"))
	if err != nil || p.DenseLayers != 0 {
		t.Fatalf("dense: []: %+v, %v; want no dense layer", p, err)
	}
}

func TestPolicyFileErrors(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"page_sise: 16\n", "field page_sise not found"},
		{"page_size: 0\n", "page size 0"},
		{"budget: 8\n", "below one page"},
		{"gqa: max\n", "gqa"},
		{"selector: h2o\n", "selector"},
		{"dense: [0, 0]\n", "listed twice"},
		{"dense: [-1]\n", "negative"},
		{"dense: [2]\nlayer_budget: {2: 64}\n", "both dense"},
		{"layer_budget: {3: 4}\n", "below one page"},
		{"layer_budget: {-3: 64}\n", "negative"},
		{"hier_group: 1\n", "hierarchical group 1"},
		{"hier_group: 5000\n", "hierarchical group 5000"},
		{"page_size: 16\n---\npage_size: 8\n", "more than one"},
		{"page_size: [1]\n", "cannot unmarshal"},
		{strings.Repeat("#", maxPolicyFile+1), "larger than"},
	} {
		_, err := ReadPolicyFile(strings.NewReader(c.src))
		if !errors.Is(err, ErrPolicyFile) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.40q: error %v, want ErrPolicyFile containing %q", c.src, err, c.want)
		}
	}
}

// TestPolicyFileRoundTrip: random valid policies survive write and read.
func TestPolicyFileRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		p := Policy{PageSize: 1 + rng.IntN(64), SinkPages: rng.IntN(3), LocalPages: rng.IntN(3), DenseLayers: rng.IntN(4),
			GQA: GQAMode(rng.IntN(2)), Selector: Selector(rng.IntN(3))}
		if rng.IntN(2) == 0 {
			p.HierGroup = 2 + rng.IntN(30)
		} else if rng.IntN(2) == 0 {
			p.SubBoxes = rng.IntN(p.PageSize) + 1
			for p.PageSize%p.SubBoxes != 0 {
				p.SubBoxes--
			}
		}
		p.BudgetTokens = p.PageSize * (1 + rng.IntN(100))
		if rng.IntN(2) == 0 {
			p.DenseRho = float64(rng.IntN(2049)) / 1024 // 0..2, exact in YAML
		}
		if rng.IntN(2) == 0 {
			p.TopP = float64(1+rng.IntN(1024)) / 1024 // (0, 1], exact in YAML
		}
		if rng.IntN(2) == 0 {
			p.ReuseSteps = rng.IntN(MaxReuseSteps + 1)
		}
		if rng.IntN(2) == 0 {
			p.LayerBudget = map[int]int{}
			for range rng.IntN(6) {
				l := p.DenseLayers + rng.IntN(10)
				if rng.IntN(4) == 0 {
					p.LayerBudget[l] = DenseBudget
				} else {
					p.LayerBudget[l] = p.PageSize * (1 + rng.IntN(50))
				}
			}
		}
		if rng.IntN(2) == 0 {
			for l := max(p.DenseLayers, 1); l < p.DenseLayers+12; l++ {
				if rng.IntN(3) == 0 && !p.IsDenseLayer(l-1) {
					p.ReuseLayers = append(p.ReuseLayers, l)
				}
			}
		}
		var b bytes.Buffer
		if err := WritePolicyFile(&b, p, "test policy\nsecond line"); err != nil {
			t.Fatal(err)
		}
		got, err := ReadPolicyFile(&b)
		if err != nil {
			t.Fatalf("case %d: %v\n%s", i, err, b.String())
		}
		if !policySame(got, p) {
			t.Fatalf("case %d: read %+v, wrote %+v\n%s", i, got, p, b.String())
		}
	}
}

// policySame reports whether a and b plan every layer alike (a dense
// layer may move between DenseLayers and DenseBudget).
func policySame(a, b Policy) bool {
	if a.PageSize != b.PageSize || a.BudgetTokens != b.BudgetTokens || a.SinkPages != b.SinkPages ||
		a.LocalPages != b.LocalPages || a.GQA != b.GQA || a.Selector != b.Selector || a.HierGroup != b.HierGroup ||
		a.SubBoxes != b.SubBoxes || a.TopP != b.TopP || a.DenseRho != b.DenseRho || a.ReuseSteps != b.ReuseSteps ||
		!slices.Equal(a.ReuseLayers, b.ReuseLayers) {
		return false
	}
	for l := range 20 {
		if a.IsDenseLayer(l) != b.IsDenseLayer(l) {
			return false
		}
		pa, ea := a.Plan(l, 1000, 0)
		pb, eb := b.Plan(l, 1000, 0)
		if pa.Dense {
			pa.K, pb.K = 0, 0
		}
		if pa != pb || (ea == nil) != (eb == nil) {
			return false
		}
	}
	return true
}

func policyEqual(a, b Policy) bool {
	return a.PageSize == b.PageSize && a.BudgetTokens == b.BudgetTokens && a.SinkPages == b.SinkPages &&
		a.LocalPages == b.LocalPages && a.DenseLayers == b.DenseLayers && a.GQA == b.GQA && a.Selector == b.Selector &&
		a.SummaryDType == b.SummaryDType && a.DenseRho == b.DenseRho && a.HierGroup == b.HierGroup && a.SubBoxes == b.SubBoxes && a.TopP == b.TopP && a.ReuseSteps == b.ReuseSteps && maps.Equal(a.LayerBudget, b.LayerBudget)
}
