package cuda

import (
	"fmt"

	"github.com/questrt/questrt/plan"
)

// Kernels of prefill.cu (no build tag: the PTX check uses the names
// without a GPU).

// GemmKernel names one compiled variant of the prefill GEMM
// (prefill_gemm_bf16_m<BM>n<BN>w<WM>x<WN>s<Stages> in prefill.cu).
type GemmKernel struct{ BM, BN, WM, WN, Stages int }

func (g GemmKernel) name() string {
	return fmt.Sprintf("prefill_gemm_bf16_m%dn%dw%dx%ds%d", g.BM, g.BN, g.WM, g.WN, g.Stages)
}

// String is the kernel's name.
func (g GemmKernel) String() string { return g.name() }

func (g GemmKernel) threads() int { return (g.BM / g.WM) * (g.BN / g.WN) * 32 }

// smem is the variant's dynamic shared memory: Stages tiles of BM and BN
// rows of 40 bf16.
func (g GemmKernel) smem() int { return g.Stages * (g.BM + g.BN) * 40 * 2 }

// GemmKernels lists the compiled GEMM variants (the PREFILL_GEMM lines
// of prefill.cu). Measured on an H100 (bench/results/2026-12-06-prefill-h100.md)
// beside 64 x 32 warps of 3 stages, blocks of 128 x 256 and 256 x 128,
// and 32 x 64 warps, which were 5-25% slower and are no longer compiled.
func GemmKernels() []GemmKernel {
	return []GemmKernel{{128, 128, 64, 64, 4}}
}

// defaultGemm is the variant gemv runs from gemmMinRows rows on.
// (measured best on an H100 at a chunk of 2048 rows of the 8B shape:
// 229-256 TFLOP/s against 205-231 for 64 x 32 warps,
// bench/results/2026-12-06-prefill-h100.md).
var defaultGemm = GemmKernel{128, 128, 64, 64, 4}

// prefillHeadDims are the head dimensions prefill_attend is compiled for.
var prefillHeadDims = [...]int{32, 64, 128}

// AttendKernel names one compiled variant of the prefill attention
// (prefill_attend_<T>_d<D>_m<MT>n<BN>w<W> in prefill.cu): MT m tiles of
// 16 rows a warp, W warps (16 MT W rows a block), K/V tiles of BN
// positions.
type AttendKernel struct {
	DType        plan.DType
	D, MT, BN, W int
}

func (a AttendKernel) name() string {
	return fmt.Sprintf("prefill_attend_%s_d%d_m%dn%dw%d", a.DType, a.D, a.MT, a.BN, a.W)
}

// String is the kernel's name.
func (a AttendKernel) String() string { return a.name() }

// rows is the query rows (token x head of the group) a block serves.
func (a AttendKernel) rows() int { return 16 * a.MT * a.W }

// smem is the variant's dynamic shared memory: q's rows and two buffers
// of K and V tiles, rows of D + 8 16-bit elements; for fp8 records also
// two buffers of K and V codes (rows of D bytes) and of each position's
// two scales.
func (a AttendKernel) smem() int {
	n := (a.rows() + 4*a.BN) * (a.D + 8) * 2
	if a.DType == plan.FP8 {
		n += 4*a.BN*a.D + 4*a.BN*4
	}
	return n
}

// AttendKernels lists the compiled attention variants (the
// PREFILL_ATTEND_M lines of prefill.cu): the default of each page type
// (bf16, f16, and fp8 records computed in bf16) and head dimension
// (defaultAttend).
func AttendKernels() []AttendKernel {
	var out []AttendKernel
	for _, dt := range []plan.DType{plan.BFloat16, plan.Float16, plan.FP8} {
		for _, d := range prefillHeadDims {
			out = append(out, defaultAttend(dt, d))
		}
	}
	return out
}

// defaultAttend is the variant PrefillTensor runs for pages of dt and
// head dimension d: two m tiles a warp over tiles of 64 positions, for
// bf16 and D 128 in blocks of 8 warps. Measured on an H100 after 126K
// tokens (bf16, D 128; bench/results/2026-12-06-prefill-h100.md): 294
// TFLOP/s, against 272 with 4 warps, 259 with tiles of 32 and 166 for a
// first kernel of one m tile a warp with q in registers (those variants
// are no longer compiled; f16 and D 128 keep tiles of 32, whose 235
// registers do not spill).
func defaultAttend(dt plan.DType, d int) AttendKernel {
	switch {
	case d == 128 && (dt == plan.BFloat16 || dt == plan.FP8):
		return AttendKernel{dt, d, 2, 64, 8}
	case d == 128:
		return AttendKernel{dt, d, 2, 32, 4}
	}
	return AttendKernel{dt, d, 2, 64, 4}
}

// prefillKernelNames lists the kernels of prefill.cu.
func prefillKernelNames() []string {
	names := []string{"prefill_tobf16_bf16"}
	for _, g := range GemmKernels() {
		names = append(names, g.name())
	}
	for _, a := range AttendKernels() {
		names = append(names, a.name())
	}
	return names
}
