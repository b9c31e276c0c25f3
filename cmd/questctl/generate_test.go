package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/internal/testmodels"
)

// testModels finds the shared checkpoints (testmodels.Dir), or skips.
func testModels(t *testing.T) string {
	t.Helper()
	return testmodels.Dir(t)
}

// call runs one command function the way run does: it returns the exit
// status and both streams.
func call(f func(context.Context, []string, *bytes.Buffer, *bytes.Buffer) error, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	err := f(context.Background(), args, &out, &errb)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0, out.String(), errb.String()
	case errors.As(err, new(usageError)):
		errb.WriteString(err.Error() + "\n")
		return 2, out.String(), errb.String()
	}
	errb.WriteString(err.Error() + "\n")
	return 1, out.String(), errb.String()
}

func generate(ctx context.Context, args []string, out, errb *bytes.Buffer) error {
	return runGenerate(ctx, args, out, errb)
}

const refPrompt = "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. " +
	"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " +
	"The pass key is 48213. Remember it. 48213 is the pass key. " +
	"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " +
	"What is the pass key? The pass key is "

func TestGenerate(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	// A budget covering the 24 pages: every step is dense.
	code, out, errs := call(generate, "--model", v1, "--prompt", refPrompt, "--max-tokens", "5", "--budget", "512", "--dense-layers", "1")
	if code != 0 || out != "48213\n" {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, out, errs)
	}
	if !strings.Contains(errs, "prefill: 367 tokens") || !strings.Contains(errs, "step 4 ") || !strings.Contains(errs, "tokens/s") || !strings.Contains(errs, "rho") {
		t.Errorf("stderr lacks the per-step lines and the summary:\n%s", errs)
	}
	code, out, errs = call(generate, "--model", v1, "--prompt", refPrompt, "--max-tokens", "5", "--budget", "32", "--compare-dense", "--json", "--diagnostics")
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errs)
	}
	var s genSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	if s.PromptTokens != 367 || len(s.Steps) != 5 || s.DecodeSteps != 4 || s.Dense == nil || s.Dense.Text != "48213" || s.Speedup <= 0 || s.TokensPerS <= 0 {
		t.Fatalf("summary %+v", s)
	}
	st := s.Steps[2]
	// 369 tokens: 24 pages; 2 dense layers, 4 sparse ones reading K = 2
	// pages, 2 KV heads each.
	if st.PagesTotal != 6*2*24 || st.PagesRead != 2*2*24+4*2*2 || st.Rho >= 1 || st.MassRecall <= 0 || st.MassRecall > 1 {
		t.Errorf("step %+v", st)
	}
	if want := (2 + 4*(1.0/16+2.0/24)) / 6; st.RhoFormula < want-1e-9 || st.RhoFormula > want+1e-9 {
		t.Errorf("rho formula %v, want %v", st.RhoFormula, want)
	}
	if d := s.Dense.Steps[2]; d.PagesRead != d.PagesTotal || d.Rho != 1 {
		t.Errorf("dense step %+v", d)
	}
}

func TestGenerateFlags(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	code, out, errs := call(generate, "--help")
	if code != 0 || errs != "" || !strings.HasPrefix(out, "Usage: questctl generate") || !strings.Contains(out, "Flags:") {
		t.Errorf("--help: exit %d, stderr %q, stdout %.60q", code, errs, out)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--prompt", "x"}, "--model"},
		{[]string{"--model", v1}, "--prompt"},
		{[]string{"--model", v1, "--prompt", "x", "--prompt-file", "y"}, "--prompt"},
		{[]string{"--model", v1, "--prompt", "x", "--max-tokens", "0"}, "--max-tokens"},
		{[]string{"--model", v1, "--prompt", "x", "--budget", "8"}, "--budget"},
		{[]string{"--model", v1, "--prompt", "x", "--selector", "best"}, "--selector"},
		{[]string{"--model", v1, "--prompt", "x", "--gqa", "avg"}, "--gqa"},
		{[]string{"--model", v1, "--prompt", "x", "--hier-group", "1"}, "--hier-group"},
		{[]string{"--model", v1, "--prompt", "x", "--sub-boxes", "5"}, "--sub-boxes"},
		{[]string{"--model", v1, "--prompt", "x", "--reuse-steps", "-2"}, "--reuse-steps"},
		{[]string{"--model", v1, "--prompt", "x", "--hier-group", "1025"}, "--hier-group"},
		{[]string{"--model", v1, "--prompt", "x", "--temperature", "-1"}, "--temperature"},
		{[]string{"--model", v1, "--prompt", "x", "--tp", "3"}, "tp 3"},
		{[]string{"--model", v1, "--prompt", "x", "--max-tokens", "40000"}, "--max-tokens"},
		{[]string{"--model", "/nonexistent", "--prompt", "x"}, "--model"},
		{[]string{"--model", v1, "--prompt-file", "/nonexistent"}, "--prompt-file"},
		{[]string{"--model", v1, "--prompt", "x", "--no-such-flag"}, "no-such-flag"},
		{[]string{"--model", v1, "--prompt", "x", "--backend", "tpu"}, "--backend"},
		{[]string{"--model", v1, "--prompt", "x", "--kv-cache-dtype", "f32"}, "--kv-cache-dtype needs --backend cuda"},
		{[]string{"--model", v1, "--prompt", "x", "--backend", "cuda", "--addr", "localhost:1"}, "--addr is not available with --backend cuda"},
		{[]string{"--model", v1, "--prompt", "x", "--backend", "cuda", "--cp", "2"}, "--cp is not available with --backend cuda"},
		{[]string{"--model", v1, "--prompt", "x", "--backend", "cuda", "--compare-dense"}, "--compare-dense"},
	} {
		code, out, errs := call(generate, c.args...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, c.flag) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want exit 2 naming %s)", c.args, code, out, errs, c.flag)
		}
	}
}

// TestInterruptedSaysSo: a command stopped by Ctrl-C (its context
// cancelled mid-run) says it was interrupted, first, in its one line,
// exit 1.
func TestInterruptedSaysSo(t *testing.T) {
	v1 := filepath.Join(testModels(t), "passkey-llama-v1")
	code, stdout, stderr := runCLICancelled(t, "generate", "--model", v1, "--prompt", "The grass is green.", "--max-tokens", "3")
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if code != 1 || stdout != "" || !strings.HasPrefix(lines[len(lines)-1], "questctl generate: interrupted: ") {
		t.Errorf("generate interrupted: exit %d, stdout %q, stderr %q; want exit 1 and a line questctl generate: interrupted: ...", code, stdout, stderr)
	}
}
