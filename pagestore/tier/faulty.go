package tier

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Faulty wraps a Tier and injects faults, for failure tests here and in the
// packages above (the page store's residency, the shard's offload and
// prefetch). Set the fields before first use and do not change them
// afterwards; the counters are safe for concurrent use. The zero value of
// every fault field means "no fault", so a Faulty with only Tier set passes
// the conformance suite. Use it by pointer:
//
//	t := &tier.Faulty{Tier: mem, FailRead: 3, Latency: time.Millisecond}
//
// Reads, Writes and Frees are counted separately, from 1, in the order they
// enter Faulty (calls that then fail their argument checks count too). An
// injected failure returns without calling the wrapped tier, so the slot
// keeps what it held; its error wraps [ErrInjected] (and Kind, when set).
type Faulty struct {
	Tier

	// FailRead, FailWrite and FailFree make the n-th Read, Write or Free
	// fail.
	FailRead, FailWrite, FailFree int
	// FailReadSlots makes every Read of these slots fail (a bad sector).
	FailReadSlots []int
	// FailWriteSlots makes every Write of these slots fail.
	FailWriteSlots []int
	// Sticky makes every call after an injected failure fail as well (a
	// dead device rather than one bad request).
	Sticky bool
	// Kind, when set, is wrapped by injected errors besides ErrInjected;
	// for example ErrCorrupt, to look like a checksum failure.
	Kind error

	// Latency is waited before every Read and Write (a slow medium).
	Latency time.Duration
	// Delay is waited, besides Latency, before the DelayRead-th Read and
	// the DelayWrite-th Write.
	Delay                 time.Duration
	DelayRead, DelayWrite int
	// Gate, when set, holds the DelayRead-th Read and the DelayWrite-th
	// Write (after Delay) until it is closed: a call kept in flight for
	// as long as a test needs, whatever the machine's speed.
	Gate <-chan struct{}

	// Waits (Latency, Delay, Gate) end early, failing the call with its
	// context's error or ErrClosed, when ctx ends or Close is called.

	reads, writes, frees atomic.Int64
	failed               atomic.Bool
	once, closeOnce      sync.Once
	closed               chan struct{}
}

var _ Tier = (*Faulty)(nil)

// Reads returns how many Reads have been called.
func (f *Faulty) Reads() int { return int(f.reads.Load()) }

// Writes returns how many Writes have been called.
func (f *Faulty) Writes() int { return int(f.writes.Load()) }

// Frees returns how many Frees have been called.
func (f *Faulty) Frees() int { return int(f.frees.Load()) }

func (f *Faulty) closedCh() chan struct{} {
	f.once.Do(func() { f.closed = make(chan struct{}) })
	return f.closed
}

func (f *Faulty) injected(op string, nth int64, slot int, why string) error {
	f.failed.Store(true)
	if f.Kind != nil {
		return fmt.Errorf("tier: faulty %s #%d slot %d (%s): %w: %w", op, nth, slot, why, f.Kind, ErrInjected)
	}
	return fmt.Errorf("tier: faulty %s #%d slot %d (%s): %w", op, nth, slot, why, ErrInjected)
}

func (f *Faulty) wait(ctx context.Context, d time.Duration, op string, nth int64, slot int) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("tier: faulty %s #%d slot %d delayed: %w", op, nth, slot, ctx.Err())
	case <-f.closedCh():
		return fmt.Errorf("tier: faulty %s #%d slot %d delayed: %w", op, nth, slot, ErrClosed)
	}
}

// before runs the faults of one call: nth is its number in its kind, fail
// its n-th-call setting, slots its failing slots, delayN its n-th-delay
// setting and lat the latency of its kind.
func (f *Faulty) before(ctx context.Context, op string, nth int64, slot, fail int, slots []int, delayN int, lat time.Duration) error {
	if f.Sticky && f.failed.Load() {
		return f.injected(op, nth, slot, "sticky")
	}
	d, gated := lat, delayN > 0 && nth == int64(delayN)
	if gated {
		d += f.Delay
	}
	if err := f.wait(ctx, d, op, nth, slot); err != nil {
		return err
	}
	if gated && f.Gate != nil {
		select {
		case <-f.Gate:
		case <-ctx.Done():
			return fmt.Errorf("tier: faulty %s #%d slot %d gated: %w", op, nth, slot, ctx.Err())
		case <-f.closedCh():
			return fmt.Errorf("tier: faulty %s #%d slot %d gated: %w", op, nth, slot, ErrClosed)
		}
	}
	if fail > 0 && nth == int64(fail) {
		return f.injected(op, nth, slot, "n-th call")
	}
	if slices.Contains(slots, slot) {
		return f.injected(op, nth, slot, "bad slot")
	}
	return nil
}

// Write implements Tier.
func (f *Faulty) Write(ctx context.Context, slot int, payload []byte) error {
	if err := f.before(ctx, "write", f.writes.Add(1), slot, f.FailWrite, f.FailWriteSlots, f.DelayWrite, f.Latency); err != nil {
		return err
	}
	return f.Tier.Write(ctx, slot, payload)
}

// Read implements Tier.
func (f *Faulty) Read(ctx context.Context, slot int, dst []byte) error {
	if err := f.before(ctx, "read", f.reads.Add(1), slot, f.FailRead, f.FailReadSlots, f.DelayRead, f.Latency); err != nil {
		return err
	}
	return f.Tier.Read(ctx, slot, dst)
}

// Free implements Tier.
func (f *Faulty) Free(ctx context.Context, slot int) error {
	if err := f.before(ctx, "free", f.frees.Add(1), slot, f.FailFree, nil, 0, 0); err != nil {
		return err
	}
	return f.Tier.Free(ctx, slot)
}

// Close ends the waits of calls in flight and closes the wrapped tier.
func (f *Faulty) Close() error {
	ch := f.closedCh()
	f.closeOnce.Do(func() { close(ch) })
	return f.Tier.Close()
}
