package cuda

import (
	"fmt"

	"github.com/questrt/questrt/plan"
)

// Kernels of prefill.cu (no build tag: the PTX check uses the names
// without a GPU).

// gemmSmem is the dynamic shared memory of prefill_gemm_bf16: three
// stages of a 128 x 40 and a 128 x 40 bf16 tile.
const gemmSmem = 3 * 2 * 128 * 40 * 2

// prefillHeadDims are the head dimensions prefill_attend is compiled for.
var prefillHeadDims = [...]int{32, 64, 128}

// prefillAttendName names the prefill attention kernel of pages of dt
// (bf16 or f16) and head dimension d.
func prefillAttendName(dt plan.DType, d int) string {
	return fmt.Sprintf("prefill_attend_%s_d%d", dt, d)
}

// prefillAttendSmem is prefill_attend's dynamic shared memory for head
// dimension d: q and two buffers of K and V, 64 rows of d + 8 16-bit
// elements each.
func prefillAttendSmem(d int) int { return 5 * 64 * (d + 8) * 2 }

// prefillKernelNames lists the kernels of prefill.cu.
func prefillKernelNames() []string {
	names := []string{"prefill_tobf16_bf16", "prefill_gemm_bf16"}
	for _, dt := range []plan.DType{plan.BFloat16, plan.Float16} {
		for _, d := range prefillHeadDims {
			names = append(names, prefillAttendName(dt, d))
		}
	}
	return names
}
