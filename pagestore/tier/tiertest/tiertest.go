// Package tiertest is the conformance suite every tier.Tier must pass (the
// in-memory twin and the fault wrapper in package tier, the disk tier in
// pagestore/disktier), in the style of testing/fstest: round trips,
// overwrites, empty and freed slots (ErrEmpty, never stale bytes), slot
// reuse through a tier.Allocator, slot and size checks, concurrent use on
// distinct slots and on one slot, contexts, and Close. Run it under -race.
package tiertest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/pagestore/tier"
)

// NewTier returns a fresh, empty tier of slots slots of payloadBytes bytes.
// The suite closes every tier it is given (Close is called twice: the
// second call must return nil). Implementations that need a directory take
// it from t.TempDir().
type NewTier func(t *testing.T, slots, payloadBytes int) tier.Tier

// CallDeadline is the deadline of the suite's calls that must succeed.
const CallDeadline = 10 * time.Second

// Run runs the suite against newTier.
func Run(t *testing.T, newTier NewTier) {
	tests := []struct {
		name string
		f    func(*testing.T, NewTier)
	}{
		{"Geometry", testGeometry},
		{"RoundTrip", testRoundTrip},
		{"EverySlot", testEverySlot},
		{"Overwrite", testOverwrite},
		{"NoRetain", testNoRetain},
		{"NeverWritten", testNeverWritten},
		{"FreeThenRead", testFreeThenRead},
		{"ReuseNoStale", testReuseNoStale},
		{"SlotRange", testSlotRange},
		{"PayloadSize", testPayloadSize},
		{"ConcurrentDistinct", testConcurrentDistinct},
		{"ConcurrentSameSlot", testConcurrentSameSlot},
		{"Context", testContext},
		{"Close", testClose},
		{"CloseWhileBusy", testCloseWhileBusy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, newTier) })
	}
}

// open returns a tier from newTier, checked for its geometry and closed
// (twice) when the test ends.
func open(t *testing.T, newTier NewTier, slots, size int) tier.Tier {
	t.Helper()
	tr := newTier(t, slots, size)
	if tr == nil {
		t.Fatalf("newTier(%d, %d) returned nil", slots, size)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := tr.Close(); err != nil {
			t.Errorf("second Close: %v, want nil", err)
		}
	})
	if got := tr.Slots(); got != slots {
		t.Fatalf("Slots() = %d, want %d", got, slots)
	}
	if got := tr.PayloadBytes(); got != size {
		t.Fatalf("PayloadBytes() = %d, want %d", got, size)
	}
	return tr
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), CallDeadline)
	t.Cleanup(cancel)
	return ctx
}

// Payload returns the deterministic payload number gen of slot: size
// pseudo-random bytes (splitmix64 seeded by slot and gen).
func Payload(slot, gen, size int) []byte {
	p := make([]byte, size+7)
	x := uint64(slot)*0x9e3779b97f4a7c15 ^ uint64(gen+1)*0xbf58476d1ce4e5b9
	for i := 0; i < size; i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(p[i:], z^(z>>31))
	}
	return p[:size:size]
}

// poison is the byte Read destinations are filled with before a call that
// must fail.
const poison = 0xA5

func poisoned(size int) []byte { return bytes.Repeat([]byte{poison}, size) }

// noPayload reports whether dst holds no payload bytes after a failed Read:
// every byte still poison, or every byte zero.
func noPayload(dst []byte) bool {
	return bytes.Count(dst, []byte{poison}) == len(dst) || bytes.Count(dst, []byte{0}) == len(dst)
}

func mustWrite(t *testing.T, tr tier.Tier, slot int, p []byte) {
	t.Helper()
	if err := tr.Write(ctxT(t), slot, p); err != nil {
		t.Fatalf("Write(slot %d): %v", slot, err)
	}
}

// wantPayload reads slot and requires want.
func wantPayload(t *testing.T, tr tier.Tier, slot int, want []byte) {
	t.Helper()
	dst := poisoned(tr.PayloadBytes())
	if err := tr.Read(ctxT(t), slot, dst); err != nil {
		t.Errorf("Read(slot %d): %v, want its payload", slot, err)
		return
	}
	if !bytes.Equal(dst, want) {
		t.Errorf("Read(slot %d): %s", slot, diff(dst, want))
	}
}

// wantErr reads slot and requires an error wrapping target and no payload
// bytes in dst.
func wantErr(t *testing.T, tr tier.Tier, slot int, target error) {
	t.Helper()
	dst := poisoned(tr.PayloadBytes())
	err := tr.Read(ctxT(t), slot, dst)
	if !errors.Is(err, target) {
		t.Errorf("Read(slot %d) = %v, want %v", slot, err, target)
	}
	if !noPayload(dst) {
		t.Errorf("failed Read(slot %d) left payload bytes in dst", slot)
	}
}

func diff(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d bytes, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			n := 0
			for j := i; j < len(got); j++ {
				if got[j] != want[j] {
					n++
				}
			}
			return fmt.Sprintf("%d bytes differ, first at %d (%#x, want %#x)", n, i, got[i], want[i])
		}
	}
	return "equal"
}

func testGeometry(t *testing.T, newTier NewTier) {
	for _, g := range []struct{ slots, size int }{{1, 1}, {3, 4096 + 13}, {5, 64 << 10}} {
		t.Run(fmt.Sprintf("%dx%d", g.slots, g.size), func(t *testing.T) {
			tr := open(t, newTier, g.slots, g.size)
			p := Payload(g.slots-1, 0, g.size)
			mustWrite(t, tr, g.slots-1, p)
			wantPayload(t, tr, g.slots-1, p)
		})
	}
}

func testRoundTrip(t *testing.T, newTier NewTier) {
	const slots, size = 8, 4096 + 13
	tr := open(t, newTier, slots, size)
	written := map[int][]byte{}
	for _, s := range []int{0, 3, 7} {
		written[s] = Payload(s, 0, size)
		mustWrite(t, tr, s, written[s])
	}
	for s := range slots {
		if p, ok := written[s]; ok {
			wantPayload(t, tr, s, p)
		} else {
			wantErr(t, tr, s, tier.ErrEmpty)
		}
	}
}

func testEverySlot(t *testing.T, newTier NewTier) {
	const slots, size = 17, 1000
	tr := open(t, newTier, slots, size)
	for s := range slots {
		mustWrite(t, tr, s, Payload(s, 1, size))
	}
	for s := slots - 1; s >= 0; s-- {
		wantPayload(t, tr, s, Payload(s, 1, size))
	}
}

func testOverwrite(t *testing.T, newTier NewTier) {
	const slots, size = 4, 4096
	tr := open(t, newTier, slots, size)
	mustWrite(t, tr, 1, Payload(1, 0, size))
	mustWrite(t, tr, 2, Payload(2, 0, size))
	for gen := 1; gen <= 3; gen++ {
		mustWrite(t, tr, 1, Payload(1, gen, size))
		wantPayload(t, tr, 1, Payload(1, gen, size))
	}
	wantPayload(t, tr, 2, Payload(2, 0, size))
}

func testNoRetain(t *testing.T, newTier NewTier) {
	const slots, size = 2, 512
	tr := open(t, newTier, slots, size)
	p := Payload(0, 0, size)
	mustWrite(t, tr, 0, p)
	for i := range p {
		p[i] ^= 0xFF
	}
	wantPayload(t, tr, 0, Payload(0, 0, size))
	dst := make([]byte, size)
	if err := tr.Read(ctxT(t), 0, dst); err != nil {
		t.Fatal(err)
	}
	clear(dst)
	wantPayload(t, tr, 0, Payload(0, 0, size))
}

func testNeverWritten(t *testing.T, newTier NewTier) {
	const slots, size = 3, 256
	tr := open(t, newTier, slots, size)
	for s := range slots {
		wantErr(t, tr, s, tier.ErrEmpty)
		if err := tr.Free(ctxT(t), s); !errors.Is(err, tier.ErrEmpty) {
			t.Errorf("Free(never written slot %d) = %v, want ErrEmpty", s, err)
		}
	}
}

func testFreeThenRead(t *testing.T, newTier NewTier) {
	const slots, size = 4, 4096 + 1
	tr := open(t, newTier, slots, size)
	for s := range slots {
		mustWrite(t, tr, s, Payload(s, 0, size))
	}
	if err := tr.Free(ctxT(t), 2); err != nil {
		t.Fatalf("Free(2): %v", err)
	}
	wantErr(t, tr, 2, tier.ErrEmpty)
	if err := tr.Free(ctxT(t), 2); !errors.Is(err, tier.ErrEmpty) {
		t.Errorf("second Free(2) = %v, want ErrEmpty", err)
	}
	for _, s := range []int{0, 1, 3} {
		wantPayload(t, tr, s, Payload(s, 0, size))
	}
	// Written again, the slot holds the new payload only.
	mustWrite(t, tr, 2, Payload(2, 5, size))
	wantPayload(t, tr, 2, Payload(2, 5, size))
}

// testReuseNoStale recycles slots through an Allocator (free in the tier,
// release, allocate again): a reallocated slot reads ErrEmpty, never the
// previous owner's bytes.
func testReuseNoStale(t *testing.T, newTier NewTier) {
	const slots, size = 12, 2048
	tr := open(t, newTier, slots, size)
	a, err := tier.NewAllocator(slots)
	if err != nil {
		t.Fatal(err)
	}
	owner := map[int]int{} // slot -> gen written
	for i := range slots {
		s, err := a.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, tr, s, Payload(s, i, size))
		owner[s] = i
	}
	if _, err := a.Alloc(); !errors.Is(err, tier.ErrFull) {
		t.Fatalf("Alloc on a full allocator = %v, want ErrFull", err)
	}
	for s := 0; s < slots; s += 2 {
		if err := tr.Free(ctxT(t), s); err != nil {
			t.Fatalf("Free(%d): %v", s, err)
		}
		if err := a.Release(s); err != nil {
			t.Fatal(err)
		}
		delete(owner, s)
	}
	seen := map[int]bool{}
	for range slots / 2 {
		s, err := a.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		if _, live := owner[s]; live || seen[s] {
			t.Fatalf("Alloc returned slot %d, which is allocated", s)
		}
		seen[s] = true
		wantErr(t, tr, s, tier.ErrEmpty)
		mustWrite(t, tr, s, Payload(s, 100+s, size))
	}
	for s := range slots {
		gen, ok := owner[s]
		if !ok {
			gen = 100 + s
		}
		wantPayload(t, tr, s, Payload(s, gen, size))
	}
}

func testSlotRange(t *testing.T, newTier NewTier) {
	const slots, size = 3, 128
	tr := open(t, newTier, slots, size)
	mustWrite(t, tr, 0, Payload(0, 0, size))
	for _, s := range []int{-1, -1 << 40, slots, slots + 1, 1 << 40} {
		p := Payload(0, 9, size)
		if err := tr.Write(ctxT(t), s, p); !errors.Is(err, tier.ErrSlot) {
			t.Errorf("Write(slot %d) = %v, want ErrSlot", s, err)
		}
		wantErr(t, tr, s, tier.ErrSlot)
		if err := tr.Free(ctxT(t), s); !errors.Is(err, tier.ErrSlot) {
			t.Errorf("Free(slot %d) = %v, want ErrSlot", s, err)
		}
	}
	wantPayload(t, tr, 0, Payload(0, 0, size))
}

func testPayloadSize(t *testing.T, newTier NewTier) {
	const slots, size = 2, 4096
	tr := open(t, newTier, slots, size)
	mustWrite(t, tr, 0, Payload(0, 0, size))
	for _, n := range []int{-1, 0, 1, size - 1, size + 1, 2 * size} {
		var p []byte
		if n >= 0 {
			p = Payload(0, 7, n)
		}
		if err := tr.Write(ctxT(t), 0, p); !errors.Is(err, tier.ErrSize) {
			t.Errorf("Write of %d bytes = %v, want ErrSize", n, err)
		}
		if err := tr.Write(ctxT(t), 1, p); !errors.Is(err, tier.ErrSize) {
			t.Errorf("Write of %d bytes to an empty slot = %v, want ErrSize", n, err)
		}
		if n < 0 {
			continue
		}
		dst := poisoned(n)
		if err := tr.Read(ctxT(t), 0, dst); !errors.Is(err, tier.ErrSize) {
			t.Errorf("Read into %d bytes = %v, want ErrSize", n, err)
		}
		if !noPayload(dst) {
			t.Errorf("Read into %d bytes wrote into dst", n)
		}
	}
	wantPayload(t, tr, 0, Payload(0, 0, size))
	wantErr(t, tr, 1, tier.ErrEmpty)
}

// testConcurrentDistinct runs goroutines that each own a set of slots and
// write, read, overwrite and free them; run under -race.
func testConcurrentDistinct(t *testing.T, newTier NewTier) {
	const workers, per, rounds, size = 6, 3, 12, 4096 + 7
	tr := open(t, newTier, workers*per, size)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			dst := make([]byte, size)
			for r := range rounds {
				for i := range per {
					s := w + i*workers
					p := Payload(s, r, size)
					if err := tr.Write(ctx, s, p); err != nil {
						errs <- fmt.Errorf("worker %d Write(%d): %w", w, s, err)
						return
					}
					if err := tr.Read(ctx, s, dst); err != nil {
						errs <- fmt.Errorf("worker %d Read(%d): %w", w, s, err)
						return
					}
					if !bytes.Equal(dst, p) {
						errs <- fmt.Errorf("worker %d Read(%d) round %d: %s", w, s, r, diff(dst, p))
						return
					}
					if (r+i)%3 == 0 {
						if err := tr.Free(ctx, s); err != nil {
							errs <- fmt.Errorf("worker %d Free(%d): %w", w, s, err)
							return
						}
						if err := tr.Read(ctx, s, dst); !errors.Is(err, tier.ErrEmpty) {
							errs <- fmt.Errorf("worker %d Read(freed %d) = %v, want ErrEmpty", w, s, err)
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testConcurrentSameSlot overlaps writers, a freer and readers on one slot:
// every Read returns ErrEmpty or one whole payload that was written.
func testConcurrentSameSlot(t *testing.T, newTier NewTier) {
	const size, writers, readers, rounds = 8192 + 3, 2, 3, 25
	tr := open(t, newTier, 2, size)
	ctx := ctxT(t)
	var pays [writers][rounds][]byte
	for w := range writers {
		for r := range rounds {
			pays[w][r] = Payload(1, w*rounds+r, size)
		}
	}
	known := func(p []byte) bool {
		for w := range writers {
			for r := range rounds {
				if bytes.Equal(p, pays[w][r]) {
					return true
				}
			}
		}
		return false
	}
	mustWrite(t, tr, 1, pays[0][0])
	var wg sync.WaitGroup
	errs := make(chan error, writers+readers+1)
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				if err := tr.Write(ctx, 1, pays[w][r]); err != nil {
					errs <- fmt.Errorf("Write: %w", err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range rounds / 5 {
			if err := tr.Free(ctx, 1); err != nil && !errors.Is(err, tier.ErrEmpty) {
				errs <- fmt.Errorf("Free: %w", err)
				return
			}
		}
	})
	for range readers {
		wg.Go(func() {
			dst := make([]byte, size)
			for range rounds {
				err := tr.Read(ctx, 1, dst)
				switch {
				case errors.Is(err, tier.ErrEmpty):
				case err != nil:
					errs <- fmt.Errorf("Read: %w", err)
					return
				case !known(dst):
					errs <- errors.New("Read returned bytes that no Write wrote (a torn payload)")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	wantErr(t, tr, 0, tier.ErrEmpty)
}

func testContext(t *testing.T, newTier NewTier) {
	const slots, size = 2, 1024
	tr := open(t, newTier, slots, size)
	mustWrite(t, tr, 0, Payload(0, 0, size))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, c := range []struct {
		name string
		ctx  context.Context
		want error
	}{{"cancelled", cancelled, context.Canceled}, {"expired", expired, context.DeadlineExceeded}} {
		if err := tr.Write(c.ctx, 0, Payload(0, 1, size)); !errors.Is(err, c.want) {
			t.Errorf("%s Write = %v, want %v", c.name, err, c.want)
		}
		if err := tr.Write(c.ctx, 1, Payload(1, 1, size)); !errors.Is(err, c.want) {
			t.Errorf("%s Write to an empty slot = %v, want %v", c.name, err, c.want)
		}
		dst := poisoned(size)
		if err := tr.Read(c.ctx, 0, dst); !errors.Is(err, c.want) {
			t.Errorf("%s Read = %v, want %v", c.name, err, c.want)
		}
		if !noPayload(dst) {
			t.Errorf("%s Read wrote into dst", c.name)
		}
		if err := tr.Free(c.ctx, 0); !errors.Is(err, c.want) {
			t.Errorf("%s Free = %v, want %v", c.name, err, c.want)
		}
	}
	wantPayload(t, tr, 0, Payload(0, 0, size))
	wantErr(t, tr, 1, tier.ErrEmpty)
}

func testClose(t *testing.T, newTier NewTier) {
	const slots, size = 3, 1024
	tr := open(t, newTier, slots, size)
	mustWrite(t, tr, 0, Payload(0, 0, size))
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := ctxT(t)
	if err := tr.Write(ctx, 1, Payload(1, 0, size)); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
	dst := poisoned(size)
	if err := tr.Read(ctx, 0, dst); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("Read after Close = %v, want ErrClosed", err)
	}
	if !noPayload(dst) {
		t.Error("Read after Close wrote into dst")
	}
	if err := tr.Free(ctx, 0); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("Free after Close = %v, want ErrClosed", err)
	}
	if tr.Slots() != slots || tr.PayloadBytes() != size {
		t.Errorf("after Close: Slots %d PayloadBytes %d, want %d %d", tr.Slots(), tr.PayloadBytes(), slots, size)
	}
}

// testCloseWhileBusy closes a tier while goroutines use it: every call
// succeeds or fails with ErrClosed (or ErrEmpty), and Close returns.
func testCloseWhileBusy(t *testing.T, newTier NewTier) {
	const slots, size, workers = 8, 4096, 4
	tr := open(t, newTier, slots, size)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	started := make(chan struct{}, workers)
	errs := make(chan error, workers)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var once sync.Once
			signal := func() { once.Do(func() { started <- struct{}{} }) }
			defer signal()
			dst := make([]byte, size)
			for i := 0; ; i++ {
				s := (w + i*workers) % slots
				var err error
				switch i % 3 {
				case 0:
					err = tr.Write(ctx, s, Payload(s, i, size))
				case 1:
					err = tr.Read(ctx, s, dst)
				case 2:
					err = tr.Free(ctx, s)
				}
				if i == 3 {
					signal()
				}
				switch {
				case errors.Is(err, tier.ErrClosed):
					return
				case err != nil && !errors.Is(err, tier.ErrEmpty):
					errs <- fmt.Errorf("worker %d call %d: %w", w, i, err)
					return
				}
				if time.Since(start) > CallDeadline {
					errs <- fmt.Errorf("worker %d: no ErrClosed within %v (%d calls)", w, CallDeadline, i)
					return
				}
			}
		})
	}
	for range workers {
		<-started
	}
	if err := tr.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
