// Package yield lets a long CPU loop give the processor up now and then,
// so that the goroutines the network wakes still run while every P
// computes.
//
// With every P running a worker, Go polls the network only from its
// sysmon thread, and the goroutine it readies (memberlist's probes and
// acks, gRPC streams) waits for the scheduler's 10 ms slices in turn
// behind the workers: on 2 CPUs with 8 busy goroutines a loopback UDP
// echo took p50 147-195 ms and live cluster members were declared dead
// (15 times in 20 s with the test clusters' timings); yielding every
// 200 us or so brought the echo to p50 19-25 ms and the deaths to 0
// (cluster's TestMeasureDetectionUnderLoad, issue 27). A yield costs
// about a microsecond. The kernels' worker pool and the parallel loops of
// package parfor use it.
package yield

import (
	"runtime"
	"time"
)

// Every is how long a loop runs items before it yields.
const Every = 200 * time.Microsecond

// Yielder yields the processor (runtime.Gosched) once Every has passed
// since it was made or last yielded. One per goroutine; the zero value
// yields at its first Maybe.
type Yielder struct{ last time.Time }

// New returns a Yielder whose first period starts now.
func New() Yielder { return Yielder{last: time.Now()} }

// Maybe yields if Every has passed since the last yield; call it between
// items.
func (y *Yielder) Maybe() {
	if time.Since(y.last) >= Every {
		runtime.Gosched()
		y.last = time.Now()
	}
}
