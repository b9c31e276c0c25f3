package kernels

import (
	"sync"
	"sync/atomic"

	"github.com/questrt/questrt/internal/yield"
)

// task is a unit of parallel work: run(worker, i) handles item i using the
// scratch space of worker (0..workers, the caller being the last one).
type task interface {
	run(worker, i int)
}

// job is what one parallel call hands to each worker. It is passed by value
// through channels, so a call allocates nothing.
type job struct {
	t    task
	n    int64
	next *atomic.Int64
	done *sync.WaitGroup
}

// workerPool is a fixed set of goroutines that run the items of one task in
// parallel. The calling goroutine works too. One parallel call at a time (the
// backend serializes calls).
type workerPool struct {
	workers int
	jobs    []chan job
	exited  sync.WaitGroup
	next    atomic.Int64
	done    sync.WaitGroup
}

func newWorkerPool(workers int) *workerPool {
	p := &workerPool{workers: workers, jobs: make([]chan job, workers)}
	for w := range workers {
		ch := make(chan job)
		p.jobs[w] = ch
		p.exited.Add(1)
		go func() {
			defer p.exited.Done()
			for j := range ch {
				j.drain(w)
			}
		}()
	}
	return p
}

func (j job) drain(worker int) {
	y := yield.New()
	for {
		i := j.next.Add(1) - 1
		if i >= j.n {
			break
		}
		j.t.run(worker, int(i))
		y.Maybe()
	}
	j.done.Done()
}

// parallel runs t.run for i in [0, n) on the pool and the caller.
func (p *workerPool) parallel(t task, n int) {
	if n <= 0 {
		return
	}
	helpers := min(p.workers, n-1)
	p.next.Store(0)
	j := job{t: t, n: int64(n), next: &p.next, done: &p.done}
	p.done.Add(helpers + 1)
	for w := range helpers {
		p.jobs[w] <- j
	}
	j.drain(p.workers)
	p.done.Wait()
}

// close stops the workers and waits for them to exit.
func (p *workerPool) close() {
	for _, ch := range p.jobs {
		close(ch)
	}
	p.exited.Wait()
}
