package plan

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestPolicyPlan(t *testing.T) {
	base := DefaultPolicy() // S=16, B=2048 (K=128), local 1, dense layers 2
	withSink := base
	withSink.SinkPages = 2
	withLayer := base
	withLayer.LayerBudget = map[int]int{5: 64}
	recent := base
	recent.Selector = Dense
	byRho := base
	byRho.DenseRho = 0.25 // dense while 1/16 + 128/P >= 1/4: P <= 682.67
	exactRho := base
	exactRho.DenseRho = 0.1875 // 1/16 + 128/1024 exactly
	cases := []struct {
		name         string
		pol          Policy
		layer, pages int
		budget       int
		want         Plan
	}{
		{"dense layer", base, 1, 1000, 0, Plan{Pages: 1000, Dense: true, K: 128}},
		{"sparse", base, 2, 1000, 0, Plan{Pages: 1000, K: 128, Local: 1, Rank: 127}},
		{"budget covers sequence", base, 2, 128, 0, Plan{Pages: 128, Dense: true, K: 128}},
		{"one page short of dense", base, 2, 129, 0, Plan{Pages: 129, K: 128, Local: 1, Rank: 127}},
		{"request budget", base, 3, 1000, 160, Plan{Pages: 1000, K: 10, Local: 1, Rank: 9}},
		{"budget rounds down", base, 3, 1000, 47, Plan{Pages: 1000, K: 2, Local: 1, Rank: 1}},
		{"sink and local", withSink, 2, 1000, 160, Plan{Pages: 1000, K: 10, Sink: 2, Local: 1, Rank: 7}},
		{"forced exceed budget", withSink, 2, 1000, 32, Plan{Pages: 1000, K: 2, Sink: 2, Local: 1, Rank: 0}},
		{"layer budget", withLayer, 5, 1000, 0, Plan{Pages: 1000, K: 4, Local: 1, Rank: 3}},
		{"request beats layer budget", withLayer, 5, 1000, 320, Plan{Pages: 1000, K: 20, Local: 1, Rank: 19}},
		{"dense selector", recent, 7, 1000, 0, Plan{Pages: 1000, Dense: true, K: 128}},
		{"rho above dense rho", byRho, 2, 682, 0, Plan{Pages: 682, Dense: true, K: 128}},
		{"rho below dense rho", byRho, 2, 683, 0, Plan{Pages: 683, K: 128, Local: 1, Rank: 127}},
		{"rho at dense rho", exactRho, 2, 1024, 0, Plan{Pages: 1024, Dense: true, K: 128}},
		{"rho just below", exactRho, 2, 1025, 0, Plan{Pages: 1025, K: 128, Local: 1, Rank: 127}},
		{"request budget lowers rho", byRho, 2, 682, 160, Plan{Pages: 682, K: 10, Local: 1, Rank: 9}},
		{"dense rho off", base, 2, 130, 0, Plan{Pages: 130, K: 128, Local: 1, Rank: 127}},
	}
	for _, c := range cases {
		got, err := c.pol.Plan(c.layer, c.pages, c.budget)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: plan %+v, want %+v", c.name, got, c.want)
		}
		if got.Reads() > got.Pages {
			t.Errorf("%s: reads %d of %d pages", c.name, got.Reads(), got.Pages)
		}
	}
	if _, err := base.Plan(2, 100, 15); err == nil {
		t.Error("budget below one page: no error")
	}
}

func TestPolicyValidate(t *testing.T) {
	bad := map[string]func(*Policy){
		"page size 0":        func(p *Policy) { p.PageSize = 0 },
		"budget below page":  func(p *Policy) { p.BudgetTokens = 8 },
		"negative sink":      func(p *Policy) { p.SinkPages = -1 },
		"negative local":     func(p *Policy) { p.LocalPages = -1 },
		"bad gqa":            func(p *Policy) { p.GQA = 7 },
		"bad selector":       func(p *Policy) { p.Selector = 9 },
		"bad layer budget":   func(p *Policy) { p.LayerBudget = map[int]int{3: 4} },
		"negative dense rho": func(p *Policy) { p.DenseRho = -0.1 },
		"dense rho above 2":  func(p *Policy) { p.DenseRho = 2.5 },
		"dense rho NaN":      func(p *Policy) { p.DenseRho = math.NaN() },
		"hier group 1":       func(p *Policy) { p.HierGroup = 1 },
		"negative hier":      func(p *Policy) { p.HierGroup = -2 },
		"negative top-p":     func(p *Policy) { p.TopP = -0.5 },
		"top-p above 1":      func(p *Policy) { p.TopP = 1.0000001 },
		"top-p NaN":          func(p *Policy) { p.TopP = math.NaN() },
		"top-p +Inf":         func(p *Policy) { p.TopP = math.Inf(1) },
	}
	for name, mut := range bad {
		p := DefaultPolicy()
		mut(&p)
		if p.Validate() == nil {
			t.Errorf("%s: Validate accepted %+v", name, p)
		}
	}
	if err := DefaultPolicy().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []float64{0, math.SmallestNonzeroFloat64, 0.5, 0.99, 1} {
		pol := DefaultPolicy()
		pol.TopP = p
		if err := pol.Validate(); err != nil {
			t.Errorf("top-p %v: %v", p, err)
		}
		if on := p > 0 && p < 1; pol.TopPOn() != on {
			t.Errorf("top-p %v: TopPOn %v, want %v", p, pol.TopPOn(), on)
		}
	}
	for _, name := range []string{"quest", "oracle", "recent", "dense"} {
		s, err := ParseSelector(name)
		if err != nil || s.String() != name {
			t.Errorf("ParseSelector(%q) = %v, %v", name, s, err)
		}
	}
	if _, err := ParseSelector("h2o"); err == nil {
		t.Error("ParseSelector accepted h2o")
	}
}

// TestPolicySubBoxesValidate: sub-boxes must divide the page size, stay
// within MaxSubBoxes and not meet the box trees.
func TestPolicySubBoxesValidate(t *testing.T) {
	for _, c := range []struct {
		page, sub, hier int
		ok              bool
	}{
		{16, 0, 0, true}, {16, 1, 0, true}, {16, 2, 0, true}, {16, 4, 0, true}, {16, 16, 0, true},
		{16, 3, 0, false}, {16, -1, 0, false}, {16, 32, 0, false}, {128, 128, 0, false},
		{16, 2, 8, false}, {16, 1, 8, true},
	} {
		p := DefaultPolicy()
		p.PageSize, p.BudgetTokens, p.SubBoxes, p.HierGroup = c.page, 64*c.page, c.sub, c.hier
		if err := p.Validate(); (err == nil) != c.ok {
			t.Errorf("page %d sub-boxes %d hier %d: %v, want ok %v", c.page, c.sub, c.hier, err, c.ok)
		}
	}
}

// TestPolicyReuseStepsValidate: ReuseSteps 0..MaxReuseSteps is accepted
// (0 and 1 off); a negative or larger value is refused with the field
// named, and a policy file with such a value is refused too.
func TestPolicyReuseStepsValidate(t *testing.T) {
	for _, c := range []struct {
		r      int
		ok, on bool
	}{{0, true, false}, {1, true, false}, {2, true, true}, {MaxReuseSteps, true, true},
		{-1, false, false}, {MaxReuseSteps + 1, false, false}, {1 << 40, false, false}} {
		p := DefaultPolicy()
		p.ReuseSteps = c.r
		err := p.Validate()
		if (err == nil) != c.ok {
			t.Errorf("reuse steps %d: %v, want ok %v", c.r, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "reuse steps") {
			t.Errorf("reuse steps %d: error %q does not name the field", c.r, err)
		}
		if c.ok && p.ReuseOn() != c.on {
			t.Errorf("reuse steps %d: ReuseOn %v, want %v", c.r, p.ReuseOn(), c.on)
		}
	}
	if _, err := ReadPolicyFile(strings.NewReader("reuse_steps: -3\n")); err == nil || !strings.Contains(err.Error(), "reuse steps") {
		t.Errorf("policy file with reuse_steps -3: %v", err)
	}
	p, err := ReadPolicyFile(strings.NewReader("reuse_steps: 4\n"))
	if err != nil || p.ReuseSteps != 4 {
		t.Errorf("policy file with reuse_steps 4: %+v, %v", p, err)
	}
}

// TestPolicyReuseLayersValidate: ReuseLayers takes ascending layers of 1
// or more, each after a layer that is not dense by policy; anything else
// is refused with the field named, in a policy file too.
func TestPolicyReuseLayersValidate(t *testing.T) {
	for _, c := range []struct {
		layers []int
		ok     bool
	}{{nil, true}, {[]int{3}, true}, {[]int{3, 5}, true}, {[]int{3, 4, 5}, true},
		{[]int{0}, false}, {[]int{-1}, false}, {[]int{2}, false}, {[]int{1}, false}, // layers 0 and 1 are dense
		{[]int{5, 3}, false}, {[]int{3, 3}, false}, {make([]int, MaxReuseLayers+1), false}} {
		p := DefaultPolicy()
		p.ReuseLayers = c.layers
		err := p.Validate()
		if (err == nil) != c.ok {
			t.Errorf("reuse layers %v: %v, want ok %v", c.layers, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "reuse layer") {
			t.Errorf("reuse layers %v: error %q does not name the field", c.layers, err)
		}
		if c.ok && p.ReuseLayersOn() != (len(c.layers) > 0) {
			t.Errorf("reuse layers %v: ReuseLayersOn %v", c.layers, p.ReuseLayersOn())
		}
	}
	p := DefaultPolicy()
	p.ReuseLayers = []int{3, 5}
	for l, want := range []bool{false, false, false, true, false, true, false} {
		if p.ReusesLayer(l) != want {
			t.Errorf("ReusesLayer(%d) = %v", l, !want)
		}
	}
	p.LayerBudget = map[int]int{4: DenseBudget}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "reuse layer 5") {
		t.Errorf("reuse layer 5 after the dense layer 4: %v", err)
	}
	if _, err := ReadPolicyFile(strings.NewReader("reuse_layers: [1]\n")); err == nil || !strings.Contains(err.Error(), "reuse layer") {
		t.Errorf("policy file with reuse_layers [1] (layer 0 is dense): %v", err)
	}
	got, err := ReadPolicyFile(strings.NewReader("reuse_layers: [3, 5]\n"))
	if err != nil || !slices.Equal(got.ReuseLayers, []int{3, 5}) {
		t.Errorf("policy file with reuse_layers [3, 5]: %+v, %v", got, err)
	}
}
