// Package parfor runs the iterations of a loop on a few goroutines: the
// per-call parallel loops of the CPU model (matrix products, norms) and
// of the kernels' dense causal attention. Each goroutine yields now and
// then between two iterations (see package yield). The kernels' decode
// path uses its own long-lived worker pool instead, which allocates
// nothing per call.
package parfor

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/questrt/questrt/internal/yield"
)

// Workers returns the goroutines of a loop asked for workers (0 or less:
// GOMAXPROCS).
func Workers(workers int) int {
	if workers <= 0 {
		return runtime.GOMAXPROCS(0)
	}
	return workers
}

// Run runs f(worker, i) for i in [0, n) on up to workers goroutines (0 or
// less: GOMAXPROCS; the caller is one of them, worker 0), handing out
// indices in order; worker is below min(Workers(workers), n), so that a
// caller can keep scratch space per worker. Run returns when every
// iteration has.
func Run(workers, n int, f func(worker, i int)) {
	workers = min(Workers(workers), n)
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
