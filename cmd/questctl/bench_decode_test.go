//go:build !cuda

package main

import (
	"strings"
	"testing"
)

// TestBenchDecodeRefusals: bad flags are one usage line (exit 2) naming
// the flag, checked before any device is touched; a valid command in a
// build without CUDA says how to get one.
func TestBenchDecodeRefusals(t *testing.T) {
	const cfg = "../../examples/llama-3.1-8b/config.json"
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "want one of --config FILE and --model DIR"},
		{[]string{"--config", cfg, "--model", "x"}, "want one of --config FILE and --model DIR"},
		{[]string{"--config", cfg, "--backend", "cpu"}, "--backend \"cpu\""},
		{[]string{"--config", cfg, "--batch", "17"}, "--batch 17"},
		{[]string{"--config", cfg, "--batch", "0"}, "--batch"},
		{[]string{"--config", cfg, "--context", "131060"}, "beyond the model's 131072 positions"},
		{[]string{"--config", cfg, "--load-format", "pt"}, "--load-format \"pt\""},
		{[]string{"--config", cfg, "--weights-dtype", "f16"}, "--weights-dtype \"f16\""},
		{[]string{"--config", cfg, "--budget", "8"}, "--budget 8"},
		{[]string{"--config", cfg, "--steps", "0"}, "--steps 0"},
		{[]string{"--config", "no-such-config.json"}, "model config"},
		{[]string{"--config", cfg, "--kv-cache-dtype", "fp4"}, "--kv-cache-dtype \"fp4\": want f32, f16, bf16 or fp8"},
		{[]string{"--config", cfg, "--kv-cache-dtype", "f32", "--prefill", "128"}, "--prefill with --kv-cache-dtype f32"},
		{[]string{"--config", cfg, "--prefill-chunk", "-1"}, "--prefill-chunk -1"},
		{[]string{"--config", cfg, "--prefill-chunk", "1048577"}, "--prefill-chunk 1048577"},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"bench", "decode"}, c.args...)...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want one usage line with %q", c.args, code, stdout, stderr, c.want)
		}
	}
	// fp8 pages pass the flags, with a prefill too (decoded and prefilled
	// from fp8 records on the GPU).
	code, _, stderr := runCLI(t, "bench", "decode", "--config", cfg, "--kv-cache-dtype", "fp8", "--prefill", "128")
	if code == 0 || !strings.Contains(stderr, "-tags cuda") {
		t.Errorf("bench decode --kv-cache-dtype fp8 without CUDA: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, "bench", "decode", "--config", cfg)
	if code == 0 || !strings.Contains(stderr, "-tags cuda") {
		t.Errorf("bench decode without CUDA: exit %d, stderr %q", code, stderr)
	}
}
