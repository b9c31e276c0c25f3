//go:build cuda

package cuda

import (
	"fmt"
	"strings"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// mmaKernel is one entry point of mma.cu (tensor-core kernels for 16-bit
// storage and S = 16).
type mmaKernel struct {
	name   string
	attend bool
	warps  int // attention: warps per block, one pipeline each
	smem   int // attention: dynamic shared memory bytes
}

// attendSmem is the dynamic shared memory of attend_mma: the warps' page
// stages (K and V tiles of 16 rows of D 16-bit elements), reused at the end
// for the warps' states (heads x D accumulators, a max and a sum per head).
func attendSmem(d, warps, stages, heads int) int {
	return max(warps*stages*2*16*d*2, warps*heads*d*4+2*warps*heads*4)
}

// attendSmem8 is attendSmem for fp8 records: each stage holds the page's K
// and V codes (16 rows of D bytes each) and their two scales (padded to
// 128 bytes), and each warp one pair of bf16 tiles the codes are converted
// into.
func attendSmem8(d, warps, stages, heads int) int {
	return max(warps*(stages*(2*16*d+128)+2*16*d*2), warps*heads*d*4+2*warps*heads*4)
}

// mmaKernels lists mma.cu's kernels as instantiated there.
func mmaKernels() []mmaKernel {
	var ks []mmaKernel
	for _, dt := range []plan.DType{plan.Float16, plan.BFloat16} {
		for _, d := range []int{64, 128} {
			for _, v := range []string{"", "_h16", "_u4"} {
				ks = append(ks, mmaKernel{name: fmt.Sprintf("quest_scoremma_%s_d%d%s", dt, d, v)})
			}
			for _, h16 := range []bool{false, true} {
				name, heads := fmt.Sprintf("quest_attendmma_%s_d%d", dt, d), 8
				if h16 {
					name, heads = name+"_h16", 16
				}
				ks = append(ks, mmaKernel{name: name, attend: true, warps: 4, smem: attendSmem(d, 4, 3, heads)})
			}
		}
	}
	for _, d := range []int{64, 128} {
		for _, v := range []string{"", "_h16"} {
			ks = append(ks, mmaKernel{name: fmt.Sprintf("quest_score8mma_d%d%s", d, v)})
		}
		for _, h16 := range []bool{false, true} {
			name, heads := fmt.Sprintf("quest_attendmma_fp8_d%d", d), 8
			if h16 {
				name, heads = name+"_h16", 16
			}
			ks = append(ks, mmaKernel{name: name, attend: true, warps: 4, smem: attendSmem8(d, 4, 3, heads)})
		}
	}
	for _, v := range []struct{ w, s int }{{4, 2}, {8, 2}, {2, 3}, {4, 4}} {
		ks = append(ks, mmaKernel{name: fmt.Sprintf("quest_attendmma_bf16_d128_w%ds%d", v.w, v.s), attend: true, warps: v.w, smem: attendSmem(128, v.w, v.s, 8)})
	}
	return ks
}

// useMMA reports whether the tensor-core kernels take this shape: 16-bit
// storage, S = 16, D 64 or 128, at most 16 query heads per KV head.
func useMMA(s kernels.Shape, dt plan.DType) bool {
	return (dt == plan.Float16 || dt == plan.BFloat16) && s.PageSize == 16 && (s.HeadDim == 64 || s.HeadDim == 128) && s.Group() <= 16
}

// useMMA8 reports whether the tensor-core attention takes fp8 records of
// this shape (as useMMA: S = 16, D 64 or 128, at most 16 query heads per KV
// head), unless Config.AttendKernel asks for the CUDA-core kernel
// quest_attend_fp8.
func (b *Backend) useMMA8(s kernels.Shape) bool {
	return s.PageSize == 16 && (s.HeadDim == 64 || s.HeadDim == 128) && s.Group() <= 16 && b.cfg.AttendKernel != fp8CoreAttend
}

// fp8CoreAttend is the CUDA-core attention over fp8 records (kvfp8.cuh).
const fp8CoreAttend = "quest_attend_fp8"

// mmaAttendName picks the attention kernel for heads rows per item: the
// default, or Config.AttendKernel when it is a variant of the default
// (same storage type and D; more than 8 heads need an _h16 kernel).
func (b *Backend) mmaAttendName(s kernels.Shape, dt plan.DType, heads int) (string, error) {
	name := fmt.Sprintf("quest_attendmma_%s_d%d", dt, s.HeadDim)
	if heads > 8 {
		name += "_h16"
	}
	return b.override(b.cfg.AttendKernel, name, heads > 8)
}

// mmaScoreName picks the score kernel, as mmaAttendName does.
func (b *Backend) mmaScoreName(s kernels.Shape, dt plan.DType) (string, error) {
	name := fmt.Sprintf("quest_scoremma_%s_d%d", dt, s.HeadDim)
	if s.Group() > 8 {
		name += "_h16"
	}
	return b.override(b.cfg.ScoreKernel, name, s.Group() > 8)
}

// override returns want when set and a variant of def (def's name plus a
// suffix; an _h16 kernel when h16), else def.
func (b *Backend) override(want, def string, h16 bool) (string, error) {
	if want == "" {
		return def, nil
	}
	if _, ok := b.fn[want]; !ok {
		return "", fmt.Errorf("cuda: no kernel %s", want)
	}
	base := strings.TrimSuffix(def, "_h16")
	if !strings.HasPrefix(want, base) || h16 != strings.HasSuffix(want, "_h16") {
		return "", fmt.Errorf("cuda: kernel %s does not fit this shape (the default is %s)", want, def)
	}
	return want, nil
}
