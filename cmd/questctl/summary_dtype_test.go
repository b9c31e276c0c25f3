package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/eval"
)

// TestSummaryDTypeFlag: --summary-dtype takes bf16 or fp8 (a list in eval
// passkey only), and fp8 is refused where it would not take effect; each
// error is a one-line usage error.
func TestSummaryDTypeFlag(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"eval", "passkey", "--model", v1, "--summary-dtype", "bf16,fp9"}, "want a comma-separated list of bf16 and fp8"},
		{[]string{"generate", "--model", v1, "--prompt", "x", "--summary-dtype", "bf16,fp8"}, "want bf16 or fp8 (one type)"},
		{[]string{"generate", "--model", v1, "--prompt", "x", "--summary-dtype", "fp4"}, "want bf16 or fp8"},
		{[]string{"bench", "attention", "--summary-dtype", "fp8"}, "--summary-dtype fp8 needs --backend cuda"},
		{[]string{"demo", "--summary-dtype", "fp8", "--nodes", "2"}, "runs in process only"},
	} {
		code, stdout, stderr := runCLI(t, c.args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, stdout, stderr, c.want)
		}
	}
}

// TestEvalSummaryDTypes: eval passkey --summary-dtype bf16,fp8 runs every
// sparse (selector, budget) with both summary types on the same prompts;
// its bf16 records are those of a run without the flag (the default
// type), and at a budget covering the context fp8 equals dense too.
func TestEvalSummaryDTypes(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	args := []string{"passkey", "--model", v1, "--lengths", "512", "--n", "2", "--budgets", "32,4096", "--json"}
	records := func(extra ...string) []eval.Record {
		t.Helper()
		code, out, errs := call(evalCmd, append(append([]string{}, args...), extra...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		var recs []eval.Record
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var r eval.Record
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		return recs
	}
	base := records()
	both := records("--summary-dtype", "bf16,fp8")
	// dense, then quest/bf16 and quest/fp8 at each budget.
	if len(base) != 3 || len(both) != 5 {
		t.Fatalf("%d records without the flag, %d with bf16,fp8", len(base), len(both))
	}
	if base[1].SummaryDType != "" || both[0].SummaryDType != "" {
		t.Errorf("summary_dtype on the default run (%q) or on dense (%q)", base[1].SummaryDType, both[0].SummaryDType)
	}
	for i, want := range []struct {
		dtype  string
		budget int
	}{{"bf16", 32}, {"bf16", 4096}, {"fp8", 32}, {"fp8", 4096}} {
		r := both[1+i]
		if r.SummaryDType != want.dtype || r.Budget != want.budget || r.Selector != "quest" {
			t.Fatalf("record %d: %s/%s/%d, want quest/%s/%d", 1+i, r.Selector, r.SummaryDType, r.Budget, want.dtype, want.budget)
		}
	}
	for i := range 2 {
		a, b := base[1+i], both[1+i]
		b.SummaryDType = ""
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Errorf("bf16 record differs from the default run's:\n%s\n%s", ja, jb)
		}
	}
	if r := both[4]; r.Accuracy != r.DenseAccuracy || *r.TeacherForced.TokenAgreement != 1 {
		t.Errorf("fp8 at a budget covering the context: %+v", r)
	}
}
