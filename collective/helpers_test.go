package collective_test

import (
	"context"
	"sync"
	"time"

	"github.com/questrt/questrt/collective"
)

// Calls that must fail promptly (a peer's bad input, an abort, a closed
// peer) run under promptDeadline, far beyond any scheduling delay of a
// loaded machine, and must return in under promptBound, half of it: a
// call that waited for its deadline instead of the failure cannot pass,
// and one that did not wait cannot miss.
const (
	promptDeadline = 10 * time.Second
	promptBound    = promptDeadline / 2
)

// outcome is one rank's result of a collective call.
type outcome[T any] struct {
	val     T
	err     error
	elapsed time.Duration
}

// runRanks runs f on every rank concurrently and returns each rank's outcome.
func runRanks[T any](n int, f func(r int) (T, error)) []outcome[T] {
	out := make([]outcome[T], n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			start := time.Now()
			v, err := f(r)
			out[r] = outcome[T]{v, err, time.Since(start)}
		})
	}
	wg.Wait()
	return out
}

// newGroups returns the Groups of a fresh in-process group of n, closed at
// cleanup.
func newGroups(n int, wrap func(r int, tr collective.Transport) collective.Transport) ([]*collective.Group, func()) {
	trs := collective.NewInprocGroup(n)
	gs := make([]*collective.Group, n)
	for r, tr := range trs {
		if wrap != nil {
			tr = wrap(r, tr)
			trs[r] = tr
		}
		gs[r] = collective.NewGroup(tr)
	}
	return gs, func() {
		for _, tr := range trs {
			tr.Close()
		}
	}
}

func bg() context.Context { return context.Background() }
