// Package memwatch bounds the resident memory of a test binary. A test
// that runs away allocating (a damaged file whose count is read as
// billions, say) would otherwise be ended by the kernel's OOM killer
// with SIGKILL, and `go test` would print only "signal: killed", naming
// neither the test nor the allocation. Under a watch the binary instead
// writes every goroutine's stack (the running test's among them) and
// the resident size to stderr, and exits with status 3.
package memwatch

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
)

// Period is how often a watch reads the resident size.
const Period = 20 * time.Millisecond

// Watch is a running watch; Stop ends it.
type Watch struct {
	stop chan struct{}
	done sync.WaitGroup
}

// Start watches the process's resident set (Linux: /proc/self/statm;
// elsewhere nothing is watched) and ends the process, with the
// goroutines' stacks on stderr, once it exceeds limit bytes.
func Start(limit int64) *Watch {
	w := &Watch{stop: make(chan struct{})}
	if _, err := RSS(); err != nil {
		return w
	}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		t := time.NewTicker(Period)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			if n, err := RSS(); err == nil && n > limit {
				buf := make([]byte, 16<<20)
				buf = buf[:runtime.Stack(buf, true)]
				fmt.Fprintf(os.Stderr, "memwatch: resident memory %d MB exceeds the test binary's bound of %d MB; the goroutines:\n%s\n", n>>20, limit>>20, buf)
				os.Exit(3)
			}
		}
	}()
	return w
}

// Stop ends the watch and waits for its goroutine.
func (w *Watch) Stop() {
	close(w.stop)
	w.done.Wait()
}

// RSS returns the process's resident set size in bytes.
func RSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(b), &size, &resident); err != nil {
		return 0, fmt.Errorf("memwatch: /proc/self/statm: %w", err)
	}
	return resident * int64(os.Getpagesize()), nil
}
