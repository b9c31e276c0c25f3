//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// useAVX2 is fixed at package initialization from CPUID and never changes.
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func dotAVX2(a, b *float32, n int) float32

//go:noescape
func axpyAVX2(alpha float32, x, y *float32, n int)

func dot(a, b []float32) float32 {
	if !useAVX2 || len(a) == 0 {
		return dotGeneric(a, b)
	}
	_ = b[len(a)-1]
	return dotAVX2(&a[0], &b[0], len(a))
}

func axpy(alpha float32, x, y []float32) {
	if !useAVX2 || len(x) == 0 {
		axpyGeneric(alpha, x, y)
		return
	}
	_ = y[len(x)-1]
	axpyAVX2(alpha, &x[0], &y[0], len(x))
}

func scaleVec(alpha float32, y []float32) { scaleGeneric(alpha, y) }
