package cuda

// modelKernelNames lists the kernels of model.cu that the backend looks
// up by name (no build tag: the PTX check uses it without a GPU).
func modelKernelNames() []string {
	names := []string{"model_rope", "model_silu_mul", "model_argmax"}
	for _, w := range []string{"f32", "bf16"} {
		for _, k := range []string{"embed", "rmsnorm", "gemv", "fill"} {
			names = append(names, "model_"+k+"_"+w)
		}
	}
	return names
}
