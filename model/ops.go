package model

import (
	"math"

	"github.com/questrt/questrt/internal/parfor"
	"github.com/questrt/questrt/kernels"
)

// dot is the project's AVX2+FMA dot product (kernels.Dot; a portable
// fallback on other CPUs). The Linear layers are tiled dot products over
// it rather than gonum's BLAS: `go test ./model -bench Matmul` runs
// BenchmarkMatmul (this kernel) and BenchmarkMatmulGonum (gonum v0.17.0's
// blas32.Gemm and Gemv) on v2's shapes side by side; for 256-token
// chunks ours is 2.4-4.3x faster (gonum's float32 kernels are SSE, not
// FMA, and do not tile), for one token the two are within noise
// (bench/results/2026-12-01-matmul-gonum.md).
func dot(a, b []float32) float32 { return kernels.Dot(a, b) }

// parallel runs f(i) for i in [0, n) on up to workers goroutines (the
// caller included), handing out indices in order (parfor.Run: every
// goroutine yields now and then between two items).
func parallel(workers, n int, f func(worker, i int)) { parfor.Run(workers, n, f) }

// Tiles of the matrix product: rowTile weight rows (output columns) stay
// in L1/L2 while tokTile tokens pass over them; work units are
// (rowTile rows x tokChunk tokens), so that short outputs (the K and V
// projections) still spread over every core in a prefill.
const (
	rowTile  = 32
	tokTile  = 8
	tokChunk = 64
)

// matmulT sets y[i][j] = x[i] . w[j] for n tokens: x is [n][in], w is
// [out][in] (a Hugging Face Linear weight) and y is [n][out].
func matmulT(workers int, y, x, w []float32, n, in, out int) {
	blocks := (out + rowTile - 1) / rowTile
	chunks := (n + tokChunk - 1) / tokChunk
	parallel(workers, blocks*chunks, func(_, u int) {
		b, c := u%blocks, u/blocks
		j0, j1 := b*rowTile, min((b+1)*rowTile, out)
		for t0 := c * tokChunk; t0 < min((c+1)*tokChunk, n); t0 += tokTile {
			t1 := min(t0+tokTile, n, (c+1)*tokChunk)
			for j := j0; j < j1; j++ {
				wj := w[j*in : (j+1)*in]
				for t := t0; t < t1; t++ {
					y[t*out+j] = dot(x[t*in:(t+1)*in], wj)
				}
			}
		}
	})
}

// rows runs f over [0, n) in chunks of rowsChunk on up to workers
// goroutines (the per-token parts of a prefill: norms, RoPE, SiLU).
func rows(workers, n int, f func(lo, hi int)) {
	const rowsChunk = 64
	parallel(workers, (n+rowsChunk-1)/rowsChunk, func(_, c int) {
		f(c*rowsChunk, min((c+1)*rowsChunk, n))
	})
}

// rmsNorm sets y[t] = x[t] / rms(x[t]) * w for n rows of len(w),
// accumulating the mean square in float64 (Hugging Face's LlamaRMSNorm
// computes it in float32).
func rmsNorm(y, x, w []float32, n int, eps float64) {
	h := len(w)
	for t := range n {
		xt, yt := x[t*h:(t+1)*h], y[t*h:(t+1)*h]
		var ss float64
		for _, v := range xt {
			ss += float64(v) * float64(v)
		}
		r := float32(1 / math.Sqrt(ss/float64(h)+eps))
		for i, v := range xt {
			yt[i] = w[i] * (v * r)
		}
	}
}

// siluMul sets g[i] = silu(g[i]) * u[i].
func siluMul(g, u []float32) {
	u = u[:len(g)]
	for i, x := range g {
		g[i] = float32(float64(x)/(1+math.Exp(-float64(x)))) * u[i]
	}
}

// addTo does x += y.
func addTo(x, y []float32) {
	y = y[:len(x)]
	for i := range x {
		x[i] += y[i]
	}
}
