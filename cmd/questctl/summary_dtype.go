package main

import (
	"errors"
	"flag"
	"slices"
	"strings"

	"github.com/questrt/questrt/plan"
)

// defaultSummaryDType is the one default of --summary-dtype: the
// summaries in the K/V cache's own type, as before the flag existed.
const defaultSummaryDType = "bf16"

// summaryDTypeValue is --summary-dtype: bf16 or fp8, or with list a
// comma-separated list of them, checked when parsed.
type summaryDTypeValue struct {
	s     string
	list  bool
	types []plan.SummaryDType
}

func (v *summaryDTypeValue) String() string {
	if v == nil {
		return ""
	}
	return v.s
}

func (v *summaryDTypeValue) Set(s string) error {
	var types []plan.SummaryDType
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		d, err := plan.ParseSummaryDType(f)
		if err != nil || f == "" {
			if v.list {
				return errors.New("want a comma-separated list of bf16 and fp8")
			}
			return errors.New("want bf16 or fp8")
		}
		if !slices.Contains(types, d) {
			types = append(types, d)
		}
	}
	if len(types) > 1 && !v.list {
		return errors.New("want bf16 or fp8 (one type)")
	}
	v.s, v.types = s, types
	return nil
}

// Choices are the values shell completion offers.
func (v *summaryDTypeValue) Choices() []string { return []string{"bf16", "fp8"} }

// summaryDTypeFlag adds --summary-dtype to fs: the storage type of the
// page summaries that the score reads, default [defaultSummaryDType].
// more is appended to the usage.
func summaryDTypeFlag(fs *flag.FlagSet, more string) *summaryDTypeValue {
	v := &summaryDTypeValue{s: defaultSummaryDType, types: []plan.SummaryDType{plan.SummaryKV}}
	fs.Var(v, "summary-dtype", "`type` of the page summaries the score reads: bf16 (in the K/V cache's type, as before: bf16 at the GPU's default, f32 on the CPU backend) or fp8 (e4m3, a power-of-two scale per page and KV head, minima rounded down and maxima up: still an upper bound, half the bytes of bf16; the CPU backend emulates it exactly)"+more)
	return v
}
