//go:build !amd64 || purego

package kernels

func dot(a, b []float32) float32          { return dotGeneric(a, b) }
func axpy(alpha float32, x, y []float32)  { axpyGeneric(alpha, x, y) }
func scaleVec(alpha float32, y []float32) { scaleGeneric(alpha, y) }
