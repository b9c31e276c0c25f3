package main

import (
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPolicyFile: --policy adds the file's per-layer budgets and dense
// layers to the engine's policy and fills the policy flags not given;
// flags given anywhere (command line, environment) win; a page size that
// contradicts --page-size and a bad file are refused with the flag named.
func TestPolicyFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	src := "page_size: 16\nbudget: 512\nsink: 1\nlocal: 2\ngqa: per_head\ndense: [0, 3]\nlayer_budget: {1: 64, 2: 128}\n"
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, nil, "--insecure", "--policy", file)
	if err != nil {
		t.Fatal(err)
	}
	p := c.engineConfig().Policy
	want := map[int]int{1: 64, 2: 128, 3: math.MaxInt32}
	if p.BudgetTokens != 512 || p.SinkPages != 1 || p.LocalPages != 2 || p.DenseLayers != 1 || p.GQA.String() != "per_head" || !maps.Equal(p.LayerBudget, want) {
		t.Fatalf("policy %+v, want budget 512, sink 1, local 2, 1 dense layer, per_head, layer budgets %v", p, want)
	}
	if pl, err := p.Plan(3, 100000, 0); err != nil || !pl.Dense {
		t.Fatalf("layer 3: %+v %v, want dense", pl, err)
	}
	c, err = load(t, map[string]string{"QUESTRT_LOCAL_PAGES": "3"}, "--insecure", "--policy", file, "--sink-pages", "0")
	if err != nil {
		t.Fatal(err)
	}
	if p := c.engineConfig().Policy; p.SinkPages != 0 || p.LocalPages != 3 || p.BudgetTokens != 512 {
		t.Fatalf("flag and environment over the file: %+v", p)
	}
	for _, bad := range []struct {
		args []string
		src  string
		want string
	}{
		{[]string{"--page-size", "8"}, src, "page_size 16 differs from --page-size 8"},
		{nil, "budget: 4\n", "below one page"},
		{nil, "colour: red\n", "field colour not found"},
		{nil, "layer_budget: {2: 8}\n", "below one page"},
	} {
		f := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(f, []byte(bad.src), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := load(t, nil, append([]string{"--insecure", "--policy", f}, bad.args...)...)
		if err == nil || !strings.Contains(err.Error(), "--policy") || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q with %v: error %v, want --policy and %q", bad.src, bad.args, err, bad.want)
		}
	}
	if _, err := load(t, nil, "--insecure", "--policy", filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "--policy") {
		t.Errorf("missing file: %v", err)
	}
}

// TestPolicyFileReuse: the file's reuse_steps and reuse_layers reach the
// engine's policy unless --reuse-steps / --reuse-layers are given (an
// empty --reuse-layers turns the file's off); bad lists are refused with
// the flag named.
func TestPolicyFileReuse(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte("page_size: 16\nreuse_steps: 4\nreuse_layers: [3, 5]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, nil, "--insecure", "--policy", file)
	if err != nil {
		t.Fatal(err)
	}
	if p := c.engineConfig().Policy; p.ReuseSteps != 4 || !slices.Equal(p.ReuseLayers, []int{3, 5}) {
		t.Fatalf("from the file: reuse steps %d, layers %v; want 4 and [3 5]", p.ReuseSteps, p.ReuseLayers)
	}
	c, err = load(t, nil, "--insecure", "--policy", file, "--reuse-layers", "4", "--reuse-steps", "0")
	if err != nil {
		t.Fatal(err)
	}
	if p := c.engineConfig().Policy; p.ReuseSteps != 0 || !slices.Equal(p.ReuseLayers, []int{4}) {
		t.Fatalf("flags over the file: reuse steps %d, layers %v; want 0 and [4]", p.ReuseSteps, p.ReuseLayers)
	}
	c, err = load(t, nil, "--insecure", "--policy", file, "--reuse-layers", "")
	if err != nil {
		t.Fatal(err)
	}
	if p := c.engineConfig().Policy; p.ReuseLayersOn() {
		t.Fatalf("--reuse-layers \"\" over the file: layers %v, want none", p.ReuseLayers)
	}
	c, err = load(t, nil, "--insecure", "--reuse-layers", "3,5")
	if err != nil {
		t.Fatal(err)
	}
	if p := c.engineConfig().Policy; !slices.Equal(p.ReuseLayers, []int{3, 5}) {
		t.Fatalf("--reuse-layers 3,5: layers %v", p.ReuseLayers)
	}
	for _, bad := range []struct{ v, want string }{
		{"5,3", "want ascending layers"}, {"3,3", "want ascending layers"}, {"0", "of 1 or more"}, {"x", "of 1 or more"},
	} {
		if _, err := load(t, nil, "--insecure", "--reuse-layers", bad.v); err == nil || !strings.Contains(err.Error(), "--reuse-layers") || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("--reuse-layers %q: %v, want an error naming the flag and %q", bad.v, err, bad.want)
		}
	}
}
