package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/questrt/questrt/cmd/questctl/internal/demo"
	"github.com/questrt/questrt/internal/memlimit"
)

// checkRefused: exit 2, exactly one stderr line, nothing on stdout, no
// struct dump. The command runs under a cancelled context, so one that
// got past validation and started work ends with the context's error
// (exit 1) instead of the refusal: no wall-clock bound is needed.
func checkRefused(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := runCLICancelled(t, args...)
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") || strings.Contains(stderr, "{") {
		t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and one stderr line", args, code, stdout, stderr)
	}
	return stderr
}

// runCLICancelled runs the CLI under an already cancelled context.
func runCLICancelled(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	code := run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

const (
	huge    = "1099511627776"        // 2^40
	maxI64  = "9223372036854775807"  // math.MaxInt64
	tooWide = "99999999999999999999" // beyond int64
)

// TestDemoNumericFlagsRefused: every numeric demo flag at 0, -1, 1 where
// those are invalid, and at huge values, is a usage error before anything
// is allocated.
func TestDemoNumericFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		flag string
		bad  []string
	}{
		{"context", []string{"0", "-1", "1", huge, maxI64, tooWide}},
		{"steps", []string{"0", "-1", huge, maxI64, tooWide}},
		{"layers", []string{"0", "-1", "1", huge, maxI64, tooWide}}, // 1: the 2 default dense layers leave no sparse one
		{"dense-layers", []string{"-1", "4", huge, maxI64, tooWide}},
		{"q-heads", []string{"0", "-1", "1", huge, maxI64, tooWide}}, // 1: not a multiple of 8 KV heads
		{"kv-heads", []string{"0", "-1", huge, maxI64, tooWide}},
		{"head-dim", []string{"0", "-1", huge, maxI64, tooWide}},
		{"page-size", []string{"0", "-1", huge, maxI64, tooWide}},
		{"budget", []string{"0", "-1", "1", huge, maxI64, tooWide}},
		{"needles", []string{"0", "-1", huge, maxI64, tooWide}},
		{"mentions", []string{"0", "-1", huge, maxI64, tooWide}},
		{"seed", []string{"-1", tooWide}},
		{"workers", []string{"-1", huge, maxI64, tooWide}},
		{"cp", []string{"0", "-1", huge, maxI64, tooWide}},
		{"tp", []string{"0", "-1", huge, maxI64, tooWide}}, // 3 and 5 below
		{"max-memory", []string{"1", "-2", "1e30", "1EiB"}},
	} {
		for _, v := range tc.bad {
			stderr := checkRefused(t, "demo", "--"+tc.flag, v)
			if !strings.Contains(stderr, tc.flag) && !strings.Contains(stderr, "memory") {
				t.Errorf("--%s %s: message does not name the flag: %q", tc.flag, v, stderr)
			}
		}
	}
	checkRefused(t, "demo", "--tp", "3")
	checkRefused(t, "demo", "--kv-heads", "5")
}

// TestDemoIssueCases: the configurations of the issue that ran and
// printed wrong numbers, or crashed, are refused with what is allowed.
func TestDemoIssueCases(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dense-layers", "5"}, "--dense-layers 5: want 0..3"},
		{[]string{"--layers", "2", "--dense-layers", "2"}, "--dense-layers 2: want 0..1"},
		{[]string{"--page-size", "1000000"}, "want --page-size 1..3276"},
		{[]string{"--budget", "1000000000"}, "--budget 1000000000: want 16..65535 tokens"},
		{[]string{"--budget", "65536"}, "a budget covering the context makes every layer dense"},
		{[]string{"--needles", "2000"}, "--needles 1..1023"},
		{[]string{"--mentions", "100000"}, "--mentions 100000: want 1..4096"},
		{[]string{"--context", "10000000", "--max-memory", "16GiB"}, "more than the 16.0 GiB memory limit"},
		{[]string{"--context", "10000000", "--cp", "4", "--max-memory", "16GiB"}, "need 324."},
		{[]string{"--selection", "replicated", "--selector", "oracle"}, "--selection replicated needs --selector quest or dense"},
	} {
		stderr := checkRefused(t, append([]string{"demo"}, tc.args...)...)
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: %q lacks %q", tc.args, stderr, tc.want)
		}
	}
}

// TestDemoTenMillionAvailable: --context 10000000 with the default
// --max-memory (the memory available) is refused, not a runtime crash.
func TestDemoTenMillionAvailable(t *testing.T) {
	c := demo.DefaultConfig()
	c.Context = 10_000_000
	m, err := c.Memory()
	if err != nil {
		t.Fatal(err)
	}
	if avail, err := memlimit.Available(); err != nil || avail >= m.Total() {
		t.Skipf("this machine has %d bytes available (%v): the 10M-token demo (%s) would fit", avail, err, memlimit.Bytes(m.Total()))
	}
	stderr := checkRefused(t, "demo", "--context", "10000000")
	if !strings.Contains(stderr, "need "+memlimit.Bytes(m.Total())) || !strings.Contains(stderr, "available") {
		t.Fatalf("%q", stderr)
	}
}

// TestDemoOneStep: a run whose A phase has no steps says so in the summary
// instead of printing zeros; --max-memory -1 skips the check.
func TestDemoOneStep(t *testing.T) {
	code, out, stderr := runCLI(t, "demo", "--context", "2048", "--steps", "1", "--layers", "2", "--dense-layers", "0",
		"--q-heads", "4", "--kv-heads", "2", "--head-dim", "16", "--budget", "256", "--mentions", "8", "--needles", "2", "--max-memory", "-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"asking A: no steps", "summary over 2 sparse layers x 1 steps", "not checked"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Speedups below 1 keep two significant digits (a cold step on a
	// loaded host is slow, not zero): 0x would be a zero dense time.
	if strings.Contains(out, " 0x") || strings.Contains(out, "NaN") {
		t.Errorf("output shows 0x or NaN:\n%s", out)
	}
}

// TestDemoHelpZeros: --help says what the zeros that are accepted mean.
func TestDemoHelpZeros(t *testing.T) {
	code, out, _ := runCLI(t, "demo", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"(0: none", "(0: GOMAXPROCS-1)", "0 included", "0: the memory available now", "-1: no check"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q:\n%s", want, out)
		}
	}
}

// TestDemoFP8Rho: with fp8 summaries the measured bytes rho counts each
// record at (2D+4)/(8SD) of a float32 page, not 1/S: it comes out below
// the bf16 run's by the summaries' share, and the output says why.
func TestDemoFP8Rho(t *testing.T) {
	rho := func(extra ...string) float64 {
		t.Helper()
		args := append([]string{"demo", "--context", "4096", "--steps", "2", "--layers", "2", "--dense-layers", "0",
			"--q-heads", "4", "--kv-heads", "2", "--head-dim", "16", "--budget", "256", "--mentions", "8", "--needles", "2", "--max-memory", "-1"}, extra...)
		code, out, stderr := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		m := regexp.MustCompile(`bytes rho ([0-9.]+) \(formula`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no bytes rho in:\n%s", out)
		}
		if len(extra) > 0 && !strings.Contains(out, "fp8 records") {
			t.Errorf("fp8 output does not say how summaries are counted:\n%s", out)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	bf, f8 := rho(), rho("--summary-dtype", "fp8")
	// 256 pages, every record read each step: the summaries' share drops
	// from 1/16 = 0.0625 to (2*16+4)/(8*16*16) = 0.0176 per page.
	if d := bf - f8; d < 0.0625-0.0176-0.002 || d > 0.0625-0.0176+0.002 {
		t.Fatalf("bytes rho bf16 %v, fp8 %v: difference %v, want about %v", bf, f8, d, 0.0625-0.0176)
	}
}
