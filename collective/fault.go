package collective

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Faulty wraps a Transport and injects faults, for failure tests here and in
// the packages above (the engine's). Set the fields before first use and do
// not change them afterwards; counters are safe for concurrent use. The
// zero value of every fault field means "no fault". Use it by pointer:
//
//	tr := &collective.Faulty{Transport: members[2], FailSend: 2}
//
// Calls are counted from 1 in the order they enter Faulty; Send and Recv
// have their own counters and a shared one (for BlockFrom).
type Faulty struct {
	Transport

	// FailSend makes the FailSend-th Send return Err without sending.
	FailSend int
	// FailRecv makes the FailRecv-th Recv return Err without receiving
	// (the message, if any, stays buffered).
	FailRecv int
	// Sticky makes every call after an injected failure fail as well (a
	// dead link rather than one lost message).
	Sticky bool
	// Delay is added before every Send and Recv (honouring ctx).
	Delay time.Duration
	// BlockFrom makes the BlockFrom-th call (Send and Recv together) and
	// every later one block until ctx ends or Close is called, then return
	// the context's (or ErrClosed's) error.
	BlockFrom int
	// Err is the injected error; default ErrInjected.
	Err error

	sends, recvs, calls atomic.Int64
	failed              atomic.Bool
	once, closeOnce     sync.Once
	closed              chan struct{}
}

var _ Transport = (*Faulty)(nil)

func (f *Faulty) closedCh() chan struct{} {
	f.once.Do(func() { f.closed = make(chan struct{}) })
	return f.closed
}

// Sends returns how many Sends have been called.
func (f *Faulty) Sends() int { return int(f.sends.Load()) }

// Recvs returns how many Recvs have been called.
func (f *Faulty) Recvs() int { return int(f.recvs.Load()) }

func (f *Faulty) injected() error {
	if f.Err != nil {
		return f.Err
	}
	return ErrInjected
}

// before runs the faults common to Send and Recv; nth is the call's number
// in its own kind, fail its fault setting.
func (f *Faulty) before(ctx context.Context, nth int64, fail int, what string) error {
	call := f.calls.Add(1)
	if f.Sticky && f.failed.Load() {
		return fmt.Errorf("faulty %s #%d: %w", what, nth, f.injected())
	}
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
			// A delay that outlived the deadline fails the call too:
			// when both are ready, select may take either.
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("faulty %s #%d: %w", what, nth, err)
			}
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("faulty %s #%d: %w", what, nth, ctx.Err())
		case <-f.closedCh():
			t.Stop()
			return fmt.Errorf("faulty %s #%d: %w", what, nth, ErrClosed)
		}
	}
	if f.BlockFrom > 0 && call >= int64(f.BlockFrom) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("faulty %s #%d blocked: %w", what, nth, ctx.Err())
		case <-f.closedCh():
			return fmt.Errorf("faulty %s #%d blocked: %w", what, nth, ErrClosed)
		}
	}
	if fail > 0 && nth == int64(fail) {
		f.failed.Store(true)
		return fmt.Errorf("faulty %s #%d: %w", what, nth, f.injected())
	}
	return nil
}

// Send implements Transport.
func (f *Faulty) Send(ctx context.Context, to int, tag uint64, msg []byte) error {
	if err := f.before(ctx, f.sends.Add(1), f.FailSend, "send"); err != nil {
		return err
	}
	return f.Transport.Send(ctx, to, tag, msg)
}

// Recv implements Transport.
func (f *Faulty) Recv(ctx context.Context, from int, tag uint64) ([]byte, error) {
	if err := f.before(ctx, f.recvs.Add(1), f.FailRecv, "recv"); err != nil {
		return nil, err
	}
	return f.Transport.Recv(ctx, from, tag)
}

// Close unblocks calls blocked by BlockFrom or Delay and closes the wrapped
// transport.
func (f *Faulty) Close() error {
	ch := f.closedCh()
	f.closeOnce.Do(func() { close(ch) })
	return f.Transport.Close()
}
