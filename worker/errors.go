package worker

import (
	"context"
	"errors"

	"github.com/questrt/questrt/collective"
)

// Errors a worker wraps; test with errors.Is. A message refused with
// ErrBadMessage, ErrUnknownSequence, ErrNotHosted, ErrStep, ErrStepOpen or
// ErrTooManySequences changed nothing.
var (
	// ErrBadMessage: a message that is malformed or does not fit the
	// worker (shapes, ranges, layout, non-finite values, lengths that
	// disagree with the rank's pages).
	ErrBadMessage = errors.New("worker: bad message")
	// ErrUnknownSequence: a sequence the worker does not hold.
	ErrUnknownSequence = errors.New("worker: unknown sequence")
	// ErrNotHosted: a rank the worker does not host.
	ErrNotHosted = errors.New("worker: rank not hosted")
	// ErrStep: a step message out of order (no open step, another step's
	// id, a layer not after the last one, a step that already failed).
	ErrStep = errors.New("worker: step out of order")
	// ErrStepOpen: a change to a sequence of the open step, or a
	// BeginStep while a step is open.
	ErrStepOpen = errors.New("worker: a step is open")
	// ErrChanged: the operation failed after it changed a rank's state
	// (a page data error after a write, say); the sequence's ranks may
	// disagree and the coordinator must treat it as broken.
	ErrChanged = errors.New("worker: failed after changing state")
	// ErrTooManySequences: a Create or Fork past the sequences the worker
	// holds at most (Config.MaxSequences).
	ErrTooManySequences = errors.New("worker: too many sequences")
	// ErrClosed: the worker is closed.
	ErrClosed = errors.New("worker: closed")
)

// Cause returns the most telling of errs, nil entries ignored: an error of
// its own over a deadline or cancellation, over an abort a peer reported
// (collective.ErrAborted), so that a step's root cause is reported rather
// than its echoes. It returns nil when every entry is nil.
func Cause(errs ...error) error {
	rank := func(err error) int {
		switch {
		case errors.Is(err, collective.ErrAborted):
			return 0
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			return 1
		}
		return 2
	}
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || rank(err) > rank(first)) {
			first = err
		}
	}
	return first
}
