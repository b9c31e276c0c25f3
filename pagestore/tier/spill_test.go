package tier_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/pagestore/tier/tiertest"
)

// newSpill returns a Spill over a Memory upper tier and lower, with
// budget payloads above.
func newSpill(t *testing.T, lower tier.Tier, budget int, promote bool) *tier.Spill {
	t.Helper()
	up, err := tier.NewMemory(lower.Slots(), lower.PayloadBytes())
	if err != nil {
		t.Fatal(err)
	}
	s, err := tier.NewSpill(up, lower, tier.SpillConfig{Budget: budget, PromoteOnRead: promote})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newDisk(t *testing.T, slots, size int, d disktier.Durability) *disktier.Tier {
	t.Helper()
	dc := disktier.DefaultConfig()
	dc.Dir, dc.Slots, dc.PayloadBytes, dc.SlotsPerFile, dc.Durability = t.TempDir(), slots, size, 8, d
	dt, err := disktier.Open(dc)
	if err != nil {
		t.Fatal(err)
	}
	return dt
}

// TestSpillConformance runs the Tier suite over Spills whose budgets make
// the suite's writes spill (budget 1, a third of the slots) or never
// spill (every slot), over a memory and a disk lower tier.
func TestSpillConformance(t *testing.T) {
	budgets := map[string]func(slots int) int{
		"budget1":     func(int) int { return 1 },
		"budgetThird": func(slots int) int { return max(1, slots/3) },
		"budgetAll":   func(slots int) int { return slots },
	}
	for _, name := range []string{"budget1", "budgetThird", "budgetAll"} {
		for _, promote := range []bool{false, true} {
			t.Run(fmt.Sprintf("memory/%s/promote=%v", name, promote), func(t *testing.T) {
				tiertest.Run(t, func(t *testing.T, slots, size int) tier.Tier {
					return newSpill(t, newMemory(t, slots, size), budgets[name](slots), promote)
				})
			})
		}
	}
	for _, c := range []struct {
		name    string
		budget  string
		d       disktier.Durability
		promote bool
	}{
		{"disk/budget1/sync-on-write", "budget1", disktier.SyncOnWrite, false},
		{"disk/budgetThird/none", "budgetThird", disktier.SyncNone, false},
		{"disk/budget1/none/promote", "budget1", disktier.SyncNone, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tiertest.Run(t, func(t *testing.T, slots, size int) tier.Tier {
				return newSpill(t, newDisk(t, slots, size, c.d), budgets[c.budget](slots), c.promote)
			})
		})
	}
}

// checkResidency requires every slot of ref to live in exactly one of up
// and low, no other slot in either, at most budget above, and the Spill's
// counters to agree.
func checkResidency(t *testing.T, s *tier.Spill, up, low interface{ Used() []int }, ref map[int][]byte, budget int, step string) {
	t.Helper()
	u, l := up.Used(), low.Used()
	if len(u) > budget {
		t.Fatalf("%s: %d payloads above, budget %d", step, len(u), budget)
	}
	for _, sl := range u {
		if slices.Contains(l, sl) {
			t.Fatalf("%s: slot %d in both tiers", step, sl)
		}
	}
	all := append(slices.Clone(u), l...)
	slices.Sort(all)
	want := make([]int, 0, len(ref))
	for sl := range ref {
		want = append(want, sl)
	}
	slices.Sort(want)
	if !slices.Equal(all, want) {
		t.Fatalf("%s: tiers hold slots %v (above %v, below %v), want %v", step, all, u, l, want)
	}
	st := s.Stats()
	if st.Upper != len(u) || st.Lower != len(l) || st.Budget != budget {
		t.Fatalf("%s: stats %+v, tiers hold %d above and %d below", step, st, len(u), len(l))
	}
	if st.SpilledBytes != st.Spills*int64(s.PayloadBytes()) {
		t.Fatalf("%s: stats %+v: spilled bytes not spills x payload", step, st)
	}
}

// TestSpillProperty runs random Writes, Reads and Frees on Spills with
// small budgets (spills on most Writes) against a map, and checks the
// residency of both tiers after every call; every fifth seed has a disk
// lower tier.
func TestSpillProperty(t *testing.T) {
	const size = 40
	ctx := context.Background()
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 7))
		slots := 2 + rng.IntN(14)
		budget := 1 + rng.IntN(min(4, slots))
		promote := rng.IntN(2) == 0
		t.Run(fmt.Sprintf("seed%d/slots%d/budget%d/promote=%v", seed, slots, budget, promote), func(t *testing.T) {
			up, _ := tier.NewMemory(slots, size)
			var low interface {
				tier.Tier
				Used() []int
			}
			if seed%5 == 0 {
				low = newDisk(t, slots, size, disktier.SyncNone)
			} else {
				low, _ = tier.NewMemory(slots, size)
			}
			s, err := tier.NewSpill(up, low, tier.SpillConfig{Budget: budget, PromoteOnRead: promote})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ref := map[int][]byte{}
			dst := make([]byte, size)
			var reads int64
			for i := range 600 {
				sl := rng.IntN(slots)
				var step string
				switch op := rng.IntN(10); {
				case op < 4:
					p := tiertest.Payload(sl, i, size)
					step = fmt.Sprintf("call %d: Write(%d)", i, sl)
					if err := s.Write(ctx, sl, p); err != nil {
						t.Fatalf("%s: %v", step, err)
					}
					ref[sl] = p
				case op < 8:
					step = fmt.Sprintf("call %d: Read(%d)", i, sl)
					clear(dst)
					err := s.Read(ctx, sl, dst)
					want, ok := ref[sl]
					switch {
					case !ok && !errors.Is(err, tier.ErrEmpty):
						t.Fatalf("%s = %v, want ErrEmpty", step, err)
					case ok && err != nil:
						t.Fatalf("%s: %v", step, err)
					case ok && !bytes.Equal(dst, want):
						t.Fatalf("%s: wrong payload", step)
					}
					if ok {
						reads++
					}
				default:
					step = fmt.Sprintf("call %d: Free(%d)", i, sl)
					err := s.Free(ctx, sl)
					if _, ok := ref[sl]; !ok {
						if !errors.Is(err, tier.ErrEmpty) {
							t.Fatalf("%s = %v, want ErrEmpty", step, err)
						}
					} else if err != nil {
						t.Fatalf("%s: %v", step, err)
					}
					delete(ref, sl)
				}
				checkResidency(t, s, up, low, ref, budget, step)
			}
			st := s.Stats()
			if st.UpperReads+st.LowerReads != reads {
				t.Fatalf("stats %+v: %d reads served, want %d", st, st.UpperReads+st.LowerReads, reads)
			}
			if slots > budget && st.Spills == 0 {
				t.Fatalf("stats %+v: no spill", st)
			}
			if !promote && st.Promotions != 0 {
				t.Fatalf("stats %+v: promotions without PromoteOnRead", st)
			}
			if st.SpillErrors != 0 {
				t.Fatalf("stats %+v: spill errors", st)
			}
		})
	}
}

// TestSpillLRU: the least recently used payload (by Write and Read) is the
// one that spills, and reads count where they were served.
func TestSpillLRU(t *testing.T) {
	const size = 16
	ctx := context.Background()
	up, _ := tier.NewMemory(4, size)
	low, _ := tier.NewMemory(4, size)
	s, err := tier.NewSpill(up, low, tier.SpillConfig{Budget: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dst := make([]byte, size)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Write(ctx, 0, tiertest.Payload(0, 0, size)))
	must(s.Write(ctx, 1, tiertest.Payload(1, 0, size)))
	must(s.Read(ctx, 0, dst))                           // 1 is now the least recent
	must(s.Write(ctx, 2, tiertest.Payload(2, 0, size))) // spills 1
	if got := low.Used(); !slices.Equal(got, []int{1}) {
		t.Fatalf("below: %v, want [1]", got)
	}
	must(s.Read(ctx, 1, dst)) // served below, not promoted
	if got := low.Used(); !slices.Equal(got, []int{1}) {
		t.Fatalf("below after a read: %v, want [1] (no promotion)", got)
	}
	must(s.Write(ctx, 1, tiertest.Payload(1, 1, size))) // lands above: spills 0, frees 1 below
	if got, want := low.Used(), []int{0}; !slices.Equal(got, want) {
		t.Fatalf("below: %v, want %v", got, want)
	}
	st := s.Stats()
	want := tier.SpillStats{Budget: 2, Upper: 2, Lower: 1, Spills: 2, SpilledBytes: 2 * size, UpperReads: 1, LowerReads: 1}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
}

// TestSpillPromote: with PromoteOnRead a read below moves the slot up,
// spilling the least recent upper payload.
func TestSpillPromote(t *testing.T) {
	const size = 16
	ctx := context.Background()
	up, _ := tier.NewMemory(3, size)
	low, _ := tier.NewMemory(3, size)
	s, err := tier.NewSpill(up, low, tier.SpillConfig{Budget: 1, PromoteOnRead: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for sl := range 2 {
		if err := s.Write(ctx, sl, tiertest.Payload(sl, 0, size)); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]byte, size)
	if err := s.Read(ctx, 0, dst); err != nil || !bytes.Equal(dst, tiertest.Payload(0, 0, size)) {
		t.Fatalf("Read(0): %v", err)
	}
	if u, l := up.Used(), low.Used(); !slices.Equal(u, []int{0}) || !slices.Equal(l, []int{1}) {
		t.Fatalf("after promoting 0: above %v below %v, want [0] [1]", u, l)
	}
	if st := s.Stats(); st.Promotions != 1 || st.LowerReads != 1 || st.Spills != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// spillFaulty returns a Spill with budget 2 over 6 slots whose lower tier
// is f (over a Memory), and that Memory.
func spillFaulty(t *testing.T, f *tier.Faulty) (*tier.Spill, *tier.Memory, *tier.Memory) {
	t.Helper()
	const slots, size = 6, 64
	up, _ := tier.NewMemory(slots, size)
	low, _ := tier.NewMemory(slots, size)
	f.Tier = low
	s, err := tier.NewSpill(up, f, tier.SpillConfig{Budget: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, up, low
}

// wantSlots requires every slot of ref to read its payload and the others
// ErrEmpty.
func wantSlots(t *testing.T, s tier.Tier, ref map[int][]byte) {
	t.Helper()
	dst := make([]byte, s.PayloadBytes())
	for sl := range s.Slots() {
		err := s.Read(context.Background(), sl, dst)
		if want, ok := ref[sl]; ok {
			if err != nil || !bytes.Equal(dst, want) {
				t.Errorf("Read(%d): %v (payload equal: %v)", sl, err, bytes.Equal(dst, want))
			}
		} else if !errors.Is(err, tier.ErrEmpty) {
			t.Errorf("Read(%d) = %v, want ErrEmpty", sl, err)
		}
	}
}

// TestSpillFaultySpill: a spill the lower tier refuses fails the Write
// that needed room with the lower error, loses nothing, and leaves the
// written slot as it was; the next Write succeeds.
func TestSpillFaultySpill(t *testing.T) {
	ctx := context.Background()
	f := &tier.Faulty{FailWrite: 3}
	s, up, low := spillFaulty(t, f)
	size := s.PayloadBytes()
	ref := map[int][]byte{}
	for sl := range 4 { // 0, 1 above; 2 and 3 spill 0 and 1 (lower writes 1, 2)
		ref[sl] = tiertest.Payload(sl, 0, size)
		if err := s.Write(ctx, sl, ref[sl]); err != nil {
			t.Fatalf("Write(%d): %v", sl, err)
		}
	}
	err := s.Write(ctx, 4, tiertest.Payload(4, 0, size)) // lower write 3 fails
	if !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("Write(4) with a failing spill = %v, want ErrInjected", err)
	}
	if st := s.Stats(); st.SpillErrors != 1 || st.Spills != 2 || st.Upper != 2 || st.Lower != 2 {
		t.Fatalf("stats %+v", st)
	}
	if u, l := up.Used(), low.Used(); !slices.Equal(u, []int{2, 3}) || !slices.Equal(l, []int{0, 1}) {
		t.Fatalf("above %v below %v, want [2 3] [0 1]", u, l)
	}
	wantSlots(t, s, ref)
	ref[4] = tiertest.Payload(4, 1, size)
	if err := s.Write(ctx, 4, ref[4]); err != nil {
		t.Fatalf("Write(4) again: %v", err)
	}
	wantSlots(t, s, ref)
}

// TestSpillDeadLower: with every lower write failing, the upper payloads
// stay readable and writable, Writes that need room fail, and room made by
// a Free is used.
func TestSpillDeadLower(t *testing.T) {
	ctx := context.Background()
	f := &tier.Faulty{FailWrite: 1, Sticky: true}
	s, _, _ := spillFaulty(t, f)
	size := s.PayloadBytes()
	ref := map[int][]byte{0: tiertest.Payload(0, 0, size), 1: tiertest.Payload(1, 0, size)}
	for sl, p := range ref {
		if err := s.Write(ctx, sl, p); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if err := s.Write(ctx, 2, tiertest.Payload(2, 0, size)); !errors.Is(err, tier.ErrInjected) {
			t.Fatalf("Write(2) over a dead lower tier = %v, want ErrInjected", err)
		}
	}
	ref[0] = tiertest.Payload(0, 1, size)
	if err := s.Write(ctx, 0, ref[0]); err != nil {
		t.Fatalf("overwrite above: %v", err)
	}
	wantSlots(t, s, ref)
	if err := s.Free(ctx, 1); err != nil {
		t.Fatal(err)
	}
	delete(ref, 1)
	ref[2] = tiertest.Payload(2, 0, size)
	if err := s.Write(ctx, 2, ref[2]); err != nil {
		t.Fatalf("Write(2) after a Free: %v", err)
	}
	wantSlots(t, s, ref)
	if st := s.Stats(); st.SpillErrors != 3 || st.Spills != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSpillLowerErrorsPassThrough: a lower Read failing as corrupt and a
// failing lower Free reach the caller with errors.Is intact and change
// nothing; an overwrite of a slot below whose lower Free fails leaves the
// old payload.
func TestSpillLowerErrorsPassThrough(t *testing.T) {
	ctx := context.Background()
	f := &tier.Faulty{FailReadSlots: []int{0}, Kind: tier.ErrCorrupt, FailFree: 1}
	s, _, _ := spillFaulty(t, f)
	size := s.PayloadBytes()
	ref := map[int][]byte{}
	for sl := range 4 { // 0 and 1 spill
		ref[sl] = tiertest.Payload(sl, 0, size)
		if err := s.Write(ctx, sl, ref[sl]); err != nil {
			t.Fatal(err)
		}
	}
	dst := bytes.Repeat([]byte{0xA5}, size)
	err := s.Read(ctx, 0, dst)
	if !errors.Is(err, tier.ErrCorrupt) || !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("Read(0) = %v, want ErrCorrupt and ErrInjected", err)
	}
	if !bytes.Equal(dst, bytes.Repeat([]byte{0xA5}, size)) {
		t.Fatal("a failed Read filled dst")
	}
	if err := s.Free(ctx, 1); !errors.Is(err, tier.ErrInjected) { // lower free 1 fails
		t.Fatalf("Free(1) = %v, want ErrInjected", err)
	}
	f.FailFree = 2
	if err := s.Write(ctx, 1, tiertest.Payload(1, 9, size)); !errors.Is(err, tier.ErrInjected) { // lower free 2 fails
		t.Fatalf("overwrite of slot 1 below with a failing lower Free = %v, want ErrInjected", err)
	}
	f.FailReadSlots = nil
	wantSlots(t, s, ref)
	if st := s.Stats(); st.Upper+st.Lower != 4 || st.Upper > 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSpillContextDuringSpill: a ctx that ends while a slow lower tier
// takes a spill fails the Write with the ctx error and loses nothing.
func TestSpillContextDuringSpill(t *testing.T) {
	f := &tier.Faulty{Latency: 5 * time.Second}
	s, _, _ := spillFaulty(t, f)
	size := s.PayloadBytes()
	bg := context.Background()
	ref := map[int][]byte{0: tiertest.Payload(0, 0, size), 1: tiertest.Payload(1, 0, size)}
	for sl, p := range ref {
		if err := s.Write(bg, sl, p); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := s.Write(ctx, 2, tiertest.Payload(2, 0, size)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write(2) = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("Write took %v after its deadline", d)
	}
	wantSlots(t, s, ref) // upper reads: no lower latency
}

// TestSpillWaitForRoom: a Write that needs room while every upper payload
// is busy in another call's spill waits, ends with its ctx having changed
// nothing, and the spills it waited for lose nothing when they are
// cancelled.
func TestSpillWaitForRoom(t *testing.T) {
	f := &tier.Faulty{Latency: 10 * time.Second}
	s, _, _ := spillFaulty(t, f) // budget 2
	size := s.PayloadBytes()
	bg := context.Background()
	ref := map[int][]byte{0: tiertest.Payload(0, 0, size), 1: tiertest.Payload(1, 0, size)}
	for sl := range 2 {
		if err := s.Write(bg, sl, ref[sl]); err != nil {
			t.Fatal(err)
		}
	}
	// Writes of 3 and 4 spill 0 and 1 into a lower tier that blocks.
	spillCtx, stopSpills := context.WithCancel(bg)
	defer stopSpills()
	done := make(chan error, 2)
	for _, sl := range []int{3, 4} {
		go func() { done <- s.Write(spillCtx, sl, tiertest.Payload(sl, 0, size)) }()
	}
	for f.Writes() < 2 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
	defer cancel()
	err := s.Write(ctx, 5, tiertest.Payload(5, 0, size))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for room") {
		t.Fatalf("Write(5) = %v, want DeadlineExceeded while waiting for room", err)
	}
	if f.Writes() != 2 {
		t.Fatalf("%d lower writes, want the 2 spills only", f.Writes())
	}
	stopSpills()
	for range 2 {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("a Write whose spill was cancelled = %v, want Canceled", err)
		}
	}
	wantSlots(t, s, ref)
	if st := s.Stats(); st.Upper != 2 || st.Lower != 0 || st.SpillErrors != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSpillConcurrent runs workers that own slots and write, read and free
// them at random, with readers of every slot, over a budget of 1 or 3 (every
// Write of a slot below competes for room) and a slow lower tier; run under
// -race. Each worker checks its slots against its own map.
func TestSpillConcurrent(t *testing.T) {
	const workers, per, calls, size = 8, 4, 150, 256
	for _, c := range []struct {
		budget  int
		promote bool
	}{{1, false}, {3, false}, {3, true}} {
		t.Run(fmt.Sprintf("budget%d/promote=%v", c.budget, c.promote), func(t *testing.T) {
			ctx := context.Background()
			up, _ := tier.NewMemory(workers*per, size)
			low, _ := tier.NewMemory(workers*per, size)
			f := &tier.Faulty{Tier: low, Latency: 20 * time.Microsecond}
			s, err := tier.NewSpill(up, f, tier.SpillConfig{Budget: c.budget, PromoteOnRead: c.promote})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var wg sync.WaitGroup
			errs := make(chan error, 2*workers)
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 3))
					ref := map[int][]byte{}
					dst := make([]byte, size)
					for i := range calls {
						sl := w*per + rng.IntN(per)
						switch op := rng.IntN(3); op {
						case 0:
							p := tiertest.Payload(sl, i, size)
							if err := s.Write(ctx, sl, p); err != nil {
								errs <- fmt.Errorf("worker %d Write(%d): %w", w, sl, err)
								return
							}
							ref[sl] = p
						case 1:
							err := s.Read(ctx, sl, dst)
							want, ok := ref[sl]
							if ok && (err != nil || !bytes.Equal(dst, want)) || !ok && !errors.Is(err, tier.ErrEmpty) {
								errs <- fmt.Errorf("worker %d Read(%d) = %v (have payload: %v)", w, sl, err, ok)
								return
							}
						case 2:
							err := s.Free(ctx, sl)
							if _, ok := ref[sl]; ok && err != nil || !ok && !errors.Is(err, tier.ErrEmpty) {
								errs <- fmt.Errorf("worker %d Free(%d) = %v", w, sl, err)
								return
							}
							delete(ref, sl)
						}
					}
					for sl := w * per; sl < (w+1)*per; sl++ {
						err := s.Read(ctx, sl, dst)
						if want, ok := ref[sl]; ok && (err != nil || !bytes.Equal(dst, want)) || !ok && !errors.Is(err, tier.ErrEmpty) {
							errs <- fmt.Errorf("worker %d: final Read(%d) = %v", w, sl, err)
							return
						}
					}
				})
				// A reader of another worker's slots: one whole payload or
				// ErrEmpty.
				wg.Go(func() {
					dst := make([]byte, size)
					for i := range calls {
						sl := ((w+1)%workers)*per + i%per
						if err := s.Read(ctx, sl, dst); err != nil && !errors.Is(err, tier.ErrEmpty) {
							errs <- fmt.Errorf("reader %d Read(%d): %w", w, sl, err)
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
			st := s.Stats()
			if st.Upper > c.budget || st.Spills == 0 {
				t.Errorf("stats %+v", st)
			}
			if u, l := up.Used(), low.Used(); len(u) != st.Upper || len(l) != st.Lower {
				t.Errorf("stats %+v, tiers hold %d above and %d below", st, len(u), len(l))
			}
		})
	}
}

// TestNewSpill: argument checks, and adoption of the payloads of tiers
// with a Used method.
func TestNewSpill(t *testing.T) {
	ctx := context.Background()
	mem := func(slots, size int, used ...int) *tier.Memory {
		m, _ := tier.NewMemory(slots, size)
		for _, sl := range used {
			if err := m.Write(ctx, sl, tiertest.Payload(sl, 0, size)); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	for _, c := range []struct {
		name         string
		upper, lower tier.Tier
		budget       int
		want         error
	}{
		{"budget 0", mem(4, 8), mem(4, 8), 0, tier.ErrSize},
		{"budget over slots", mem(4, 8), mem(4, 8), 5, tier.ErrSize},
		{"slots differ", mem(4, 8), mem(5, 8), 1, tier.ErrSlot},
		{"sizes differ", mem(4, 8), mem(4, 9), 1, tier.ErrSize},
		{"over budget above", mem(4, 8, 0, 1), mem(4, 8), 1, tier.ErrSize},
		{"in both", mem(4, 8, 2), mem(4, 8, 2), 2, nil},
	} {
		_, err := tier.NewSpill(c.upper, c.lower, tier.SpillConfig{Budget: c.budget})
		if err == nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: NewSpill = %v, want an error wrapping %v", c.name, err, c.want)
		}
		// A failed NewSpill closes both tiers.
		if err := c.upper.Write(ctx, 0, make([]byte, c.upper.PayloadBytes())); !errors.Is(err, tier.ErrClosed) {
			t.Errorf("%s: upper after a failed NewSpill: %v, want ErrClosed", c.name, err)
		}
	}
	m := mem(2, 8)
	if _, err := tier.NewSpill(m, m, tier.SpillConfig{Budget: 1}); err == nil {
		t.Error("NewSpill(m, m) succeeded")
	}
	up, low := mem(5, 8, 0, 3), mem(5, 8, 1)
	s, err := tier.NewSpill(up, low, tier.SpillConfig{Budget: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantSlots(t, s, map[int][]byte{0: tiertest.Payload(0, 0, 8), 1: tiertest.Payload(1, 0, 8), 3: tiertest.Payload(3, 0, 8)})
	if st := s.Stats(); st.Upper != 2 || st.Lower != 1 {
		t.Fatalf("adopted: stats %+v", st)
	}
	if err := s.Write(ctx, 4, tiertest.Payload(4, 0, 8)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Upper != 2 || st.Lower != 2 || st.Spills != 1 {
		t.Fatalf("after a write: stats %+v", st)
	}
	// Close closes both tiers.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for name, tr := range map[string]tier.Tier{"upper": up, "lower": low} {
		if err := tr.Free(ctx, 0); !errors.Is(err, tier.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}
