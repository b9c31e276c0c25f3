package model

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/questrt/questrt/internal/yield"
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

// defaultWorkers is the goroutines of a parallel loop when none are set.
func defaultWorkers() int { return runtime.GOMAXPROCS(0) }

// parallel runs f(i) for i in [0, n) on up to workers goroutines (the
// caller included), handing out indices in order. Every goroutine
// yields now and then between two items (see package yield).
func parallel(workers, n int, f func(worker, i int)) {
	if workers <= 0 {
		workers = defaultWorkers()
	}
	workers = min(workers, n)
	if workers <= 1 {
		for i := range n {
			f(0, i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 1; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			y := yield.New()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(w, i)
				y.Maybe()
			}
		}()
	}
	y := yield.New()
	for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
		f(0, i)
		y.Maybe()
	}
	wg.Wait()
}

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

// expNeg returns e^x for x <= 0 in float32 (about 2 ulp): the softmax
// exponential of the prefill kernel, where math.Exp would be a third of
// the attention time. x below -80 is taken as -80 (like expSumAVX2: the
// result stays a normal number).
func expNeg(x float32) float32 {
	x = max(x, -80)
	// x = n*ln2 + r, |r| <= ln2/2; e^x = 2^n * e^r.
	const log2e = 1.44269504088896341
	const ln2hi, ln2lo = 0.693359375, -2.12194440e-4
	n := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - n*ln2hi - n*ln2lo
	// Cephes expf polynomial on [-ln2/2, ln2/2].
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	e := p*r*r + r + 1
	return e * math.Float32frombits(uint32(int32(n)+127)<<23)
}
