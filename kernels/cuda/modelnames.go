package cuda

import "fmt"

// modelKernelNames lists the kernels of model.cu that the backend looks
// up by name (no build tag: the PTX check uses it without a GPU).
func modelKernelNames() []string {
	names := []string{"model_rope", "model_silu_mul", "model_argmax"}
	for _, w := range []string{"f32", "bf16"} {
		for _, k := range []string{"embed", "rmsnorm", "fill"} {
			names = append(names, "model_"+k+"_"+w)
		}
		for _, r := range gemvVariants {
			names = append(names, gemvKernel(w, r))
		}
	}
	return names
}

// gemvVariants are the row counts the GEMV kernels are compiled for
// (model_gemv_<W>_r<R>); a launch takes the smallest that holds its rows.
var gemvVariants = [...]int{1, 4, 16}

// gemvKernel names the GEMV kernel of weight type w for r rows.
func gemvKernel(w string, r int) string {
	for _, v := range gemvVariants {
		if r <= v {
			return fmt.Sprintf("model_gemv_%s_r%d", w, v)
		}
	}
	return fmt.Sprintf("model_gemv_%s_r%d", w, gemvVariants[len(gemvVariants)-1])
}
