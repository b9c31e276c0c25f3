package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/plan"
)

func calibrateCmd(ctx context.Context, args []string, out, errb *bytes.Buffer) error {
	return runCalibrate(ctx, args, out, errb)
}

// TestCalibrate: calibrate writes a policy file that eval (--budgets
// policy) and generate (--policy) then run under; budgets rise with the
// target; bad flags exit 2 naming the flag.
func TestCalibrate(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	dir := t.TempDir()
	budgets := map[string][]int{}
	for _, target := range []string{"0.3", "0.9"} {
		out := filepath.Join(dir, "p"+target+".yaml")
		code, stdout, errs := call(calibrateCmd, "--model", v1, "--lengths", "1024", "--n", "2", "--answer-only", "--target-mass", target, "--out", out, "--json")
		if code != 0 {
			t.Fatalf("calibrate --target-mass %s: exit %d: %s", target, code, errs)
		}
		var res struct {
			Layers []struct {
				Budget      int   `json:"budget"`
				HeadBudgets []int `json:"head_budgets"`
			} `json:"layers"`
			Steps int `json:"decode_steps"`
		}
		if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res.Layers) != 6 || res.Steps != 2*4 {
			t.Fatalf("--json: %v, %d layers, %d steps (want 6 and 2 prompts x 4 answer steps): %s", err, len(res.Layers), res.Steps, stdout)
		}
		for _, l := range res.Layers {
			budgets[target] = append(budgets[target], l.Budget)
		}
		f, err := os.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		p, err := plan.ReadPolicyFile(f)
		f.Close()
		if err != nil {
			t.Fatalf("the written policy: %v", err)
		}
		for l, b := range budgets[target] {
			if !p.IsDenseLayer(l) && p.LayerBudget[l] != b {
				t.Errorf("policy layer %d budget %d, calibration %d", l, p.LayerBudget[l], b)
			}
		}
	}
	for l := range budgets["0.3"] {
		if budgets["0.3"][l] > budgets["0.9"][l] {
			t.Errorf("layer %d: target 0.3 needs %d tokens, 0.9 needs %d", l, budgets["0.3"][l], budgets["0.9"][l])
		}
	}
	pol := filepath.Join(dir, "p0.9.yaml")
	code, stdout, errs := call(evalCmd, "passkey", "--model", v1, "--lengths", "1024", "--n", "1", "--policy", pol, "--budgets", "policy,64", "--json", "--no-diagnostics")
	if code != 0 || !strings.Contains(stdout, `"policy":"p0.9.yaml"`) {
		t.Fatalf("eval --budgets policy: exit %d, %s\n%s", code, errs, stdout)
	}
	code, stdout, errs = call(generate, "--model", v1, "--prompt", refPrompt, "--max-tokens", "3", "--policy", pol, "--json")
	if code != 0 || !strings.Contains(stdout, `"text":"482"`) {
		t.Fatalf("generate --policy: exit %d, %s\n%s", code, errs, stdout)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--model", v1}, "--prompts or --lengths"},
		{[]string{"--model", v1, "--lengths", "1024", "--target-mass", "1.5"}, "--target-mass"},
		{[]string{"--model", v1, "--lengths", "1024", "--max-rho", "0"}, "--max-rho"},
		{[]string{"--model", v1, "--lengths", "1024", "--cp", "2"}, "--cp"},
		{[]string{"--model", v1, "--lengths", "1024", "--out", "/nonexistent/p.yaml"}, "--out"},
		{[]string{"--model", v1, "--prompts", "/nonexistent"}, "--prompts"},
		{[]string{"--model", v1, "--lengths", "1024", "--policy", "/nonexistent"}, "--policy"},
	} {
		code, out, errs := call(calibrateCmd, c.args...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, c.flag) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want exit 2 naming %s)", c.args, code, out, errs, c.flag)
		}
	}
	code, _, errs = call(evalCmd, "passkey", "--model", v1, "--budgets", "policy")
	if code != 2 || !strings.Contains(errs, "needs --policy") {
		t.Errorf("--budgets policy without --policy: exit %d, %q", code, errs)
	}
}
