package cuda

import "fmt"

// modelKernelNames lists the kernels of model.cu that the backend looks
// up by name (no build tag: the PTX check uses it without a GPU).
func modelKernelNames() []string {
	names := []string{"model_rope", "model_silu_mul", "model_argmax", "model_sample"}
	for _, w := range []string{"f32", "bf16"} {
		for _, k := range []string{"embed", "rmsnorm", "fill"} {
			names = append(names, "model_"+k+"_"+w)
		}
	}
	for _, v := range GemvKernels() {
		names = append(names, v.name())
	}
	for _, v := range gemvNormKernels() {
		names = append(names, v.name())
	}
	return names
}

// GemvKernel names one compiled variant of the GEMV kernel
// (model_gemv_<W>_r<R>_t<T>_u<U>_n<NA> in model.cu).
type GemvKernel struct {
	// Weights is "bf16" or "f32".
	Weights string
	// Rows is the most activation rows one launch serves (1, 4, 8, 16).
	Rows int
	// Tile is the outputs one warp computes (each x vector loaded serves
	// Tile weight rows).
	Tile int
	// Unroll is the 16-byte loads in flight per lane and weight row.
	Unroll int
	// NoL1 loads the weights without allocating them in L1.
	NoL1 bool
	// Tensor runs on the tensor cores (model_gemvtc_bf16_t<T>_u<U>: bf16
	// weights, Rows 8, Tile 16-output tiles a block; k a multiple of 8).
	Tensor bool
	// Norm fuses the RMSNorm of x in front (the _norm variants; only the
	// defaults, gemvNormKernels, are compiled so).
	Norm bool
}

func (v GemvKernel) name() string {
	norm := ""
	if v.Norm {
		norm = "_norm"
	}
	if v.Tensor {
		return fmt.Sprintf("model_gemvtc_%s_t%d_u%d%s", v.Weights, v.Tile, v.Unroll, norm)
	}
	na := 0
	if v.NoL1 {
		na = 1
	}
	return fmt.Sprintf("model_gemv_%s_r%d_t%d_u%d_n%d%s", v.Weights, v.Rows, v.Tile, v.Unroll, na, norm)
}

// String is the kernel's name.
func (v GemvKernel) String() string { return v.name() }

// GemvKernels lists the compiled GEMV variants (the GEMV_ENTRY lines of
// model.cu, in their order).
func GemvKernels() []GemvKernel {
	bf := func(r, t, u int, na bool) GemvKernel { return GemvKernel{"bf16", r, t, u, na, false, false} }
	f := func(r, t, u int) GemvKernel { return GemvKernel{"f32", r, t, u, true, false, false} }
	tc := func(t, u int) GemvKernel { return GemvKernel{"bf16", 8, t, u, true, true, false} }
	return []GemvKernel{
		bf(1, 1, 4, true), bf(1, 2, 2, true), bf(4, 2, 2, true), bf(8, 2, 2, true), bf(16, 4, 1, true),
		f(1, 1, 4), f(4, 2, 2), f(8, 2, 2), f(16, 2, 2),
		tc(1, 2), tc(1, 4), tc(2, 2),
	}
}

// gemvNormKernels lists the variants compiled with the RMSNorm fused (the
// GEMV_ENTRY_NORM and _norm GEMV_TC lines of model.cu): every variant
// gemvDefault may pick.
func gemvNormKernels() []GemvKernel {
	var out []GemvKernel
	seen := map[GemvKernel]bool{}
	for _, w := range []string{"bf16", "f32"} {
		for _, k8 := range []bool{false, true} {
			for rows := 1; rows <= gemvRows; rows++ {
				v := gemvDefault(w, rows, k8)
				v.Norm = true
				if !seen[v] {
					seen[v] = true
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// gemvRows is the most rows one model_gemv launch serves.
const gemvRows = 16

// gemvRowSizes are the Rows the variants are compiled for, ascending.
var gemvRowSizes = [...]int{1, 4, 8, 16}

// gemvDefault picks the variant for rows activation rows (at most 16) of
// weights w, k8 when the vector path applies: the tile and unroll
// measured best (bench/results/2026-12-06-gemv-h100.md); 2 to 8 rows of
// bf16 run on the tensor cores.
func gemvDefault(w string, rows int, k8 bool) GemvKernel {
	r := gemvRowSizes[len(gemvRowSizes)-1]
	for _, n := range gemvRowSizes {
		if rows <= n {
			r = n
			break
		}
	}
	if w == "f32" {
		if r == 1 {
			return GemvKernel{w, 1, 1, 4, true, false, false}
		}
		return GemvKernel{w, r, 2, 2, true, false, false}
	}
	switch {
	case r == 1:
		return GemvKernel{w, 1, 2, 2, true, false, false}
	case r <= 8 && k8:
		return GemvKernel{w, 8, 1, 4, true, true, false}
	case r == 4:
		return GemvKernel{w, 4, 2, 2, true, false, false}
	case r == 8:
		return GemvKernel{w, 8, 2, 2, true, false, false}
	}
	return GemvKernel{w, 16, 4, 1, true, false, false}
}
