package plan

import "fmt"

// DType is the storage type of K, V and summaries. Scores, softmax and
// accumulation are always float32 whatever the storage type.
//
// The zero value is Float32, so a zero-initialized config stores float32
// (the CPU page store's only type and the CUDA backend's default).
type DType uint8

const (
	// Float32 stores float32 (the zero value; the CPU backend's data).
	Float32 DType = iota
	// Float16 stores IEEE half precision (CUDA backend only).
	Float16
	// BFloat16 stores bfloat16 (CUDA backend only).
	BFloat16
	// FP8 stores K and V as OCP FP8 E4M3 codes with one float32 scale
	// per (page, KV head) record (kernels/fp8, "KV records"); summaries
	// stay float32, taken over the dequantized stored keys. The CPU page
	// store and the CUDA backend both keep it (the GPU's offload slot
	// pools included).
	FP8
)

// String returns "f32", "f16", "bf16" or "fp8" (the names of the CLI flags and
// the CUDA kernels' suffixes), or "DType(n)" for an unknown type.
func (d DType) String() string {
	switch d {
	case Float32:
		return "f32"
	case Float16:
		return "f16"
	case BFloat16:
		return "bf16"
	case FP8:
		return "fp8"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Bytes returns the size of one element in bytes (1 for FP8, whose
// records carry a float32 scale besides), or 0 for an unknown type.
func (d DType) Bytes() int {
	switch d {
	case Float32:
		return 4
	case Float16, BFloat16:
		return 2
	case FP8:
		return 1
	}
	return 0
}

// Known reports whether d is one of Float32, Float16, BFloat16 and FP8.
func (d DType) Known() bool { return d <= FP8 }

// ParseDType parses f32|float32, f16|fp16|float16, bf16|bfloat16 or
// fp8|e4m3.
func ParseDType(s string) (DType, error) {
	switch s {
	case "f32", "float32":
		return Float32, nil
	case "f16", "fp16", "float16":
		return Float16, nil
	case "bf16", "bfloat16":
		return BFloat16, nil
	case "fp8", "e4m3":
		return FP8, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (want f32, f16, bf16 or fp8)", s)
}

// Geometry is the attention geometry a config describes: query and KV
// heads, head dimension, tokens per page and storage type. A model's
// geometry covers all its heads; a shard's (one TP rank's, see
// [Geometry.Split]) covers the heads that rank serves. It is the one
// source of the page size: a Policy used with a geometry takes its
// PageSize from it (see [Policy.WithGeometry]).
type Geometry struct {
	QHeads   int   // query heads; a multiple of KVHeads
	KVHeads  int   // KV heads
	HeadDim  int   // D, the head dimension
	PageSize int   // S, tokens per page
	DType    DType // storage type of K, V and summaries (zero: Float32)
}

// Validate reports whether every size is positive, QHeads is a multiple
// of KVHeads and DType is known.
func (g Geometry) Validate() error {
	switch {
	case g.QHeads < 1 || g.KVHeads < 1 || g.HeadDim < 1 || g.PageSize < 1:
		return fmt.Errorf("geometry: %d query heads, %d KV heads, head dim %d and page size %d must be positive",
			g.QHeads, g.KVHeads, g.HeadDim, g.PageSize)
	case g.QHeads%g.KVHeads != 0:
		return fmt.Errorf("geometry: %d query heads are not a multiple of %d KV heads", g.QHeads, g.KVHeads)
	case !g.DType.Known():
		return fmt.Errorf("geometry: unknown dtype %v", g.DType)
	}
	return nil
}

// Group is the number of query heads per KV head.
func (g Geometry) Group() int { return g.QHeads / g.KVHeads }

// Split returns the geometry of one of tp tensor-parallel ranks: its
// share of the query and KV heads (tp must divide KVHeads; the caller
// validates that).
func (g Geometry) Split(tp int) Geometry {
	g.QHeads /= tp
	g.KVHeads /= tp
	return g
}

// Pages is the number of pages that tokens tokens fill (the last one
// possibly partly).
func (g Geometry) Pages(tokens int) int { return (tokens + g.PageSize - 1) / g.PageSize }

// QRow is the number of floats of one token's queries (QHeads x HeadDim).
func (g Geometry) QRow() int { return g.QHeads * g.HeadDim }

// KVRow is the number of elements of one token's keys, or of its values
// (KVHeads x HeadDim).
func (g Geometry) KVRow() int { return g.KVHeads * g.HeadDim }

// PageElems is the number of elements of one page's keys, or of its
// values, in one layer (KVHeads x PageSize x HeadDim).
func (g Geometry) PageElems() int { return g.KVHeads * g.PageSize * g.HeadDim }

// SummaryElems is the number of elements of one page's summary (the
// per-dimension min and max of every KV head) in one layer
// (KVHeads x 2 x HeadDim).
func (g Geometry) SummaryElems() int { return g.KVHeads * 2 * g.HeadDim }

// WithGeometry returns p with its PageSize taken from g. Configs that
// carry both a geometry and a policy apply it once, so the two never
// disagree.
func (p Policy) WithGeometry(g Geometry) Policy {
	p.PageSize = g.PageSize
	return p
}
