package pagestore

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/pagestore/tier"
)

// prefetchFixture is one sequence of 10 pages on a device of 4 slots,
// every page written once to the tier, over a Faulty wrapping a memory
// tier (fields set by each test).
type prefetchFixture struct {
	s   *Store
	f   *tier.Faulty
	id  SeqID
	sh  *shadowSeq
	pt  []int32
	buf []byte
}

func newPrefetchFixture(t *testing.T) *prefetchFixture {
	t.Helper()
	c := offConfig(16, 4)
	mem, err := tier.NewMemory(c.Capacity, c.PayloadBytes())
	if err != nil {
		t.Fatal(err)
	}
	f := &tier.Faulty{Tier: mem}
	c.Tier = f
	s := mustStore(t, c)
	rng := rand.New(rand.NewPCG(11, 12))
	id, sh := s.Create(), newShadow(c.Layers)
	k, v := randKV(rng, 10*c.PageSize-1, c.KVHeads*c.HeadDim)
	for l := range c.Layers {
		appendBoth(t, s, id, sh, l, k, v)
	}
	pt := pageTable(t, s, id)
	// Bring every page in and out once: all clean, the tier holds each.
	for _, p := range pt[:9] {
		if err := s.Recall(context.Background(), []int32{p}); err != nil {
			t.Fatal(err)
		}
	}
	checkRes(t, s)
	return &prefetchFixture{s: s, f: f, id: id, sh: sh, pt: pt, buf: make([]byte, c.PayloadBytes())}
}

// holdNextRead keeps the tier's next Read in flight until release is
// called (at the latest when the test ends): the tests below need a read
// in flight for as long as they act, however slow the machine.
func (x *prefetchFixture) holdNextRead(t *testing.T) (release func()) {
	gate := make(chan struct{})
	x.f.Gate, x.f.Delay, x.f.DelayRead = gate, 0, x.f.Reads()+1
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return release
}

// waitUntil polls cond every millisecond for up to 10 s (a bound for a
// hang, not a timing assumption).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("10 s and still not: %s", what)
		}
	}
}

// offloaded returns the pages of the fixture's table that are not
// resident.
func (x *prefetchFixture) offloaded() []int32 {
	var out []int32
	for _, p := range x.pt {
		if x.s.DeviceSlot(p) < 0 {
			out = append(out, p)
		}
	}
	return out
}

// TestPrefetchReserveLoad: reservations take free slots, then clean
// unpinned pages outside keep, never a dirty, pinned or kept page; a
// reserved page is not resident until its read is published; a step's
// recall then finds it resident and counts a prefetch hit; the data are
// the appended ones.
func TestPrefetchReserveLoad(t *testing.T) {
	x := newPrefetchFixture(t)
	s, ctx := x.s, context.Background()
	// The tail page is pinned: never reserved, never a victim.
	tail := x.pt[len(x.pt)-1]
	if fs := s.ReservePrefetch([]int32{tail}, nil, 0, nil); len(fs) != 0 {
		t.Fatalf("reserved the pinned tail page: %v", fs)
	}
	// The fixture left 3 clean unpinned pages resident: the victims.
	res := []int32{}
	for _, p := range x.pt {
		if s.DeviceSlot(p) >= 0 && p != tail {
			res = append(res, p)
		}
	}
	if len(res) != 3 {
		t.Fatalf("resident unpinned pages %v, want 3", res)
	}
	off := x.offloaded()
	keep := res[:1]
	fs := s.ReservePrefetch(off, keep, 0, nil)
	if len(fs) != 2 {
		t.Fatalf("reserved %d pages with 2 clean unkept victims: %v", len(fs), fs)
	}
	if s.DeviceSlot(keep[0]) < 0 || s.DeviceSlot(tail) < 0 {
		t.Fatal("a prefetch evicted a kept or pinned page")
	}
	st := s.ResidencyStats()
	if st.PrefetchPending != 2 || st.PrefetchIssued != 2 || st.Resident != 2 {
		t.Fatalf("after reserving 2: %+v", st)
	}
	for _, f := range fs {
		if s.DeviceSlot(f.Page) >= 0 {
			t.Fatalf("reserved page %d resident before its read", f.Page)
		}
	}
	checkRes(t, s)
	reads := x.f.Reads()
	for _, f := range fs {
		if err := s.LoadPrefetch(ctx, f, x.buf); err != nil {
			t.Fatal(err)
		}
		if got := s.DeviceSlot(f.Page); got != f.Slot {
			t.Fatalf("page %d in slot %d after its prefetch, reserved %d", f.Page, got, f.Slot)
		}
		// A second load of the same reservation does nothing.
		if err := s.LoadPrefetch(ctx, f, x.buf); err != nil {
			t.Fatal(err)
		}
	}
	if x.f.Reads() != reads+2 {
		t.Fatalf("%d tier reads for 2 prefetches", x.f.Reads()-reads)
	}
	checkRes(t, s)
	checkSeq(t, s, x.id, x.sh)
	before, reads := s.ResidencyStats(), x.f.Reads() // checkSeq reads the tier
	if err := s.Recall(ctx, []int32{fs[0].Page, fs[1].Page, keep[0]}); err != nil {
		t.Fatal(err)
	}
	st = s.ResidencyStats()
	if st.Hits-before.Hits != 3 || st.Misses != before.Misses || st.PrefetchHits != 2 || st.PrefetchLoaded != 2 || x.f.Reads() != reads {
		t.Fatalf("recall of 2 prefetched pages and a resident one: %+v (before %+v)", st, before)
	}
	// Now every resident page is needed-or-pinned when kept: nothing is
	// reserved.
	kept := []int32{fs[0].Page, fs[1].Page, keep[0]}
	if fs := s.ReservePrefetch(x.offloaded(), kept, 0, nil); len(fs) != 0 {
		t.Fatalf("reserved %v with every unpinned page kept", fs)
	}
	// A prefetched page evicted before any step used it is wasted.
	more := s.ReservePrefetch(x.offloaded()[:1], nil, 0, nil)
	if len(more) != 1 {
		t.Fatalf("reserved %v", more)
	}
	if err := s.LoadPrefetch(ctx, more[0], x.buf); err != nil {
		t.Fatal(err)
	}
	if err := s.Recall(ctx, x.offloaded()[:3]); err != nil {
		t.Fatal(err)
	}
	if st := s.ResidencyStats(); st.PrefetchWasted == 0 || s.DeviceSlot(more[0].Page) >= 0 {
		t.Fatalf("an unused prefetched page evicted: %+v", st)
	}
	checkRes(t, s)
	checkSeq(t, s, x.id, x.sh)
}

// TestPrefetchDirtyNotEvicted: a prefetch never evicts a page whose only
// current copy is on the device (it would have to write it back).
func TestPrefetchDirtyNotEvicted(t *testing.T) {
	c := offConfig(16, 3)
	s := mustStore(t, c)
	defer s.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	id, sh := s.Create(), newShadow(c.Layers)
	k, v := randKV(rng, 6*c.PageSize, c.KVHeads*c.HeadDim)
	for l := range c.Layers {
		appendBoth(t, s, id, sh, l, k, v)
	}
	// The last 3 pages are resident and dirty (written, never evicted).
	if st := s.ResidencyStats(); st.Resident != 3 || st.CleanResident != 0 {
		t.Fatalf("after the fill: %+v", st)
	}
	pt := pageTable(t, s, id)
	before := s.ResidencyStats()
	if fs := s.ReservePrefetch(pt[:3], nil, 0, nil); len(fs) != 0 {
		t.Fatalf("reserved %v by evicting dirty pages", fs)
	}
	if st := s.ResidencyStats(); st != before {
		t.Fatalf("the refused prefetch changed the pool: %+v, before %+v", st, before)
	}
	checkSeq(t, s, id, sh)
}

// TestPrefetchWaitInFlight: a step that needs a page whose prefetch read
// is in flight waits for it and gets it from the prefetch: one tier read,
// one slot, a prefetch hit.
func TestPrefetchWaitInFlight(t *testing.T) {
	x := newPrefetchFixture(t)
	s, ctx := x.s, context.Background()
	p := x.offloaded()[0]
	fs := s.ReservePrefetch([]int32{p}, nil, 0, nil)
	if len(fs) != 1 {
		t.Fatalf("reserved %v", fs)
	}
	release := x.holdNextRead(t)
	reads := x.f.Reads()
	done := make(chan error, 1)
	go func() { done <- s.LoadPrefetch(ctx, fs[0], x.buf) }()
	waitUntil(t, "the prefetch read started", func() bool { return x.f.Reads() > reads })
	recalled := make(chan error, 1)
	go func() { recalled <- s.Recall(ctx, []int32{p}) }()
	waitUntil(t, "the recall waits for the read in flight", func() bool { return s.ResidencyStats().PrefetchWaits > 0 })
	select {
	case err := <-recalled:
		t.Fatalf("the recall returned (%v) while the read it needs is held", err)
	default:
	}
	release()
	if err := <-recalled; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := s.ResidencyStats()
	if x.f.Reads() != reads+1 || st.PrefetchHits != 1 || st.PrefetchWaits != 1 || st.PrefetchWait <= 0 || s.DeviceSlot(p) != fs[0].Slot {
		t.Fatalf("%d reads, slot %d (reserved %d): %+v", x.f.Reads()-reads, s.DeviceSlot(p), fs[0].Slot, st)
	}
	checkRes(t, s)
	checkSeq(t, s, x.id, x.sh)
}

// TestPrefetchWaitDeadline: a step waiting for a prefetch read in flight
// gives up when its context ends, with the context's error; the read
// still lands and the page is resident afterwards.
func TestPrefetchWaitDeadline(t *testing.T) {
	x := newPrefetchFixture(t)
	s, ctx := x.s, context.Background()
	p := x.offloaded()[0]
	fs := s.ReservePrefetch([]int32{p}, nil, 0, nil)
	release := x.holdNextRead(t)
	reads := x.f.Reads()
	done := make(chan error, 1)
	go func() { done <- s.LoadPrefetch(ctx, fs[0], x.buf) }()
	waitUntil(t, "the prefetch read started", func() bool { return x.f.Reads() > reads })
	dctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := s.Recall(dctx, []int32{p}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("recall past its deadline: %v", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.DeviceSlot(p) != fs[0].Slot {
		t.Fatal("the prefetched page is not resident")
	}
	checkRes(t, s)
	checkSeq(t, s, x.id, x.sh)
}

// TestPrefetchTakeover: a step that needs a reserved page whose read has
// not started reads it itself into the reserved slot; the prefetch then
// does nothing.
func TestPrefetchTakeover(t *testing.T) {
	x := newPrefetchFixture(t)
	s, ctx := x.s, context.Background()
	p := x.offloaded()[0]
	fs := s.ReservePrefetch([]int32{p}, nil, 0, nil)
	reads := x.f.Reads()
	if err := s.Recall(ctx, []int32{p}); err != nil {
		t.Fatal(err)
	}
	if s.DeviceSlot(p) != fs[0].Slot || x.f.Reads() != reads+1 {
		t.Fatalf("slot %d (reserved %d), %d reads", s.DeviceSlot(p), fs[0].Slot, x.f.Reads()-reads)
	}
	if err := s.LoadPrefetch(ctx, fs[0], x.buf); err != nil || x.f.Reads() != reads+1 {
		t.Fatalf("the prefetch after the takeover: %v, %d reads", err, x.f.Reads()-reads)
	}
	st := s.ResidencyStats()
	if st.PrefetchTaken != 1 || st.PrefetchHits != 0 || st.PrefetchPending != 0 {
		t.Fatalf("%+v", st)
	}
	checkRes(t, s)
	checkSeq(t, s, x.id, x.sh)
}

// TestPrefetchRecycled: a reservation of a page that is recycled is
// given back (queued) or discarded when its read ends (in flight); the
// page's next owner never sees the old payload.
func TestPrefetchRecycled(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		x := newPrefetchFixture(t)
		s, ctx := x.s, context.Background()
		c := s.Config()
		fs := s.ReservePrefetch(x.offloaded()[:2], nil, 0, nil)
		if len(fs) != 2 {
			t.Fatalf("reserved %v", fs)
		}
		done := make(chan error, 1)
		release := func() {}
		if inFlight {
			release = x.holdNextRead(t)
			reads := x.f.Reads()
			go func() { done <- s.LoadPrefetch(ctx, fs[0], x.buf) }()
			waitUntil(t, "the prefetch read started", func() bool { return x.f.Reads() > reads })
		}
		if err := s.Release(x.id); err != nil {
			t.Fatal(err)
		}
		checkRes(t, s)
		// The next owner takes the freed pages (last freed first) and
		// writes them: fresh contents, whatever the prefetch read. Its
		// write waits for the read in flight to give the slot back; the
		// read ends once it does.
		var opener sync.WaitGroup
		stop := make(chan struct{})
		var stopOnce sync.Once
		stopOpener := func() { stopOnce.Do(func() { close(stop) }); opener.Wait() }
		t.Cleanup(stopOpener)
		if inFlight {
			opener.Go(func() {
				for s.ResidencyStats().PrefetchWaits == 0 {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
				release()
			})
		}
		rng := rand.New(rand.NewPCG(9, 9))
		b, sh := s.Create(), newShadow(c.Layers)
		k, v := randKV(rng, 10*c.PageSize, c.KVHeads*c.HeadDim)
		for l := range c.Layers {
			appendBoth(t, s, b, sh, l, k, v)
		}
		stopOpener()
		release() // when the writes did not need the read's slot
		if inFlight {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if err := s.LoadPrefetch(ctx, fs[1], x.buf); err != nil {
			t.Fatal(err)
		}
		st := s.ResidencyStats()
		if st.PrefetchPending != 0 || st.PrefetchLoaded != 0 || st.PrefetchWasted != 2 {
			t.Fatalf("in flight %v: %+v", inFlight, st)
		}
		checkRes(t, s)
		checkSeq(t, s, b, sh)
		checkPool(t, s)
	}
}

// TestPrefetchRoom: a step recall that needs the slots that reservations
// hold gives back those whose read has not started and waits for those
// in flight, instead of failing with ErrDeviceFull.
func TestPrefetchRoom(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		x := newPrefetchFixture(t)
		s, ctx := x.s, context.Background()
		off := x.offloaded()
		fs := s.ReservePrefetch(off[:3], nil, 0, nil) // every unpinned slot
		if len(fs) != 3 {
			t.Fatalf("reserved %v", fs)
		}
		done := make(chan error, 1)
		release := func() {}
		if inFlight {
			release = x.holdNextRead(t)
			reads := x.f.Reads()
			go func() {
				var err error
				for _, f := range fs {
					err = errors.Join(err, s.LoadPrefetch(ctx, f, make([]byte, len(x.buf))))
				}
				done <- err
			}()
			waitUntil(t, "the first prefetch read started", func() bool { return x.f.Reads() > reads })
		}
		want := off[3:6]
		if room, _ := s.DeviceRoom(want, nil); room < len(want) {
			t.Fatalf("room %d", room)
		}
		recalled := make(chan error, 1)
		go func() { recalled <- s.Recall(ctx, want) }()
		if inFlight {
			waitUntil(t, "the recall waits for the read in flight", func() bool { return s.ResidencyStats().PrefetchWaits > 0 })
			release()
		}
		if err := <-recalled; err != nil {
			t.Fatalf("in flight %v: recall with the slots reserved: %v", inFlight, err)
		}
		for _, p := range want {
			if s.DeviceSlot(p) < 0 {
				t.Fatalf("page %d not resident", p)
			}
		}
		if inFlight {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		st := s.ResidencyStats()
		if st.PrefetchPending != 0 || st.Resident > st.DeviceBudget || (inFlight && st.PrefetchWaits == 0) || (!inFlight && st.PrefetchWasted != 3) {
			t.Fatalf("in flight %v: %+v", inFlight, st)
		}
		checkRes(t, s)
		checkSeq(t, s, x.id, x.sh)
	}
}

// TestPrefetchReadFault: a failing prefetch read frees its slot and
// leaves the page in the tier; the step that needs the page then reads it
// itself and fails with the tier's error; other pages are unaffected.
func TestPrefetchReadFault(t *testing.T) {
	x := newPrefetchFixture(t)
	s, ctx := x.s, context.Background()
	off := x.offloaded()
	bad := off[0]
	x.f.FailReadSlots = []int{int(bad)}
	fs := s.ReservePrefetch(off[:2], nil, 0, nil)
	if len(fs) != 2 {
		t.Fatalf("reserved %v", fs)
	}
	if err := s.LoadPrefetch(ctx, fs[0], x.buf); !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("prefetch of the unreadable page: %v", err)
	}
	if err := s.LoadPrefetch(ctx, fs[1], x.buf); err != nil {
		t.Fatal(err)
	}
	st := s.ResidencyStats()
	if st.PrefetchFailed != 1 || st.PrefetchLoaded != 1 || st.PrefetchPending != 0 || s.DeviceSlot(bad) >= 0 {
		t.Fatalf("%+v", st)
	}
	checkRes(t, s)
	if err := s.Recall(ctx, []int32{bad}); !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("recall of the unreadable page: %v", err)
	}
	if err := s.Recall(ctx, []int32{off[1]}); err != nil {
		t.Fatal(err)
	}
	x.f.FailReadSlots = nil
	checkRes(t, s)
	checkSeq(t, s, x.id, x.sh)
	// A cancelled context fails the read the same way.
	fs = s.ReservePrefetch(x.offloaded()[:1], nil, 0, nil)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.LoadPrefetch(cctx, fs[0], x.buf); !errors.Is(err, context.Canceled) {
		t.Fatalf("prefetch under a cancelled context: %v", err)
	}
	checkRes(t, s)
	if err := s.LoadPrefetch(ctx, Fetch{Page: 1}, x.buf[:1]); !errors.Is(err, ErrBadShape) {
		t.Fatalf("short buffer: %v", err)
	}
	if err := s.LoadPrefetch(ctx, Fetch{Page: -1}, x.buf); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("page -1: %v", err)
	}
	if !slices.Equal(s.ReservePrefetch([]int32{-1, 99}, nil, 0, nil), nil) {
		t.Fatal("reserved pages outside the pool")
	}
}
