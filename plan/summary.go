package plan

import "fmt"

// SummaryDType is the storage type of the page summaries (the min/max
// records the score reads), set by a policy independently of the K/V
// storage type (DType).
//
// The zero value, SummaryKV, keeps the summaries in the K/V storage type,
// as before the type existed: bf16 at the CUDA backend's default
// --kv-cache-dtype, float32 on the CPU backend.
type SummaryDType uint8

const (
	// SummaryKV stores the summaries in the K/V storage type (DType).
	// Default.
	SummaryKV SummaryDType = iota
	// SummaryFP8 stores each (page, KV head) record as 2*D e4m3 codes and
	// one power-of-two float32 scale, the minima rounded toward -Inf and
	// the maxima toward +Inf, so the score stays an upper bound (see
	// package kernels/fp8). Half the bytes of bf16 records.
	SummaryFP8
)

// String returns "bf16" for SummaryKV (the name of the CLI flag's
// default: the K/V type, bf16 by default on the GPU) and "fp8" for
// SummaryFP8.
func (d SummaryDType) String() string {
	switch d {
	case SummaryKV:
		return "bf16"
	case SummaryFP8:
		return "fp8"
	}
	return fmt.Sprintf("SummaryDType(%d)", uint8(d))
}

// Known reports whether d is SummaryKV or SummaryFP8.
func (d SummaryDType) Known() bool { return d <= SummaryFP8 }

// ParseSummaryDType parses bf16 or kv (SummaryKV: the summaries in the
// K/V storage type; "" too) and fp8 or e4m3 (SummaryFP8).
func ParseSummaryDType(s string) (SummaryDType, error) {
	switch s {
	case "", "bf16", "kv":
		return SummaryKV, nil
	case "fp8", "e4m3":
		return SummaryFP8, nil
	}
	return 0, fmt.Errorf("unknown summary dtype %q (want bf16 or fp8)", s)
}
