package plan

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseSummaryDType(t *testing.T) {
	for s, want := range map[string]SummaryDType{"": SummaryKV, "bf16": SummaryKV, "kv": SummaryKV, "fp8": SummaryFP8, "e4m3": SummaryFP8} {
		if d, err := ParseSummaryDType(s); err != nil || d != want {
			t.Errorf("ParseSummaryDType(%q) = %v, %v; want %v", s, d, err, want)
		}
	}
	for _, s := range []string{"f16", "fp4", "FP8"} {
		if _, err := ParseSummaryDType(s); err == nil || !strings.Contains(err.Error(), "want bf16 or fp8") {
			t.Errorf("ParseSummaryDType(%q): %v", s, err)
		}
	}
	// The names parse back to their types.
	for _, d := range []SummaryDType{SummaryKV, SummaryFP8} {
		if got, err := ParseSummaryDType(d.String()); err != nil || got != d {
			t.Errorf("%v: String %q parses to %v, %v", d, d.String(), got, err)
		}
	}
	if s := SummaryDType(7).String(); s != "SummaryDType(7)" || SummaryDType(7).Known() {
		t.Errorf("SummaryDType(7): %q", s)
	}
}

func TestPolicySummaryDType(t *testing.T) {
	p := DefaultPolicy()
	if p.SummaryDType != SummaryKV {
		t.Fatalf("default summary dtype %v, want the K/V type", p.SummaryDType)
	}
	p.SummaryDType = 9
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "summary dtype") {
		t.Fatalf("unknown summary dtype: %v", err)
	}
	// Policy files carry it, and omit the default.
	q, err := ReadPolicyFile(strings.NewReader("summary_dtype: fp8\n"))
	if err != nil || q.SummaryDType != SummaryFP8 {
		t.Fatalf("summary_dtype: fp8: %+v, %v", q, err)
	}
	var b bytes.Buffer
	if err := WritePolicyFile(&b, q, ""); err != nil {
		t.Fatal(err)
	}
	file := b.String()
	if r, err := ReadPolicyFile(strings.NewReader(file)); err != nil || !policyEqual(r, q) || !strings.Contains(file, "summary_dtype: fp8") {
		t.Fatalf("round trip: %+v, %v (file %q)", r, err, file)
	}
	b.Reset()
	if err := WritePolicyFile(&b, DefaultPolicy(), ""); err != nil || strings.Contains(b.String(), "summary_dtype") {
		t.Fatalf("default policy file names a summary dtype: %q, %v", b.String(), err)
	}
	if _, err := ReadPolicyFile(strings.NewReader("summary_dtype: int4\n")); err == nil || !strings.Contains(err.Error(), "summary_dtype") {
		t.Fatalf("summary_dtype: int4: %v", err)
	}
}
