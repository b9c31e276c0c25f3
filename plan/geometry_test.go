package plan

import (
	"strings"
	"testing"
)

func TestDType(t *testing.T) {
	for _, c := range []struct {
		d     DType
		name  string
		bytes int
		in    []string
	}{
		{Float32, "f32", 4, []string{"f32", "float32"}},
		{Float16, "f16", 2, []string{"f16", "fp16", "float16"}},
		{BFloat16, "bf16", 2, []string{"bf16", "bfloat16"}},
		{FP8, "fp8", 1, []string{"fp8", "e4m3"}},
	} {
		if c.d.String() != c.name || c.d.Bytes() != c.bytes || !c.d.Known() {
			t.Errorf("%d: String %q Bytes %d Known %v, want %q %d true", c.d, c.d.String(), c.d.Bytes(), c.d.Known(), c.name, c.bytes)
		}
		for _, s := range c.in {
			if d, err := ParseDType(s); err != nil || d != c.d {
				t.Errorf("ParseDType(%q) = %v, %v; want %v", s, d, err, c.d)
			}
		}
	}
	var zero DType
	if zero != Float32 {
		t.Errorf("zero DType is %v, want f32", zero)
	}
	if d := DType(9); d.Known() || d.Bytes() != 0 || d.String() != "DType(9)" {
		t.Errorf("DType(9): Known %v Bytes %d String %q", d.Known(), d.Bytes(), d.String())
	}
	if _, err := ParseDType("int8"); err == nil || !strings.Contains(err.Error(), "want f32, f16, bf16 or fp8") {
		t.Errorf("ParseDType(int8): %v", err)
	}
}

func TestGeometry(t *testing.T) {
	ok := Geometry{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}
	with := func(f func(*Geometry)) Geometry { g := ok; f(&g); return g }
	for name, c := range map[string]struct {
		g    Geometry
		want string // "" means valid
	}{
		"ok":         {ok, ""},
		"bf16":       {with(func(g *Geometry) { g.DType = BFloat16 }), ""},
		"no q heads": {with(func(g *Geometry) { g.QHeads = 0 }), "must be positive"},
		"no kv":      {with(func(g *Geometry) { g.KVHeads = 0 }), "must be positive"},
		"no dim":     {with(func(g *Geometry) { g.HeadDim = -1 }), "must be positive"},
		"no page":    {with(func(g *Geometry) { g.PageSize = 0 }), "must be positive"},
		"group":      {with(func(g *Geometry) { g.QHeads = 12 }), "not a multiple"},
		"dtype":      {with(func(g *Geometry) { g.DType = 7 }), "unknown dtype"},
	} {
		err := c.g.Validate()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: Validate() = %v, want %q", name, err, c.want)
		}
	}
	if ok.Group() != 4 || ok.QRow() != 32*128 || ok.KVRow() != 8*128 || ok.PageElems() != 8*16*128 || ok.SummaryElems() != 8*2*128 {
		t.Errorf("sizes of %+v: group %d q %d kv %d page %d summary %d", ok, ok.Group(), ok.QRow(), ok.KVRow(), ok.PageElems(), ok.SummaryElems())
	}
	if got := ok.Pages(0); got != 0 {
		t.Errorf("Pages(0) = %d", got)
	}
	if got := ok.Pages(17); got != 2 {
		t.Errorf("Pages(17) = %d", got)
	}
	if s := ok.Split(4); s != (Geometry{QHeads: 8, KVHeads: 2, HeadDim: 128, PageSize: 16}) {
		t.Errorf("Split(4) = %+v", s)
	}
	p := DefaultPolicy()
	p.PageSize = 3
	if q := p.WithGeometry(ok); q.PageSize != 16 || q.BudgetTokens != p.BudgetTokens {
		t.Errorf("WithGeometry: %+v", q)
	}
}
