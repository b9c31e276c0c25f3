package tier_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/pagestore/tier/tiertest"
)

func TestFaultyNoFaultsConformance(t *testing.T) {
	tiertest.Run(t, func(t *testing.T, slots, size int) tier.Tier {
		return &tier.Faulty{Tier: newMemory(t, slots, size)}
	})
}

func faultyMem(t *testing.T, f *tier.Faulty) *tier.Faulty {
	t.Helper()
	f.Tier = newMemory(t, 4, 8)
	t.Cleanup(func() { _ = f.Close() })
	ctx := context.Background()
	for s := range 4 {
		if err := f.Tier.Write(ctx, s, make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func TestFaultyNthCall(t *testing.T) {
	ctx := context.Background()
	f := faultyMem(t, &tier.Faulty{FailRead: 2, FailWrite: 3, FailFree: 1})
	buf := make([]byte, 8)
	for i, want := range []bool{false, true, false} {
		err := f.Read(ctx, 0, buf)
		if got := errors.Is(err, tier.ErrInjected); got != want {
			t.Errorf("Read #%d: %v, injected %v", i+1, err, want)
		}
	}
	for i, want := range []bool{false, false, true, false} {
		err := f.Write(ctx, 1, buf)
		if got := errors.Is(err, tier.ErrInjected); got != want {
			t.Errorf("Write #%d: %v, injected %v", i+1, err, want)
		}
	}
	if err := f.Free(ctx, 2); !errors.Is(err, tier.ErrInjected) {
		t.Errorf("Free #1: %v, want injected", err)
	}
	// The failed Free did not reach the tier.
	if err := f.Read(ctx, 2, buf); err != nil {
		t.Errorf("Read after injected Free: %v", err)
	}
	if f.Reads() != 4 || f.Writes() != 4 || f.Frees() != 1 {
		t.Errorf("counters %d %d %d, want 4 4 1", f.Reads(), f.Writes(), f.Frees())
	}
}

func TestFaultyFailedWriteKeepsOld(t *testing.T) {
	ctx := context.Background()
	f := faultyMem(t, &tier.Faulty{FailWrite: 1})
	if err := f.Write(ctx, 0, []byte("newbytes")); !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("Write: %v", err)
	}
	buf := make([]byte, 8)
	if err := f.Read(ctx, 0, buf); err != nil || string(buf) != string(make([]byte, 8)) {
		t.Errorf("Read after failed Write: %q %v, want the old payload", buf, err)
	}
}

func TestFaultySlotsKindSticky(t *testing.T) {
	ctx := context.Background()
	f := faultyMem(t, &tier.Faulty{FailReadSlots: []int{3}, FailWriteSlots: []int{2}, Kind: tier.ErrCorrupt})
	buf := make([]byte, 8)
	for range 2 {
		err := f.Read(ctx, 3, buf)
		if !errors.Is(err, tier.ErrInjected) || !errors.Is(err, tier.ErrCorrupt) {
			t.Errorf("Read(3) = %v, want ErrInjected and ErrCorrupt", err)
		}
		if err := f.Read(ctx, 1, buf); err != nil {
			t.Errorf("Read(1) = %v, want nil", err)
		}
	}
	if err := f.Write(ctx, 2, buf); !errors.Is(err, tier.ErrInjected) {
		t.Errorf("Write(2) = %v, want ErrInjected", err)
	}

	s := faultyMem(t, &tier.Faulty{FailRead: 1, Sticky: true})
	_ = s.Read(ctx, 0, buf)
	if err := s.Write(ctx, 0, buf); !errors.Is(err, tier.ErrInjected) {
		t.Errorf("Write after a sticky failure = %v, want ErrInjected", err)
	}
}

func TestFaultyDelays(t *testing.T) {
	f := faultyMem(t, &tier.Faulty{Delay: time.Hour, DelayRead: 2})
	buf := make([]byte, 8)
	ctx := context.Background()
	if err := f.Read(ctx, 0, buf); err != nil {
		t.Fatalf("Read #1: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := f.Read(short, 0, buf); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("delayed Read = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("delayed Read took %v, want it to end with its context", d)
	}
	if err := f.Read(ctx, 0, buf); err != nil {
		t.Errorf("Read #3: %v", err)
	}

	// Latency on every call; Close ends the wait with ErrClosed.
	l := faultyMem(t, &tier.Faulty{Latency: time.Hour})
	done := make(chan error, 1)
	go func() { done <- l.Write(ctx, 0, buf) }()
	time.Sleep(10 * time.Millisecond)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, tier.ErrClosed) {
			t.Errorf("Write waiting at Close = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a Latency wait")
	}

	m := faultyMem(t, &tier.Faulty{Latency: 2 * time.Millisecond})
	start = time.Now()
	if err := m.Read(ctx, 0, buf); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 2*time.Millisecond {
		t.Errorf("Read with 2ms latency took %v", d)
	}
}
