//go:build !amd64 || purego

package kernels

func dot(a, b []float32) float32          { return dotGeneric(a, b) }
func axpy(alpha float32, x, y []float32)  { axpyGeneric(alpha, x, y) }
func scaleVec(alpha float32, y []float32) { scaleGeneric(alpha, y) }

func dot4(q, k []float32, out *[4]float32) { dot4Generic(q, k, out) }
func gemvT(p, v, acc []float32)            { gemvTGeneric(p, v, acc) }
