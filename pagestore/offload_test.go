package pagestore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

func offConfig(capacity, budget int) Config {
	return Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 2, HeadDim: 4, PageSize: 4}, Capacity: capacity, DeviceBudget: budget}
}

// checkRes checks the whole store at a quiet point: refcounts, free list,
// page tables and the residency bookkeeping.
func checkRes(t testing.TB, s *Store) {
	t.Helper()
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

func TestOffloadConfig(t *testing.T) {
	ok := offConfig(8, 4)
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	mem, _ := tier.NewMemory(8, ok.PayloadBytes())
	small, _ := tier.NewMemory(7, ok.PayloadBytes())
	wrong, _ := tier.NewMemory(8, ok.PayloadBytes()+1)
	for name, mod := range map[string]func(*Config){
		"budget over capacity": func(c *Config) { c.DeviceBudget = 9 },
		"negative budget":      func(c *Config) { c.DeviceBudget = -1 },
		"tier without budget":  func(c *Config) { c.DeviceBudget, c.Tier = 0, mem },
		"tier too small":       func(c *Config) { c.Tier = small },
		"tier payload size":    func(c *Config) { c.Tier = wrong },
		"negative pins":        func(c *Config) { c.PinLast = -1 },
		"decay":                func(c *Config) { c.Eviction, c.ScoreDecay = EvictScore, 1 },
		"eviction":             func(c *Config) { c.Eviction = 7 },
	} {
		c := ok
		mod(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := NewWithData(ok, &hostData{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewWithData with a budget: %v, want ErrInvalidConfig", err)
	}
	kv, _, _ := ok.PoolBytes()
	full := ok
	full.DeviceBudget = 0
	kvFull, _, _ := full.PoolBytes()
	if kv*2 != kvFull {
		t.Errorf("K/V pool of 4 slots is %d bytes, of 8 pages %d", kv, kvFull)
	}
	hb, _ := ok.HostBytes()
	hbFull, _ := full.HostBytes()
	if want := hbFull - int64(kvFull-kv) + 8*residencyBytesPerPage + 8*int64(ok.PayloadBytes()); hb != want {
		t.Errorf("HostBytes with offload %d, want %d", hb, want)
	}
}

// TestOffloadRecycle is invariant 5 with offload: pages filled, evicted
// to the tier, freed and handed out again start with a fresh summary and
// never read back the previous owner's payload.
func TestOffloadRecycle(t *testing.T) {
	c := offConfig(6, 2)
	s := mustStore(t, c)
	defer s.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	tok := c.KVHeads * c.HeadDim
	a, shA := s.Create(), newShadow(2)
	k, v := randKV(rng, 5*c.PageSize, tok)
	for i := range k {
		k[i] *= 1000
	}
	for l := range 2 {
		appendBoth(t, s, a, shA, l, k, v)
	}
	checkSeq(t, s, a, shA)
	checkRes(t, s)
	if st := s.ResidencyStats(); st.Resident != 2 || st.TierOnly != 3 || st.Evictions == 0 {
		t.Fatalf("after a 5-page fill on 2 slots: %+v", st)
	}
	ptA := pageTable(t, s, a)
	if err := s.Release(a); err != nil {
		t.Fatal(err)
	}
	checkRes(t, s)
	if st := s.ResidencyStats(); st.Resident != 0 || st.TierOnly != 0 || st.Pinned != 0 {
		t.Fatalf("after release: %+v", st)
	}
	b, shB := s.Create(), newShadow(2)
	// Layer 0 only first: layer 1 of the recycled pages must be fresh.
	k2, v2 := randKV(rng, 5*c.PageSize, tok)
	appendBoth(t, s, b, shB, 0, k2, v2)
	ptB := pageTable(t, s, b)
	if !slices.Equal(slices.Sorted(slices.Values(ptB)), slices.Sorted(slices.Values(ptA))) {
		t.Fatalf("B got pages %v, want the recycled %v", ptB, ptA)
	}
	for _, p := range ptB {
		if !isFresh(s, 1, int(p)) {
			t.Fatalf("recycled page %d: layer 1 summary not fresh", p)
		}
	}
	checkSeq(t, s, b, shB)
	appendBoth(t, s, b, shB, 1, k2[:3*c.PageSize*tok], v2[:3*c.PageSize*tok])
	// Bring every page in and out again: the tier must hold B's payloads.
	for _, p := range ptB {
		if err := s.Recall(context.Background(), []int32{p}); err != nil {
			t.Fatal(err)
		}
	}
	checkSeq(t, s, b, shB)
	checkRes(t, s)
	checkPool(t, s)
}

// opsModel drives a plain store and an offloading one through the same
// random operations and compares them after each.
type opsModel struct {
	t           *testing.T
	rng         *rand.Rand
	plain, off  *Store
	ids         [][2]SeqID
	shadow      []*shadowSeq
	maxSeqs     int
	recallLimit int

	// prefetch: reservations are made by the model's "prefetch" op and
	// read synchronously, by loader (a goroutine), or left queued for an
	// operation to take over or for cancel.
	prefetch bool
	loader   *asyncLoader
	queued   []Fetch

	// fp8: the stores hold fp8 records; check compares the offloading
	// store's records and summaries with the plain one's, byte for byte
	// (the shadow holds the float32 originals, not the stored keys).
	fp8 bool
}

// asyncLoader reads prefetch reservations on a goroutine of its own, as
// a shard's prefetcher does.
type asyncLoader struct {
	s    *Store
	ch   chan Fetch
	done chan struct{}
}

func newAsyncLoader(s *Store) *asyncLoader {
	l := &asyncLoader{s: s, ch: make(chan Fetch, 64), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		buf := make([]byte, s.Config().PayloadBytes())
		for f := range l.ch {
			_ = l.s.LoadPrefetch(context.Background(), f, buf) // failures are counted
		}
	}()
	return l
}

// stop waits for the reads queued so far.
func (l *asyncLoader) stop() {
	close(l.ch)
	<-l.done
}

// prefetchOp reserves some pages of one sequence (keeping others) and
// reads the reservations in one of three ways.
func (m *opsModel) prefetchOp() {
	i := m.rng.IntN(len(m.ids))
	pt := pageTable(m.t, m.off, m.ids[i][1])
	m.rng.Shuffle(len(pt), func(a, b int) { pt[a], pt[b] = pt[b], pt[a] })
	keep := pt[:m.rng.IntN(len(pt)+1)/2]
	want := pt[len(keep):]
	var kept []int32 // kept pages resident now: a prefetch never evicts them
	for _, p := range keep {
		if m.off.DeviceSlot(p) >= 0 {
			kept = append(kept, p)
		}
	}
	fs := m.off.ReservePrefetch(want, keep, 0, nil)
	for _, f := range fs {
		if slices.Contains(keep, f.Page) || m.off.DeviceSlot(f.Page) >= 0 {
			m.t.Fatalf("reserved page %d: kept or resident", f.Page)
		}
	}
	for _, p := range kept {
		if m.off.DeviceSlot(p) < 0 {
			m.t.Fatalf("kept page %d evicted by a prefetch", p)
		}
	}
	buf := make([]byte, m.off.Config().PayloadBytes())
	for _, f := range fs {
		switch m.rng.IntN(3) {
		case 0:
			if err := m.off.LoadPrefetch(context.Background(), f, buf); err != nil {
				m.t.Fatal(err)
			}
		case 1:
			m.loader.ch <- f
		default:
			m.queued = append(m.queued, f)
		}
	}
	if len(m.queued) > 8 {
		m.off.CancelPrefetch(m.queued[:4])
		m.queued = slices.Delete(m.queued, 0, 4)
	}
	if len(fs) > 0 && m.rng.IntN(2) == 0 {
		// The next step wants some of them: prefetch hits, waits for
		// reads in flight, and takeovers of queued ones.
		var next []int32
		for _, f := range fs[:1+m.rng.IntN(len(fs))] {
			next = append(next, f.Page)
		}
		if err := m.off.Recall(context.Background(), next); err != nil {
			m.t.Fatalf("recall of %d prefetched pages: %v", len(next), err)
		}
	}
}

func (m *opsModel) check() {
	m.t.Helper()
	for i, id := range m.ids {
		if m.fp8 {
			sameRecords(m.t, m.plain, id[0], m.off, id[1])
		} else {
			checkSeq(m.t, m.plain, id[0], m.shadow[i])
			checkSeq(m.t, m.off, id[1], m.shadow[i])
		}
		if a, b := pageTable(m.t, m.plain, id[0]), pageTable(m.t, m.off, id[1]); !slices.Equal(a, b) {
			m.t.Fatalf("page tables differ: %v / %v", a, b)
		}
	}
	checkPool(m.t, m.off)
	checkRes(m.t, m.off)
	if st := m.off.ResidencyStats(); st.Resident > st.DeviceBudget {
		m.t.Fatalf("resident %d over budget %d", st.Resident, st.DeviceBudget)
	}
}

// run drives the model through ops random operations, checking after
// each (with prefetch: reads on the model's loader, whose queue it
// drains and whose leftover reservations it cancels at the end), and
// returns the offloading store's counters.
func (m *opsModel) run(ops int) ResidencyStats {
	if m.prefetch {
		m.loader = newAsyncLoader(m.off)
	}
	for range ops {
		m.step()
		m.check()
	}
	if m.prefetch {
		m.loader.stop()
		m.off.CancelPrefetch(m.queued)
		m.check()
	}
	st := m.off.ResidencyStats()
	m.t.Logf("%+v", st)
	return st
}

// both runs f on both stores and reports whether it succeeded (on both,
// or on neither: a full pool fails both alike).
func (m *opsModel) both(what string, f func(s *Store, id SeqID) error, i int) bool {
	m.t.Helper()
	e1, e2 := f(m.plain, m.ids[i][0]), f(m.off, m.ids[i][1])
	if (e1 == nil) != (e2 == nil) {
		m.t.Fatalf("%s: plain %v, offload %v", what, e1, e2)
	}
	return e1 == nil
}

func (m *opsModel) step() {
	c := m.plain.Config()
	tok := c.KVHeads * c.HeadDim
	r := m.rng.IntN(10)
	switch {
	case len(m.ids) == 0 || (r == 0 && len(m.ids) < m.maxSeqs):
		m.ids = append(m.ids, [2]SeqID{m.plain.Create(), m.off.Create()})
		m.shadow = append(m.shadow, newShadow(c.Layers))
	case r <= 4: // append to every layer, sometimes one layer at a time in two goes
		i := m.rng.IntN(len(m.ids))
		n := 1 + m.rng.IntN(3*c.PageSize)
		k, v := make([][]float32, c.Layers), make([][]float32, c.Layers)
		for l := range c.Layers {
			k[l], v[l] = randKV(m.rng, n, tok)
		}
		split := 0
		if m.rng.IntN(3) == 0 {
			split = 1 + m.rng.IntN(n)
		}
		for _, part := range [][2]int{{0, split}, {split, n}} {
			if part[0] == part[1] {
				continue
			}
			for l := range c.Layers {
				kk, vv := k[l][part[0]*tok:part[1]*tok], v[l][part[0]*tok:part[1]*tok]
				if !m.both("append", func(s *Store, id SeqID) error { return s.Append(id, l, kk, vv) }, i) {
					continue // the pool is full (in both)
				}
				m.shadow[i].k[l] = append(m.shadow[i].k[l], kk...)
				m.shadow[i].v[l] = append(m.shadow[i].v[l], vv...)
			}
		}
	case r == 5 && len(m.ids) < m.maxSeqs:
		i := m.rng.IntN(len(m.ids))
		a, e1 := m.plain.Fork(m.ids[i][0])
		b, e2 := m.off.Fork(m.ids[i][1])
		if (e1 == nil) != (e2 == nil) {
			m.t.Fatalf("fork: %v / %v", e1, e2)
		}
		if e1 != nil {
			return // uneven layers after an append the full pool refused, in both
		}
		m.ids = append(m.ids, [2]SeqID{a, b})
		m.shadow = append(m.shadow, m.shadow[i].clone())
	case r == 6:
		i := m.rng.IntN(len(m.ids))
		n, _ := m.plain.Len(m.ids[i][0])
		if n == 0 {
			return
		}
		cut := 1 + m.rng.IntN(n)
		if m.both("rollback", func(s *Store, id SeqID) error { return s.Rollback(id, cut) }, i) {
			m.shadow[i].truncate(tok, n-cut)
		}
	case r == 7:
		i := m.rng.IntN(len(m.ids))
		m.both("release", func(s *Store, id SeqID) error { return s.Release(id) }, i)
		m.ids = slices.Delete(m.ids, i, i+1)
		m.shadow = slices.Delete(m.shadow, i, i+1)
	case m.prefetch && r == 8:
		m.prefetchOp()
	default: // a step's recall of some pages of one sequence
		i := m.rng.IntN(len(m.ids))
		pt := pageTable(m.t, m.off, m.ids[i][1])
		m.rng.Shuffle(len(pt), func(a, b int) { pt[a], pt[b] = pt[b], pt[a] })
		pt = pt[:min(len(pt), m.recallLimit)]
		room, _ := m.off.DeviceRoom(pt, nil)
		err := m.off.Recall(context.Background(), pt)
		if (len(pt) <= room) != (err == nil) {
			m.t.Fatalf("recall of %d pages with room %d: %v", len(pt), room, err)
		}
		if err == nil {
			for _, p := range pt {
				if m.off.DeviceSlot(p) < 0 {
					m.t.Fatalf("page %d not resident after its recall", p)
				}
			}
		}
	}
}

// TestOffloadMatchesPlain is a property test: random appends (lagging
// layers included), forks, rollbacks, releases and recalls on a store
// with a small device budget and on one without keep the same page tables
// and the same K/V and summaries, and the residency bookkeeping stays
// consistent; with each eviction policy, over the memory and disk tiers.
func TestOffloadMatchesPlain(t *testing.T) {
	ops := 400
	if testing.Short() {
		ops = 120
	}
	for _, tc := range []struct {
		ev          Eviction
		disk        bool
		first, last int
		prefetch    bool
	}{
		{EvictLRU, false, 0, 1, false}, {EvictScore, false, 1, 2, false}, {EvictLRU, true, 1, 1, false},
		{EvictLRU, false, 0, 1, true}, {EvictScore, false, 1, 2, true}, {EvictLRU, true, 1, 1, true},
	} {
		t.Run(fmt.Sprintf("%v_disk%v_pin%d_%d_prefetch%v", tc.ev, tc.disk, tc.first, tc.last, tc.prefetch), func(t *testing.T) {
			c := offConfig(48, 0)
			plain := mustStore(t, c)
			c.DeviceBudget, c.Eviction, c.PinFirst, c.PinLast = 12, tc.ev, tc.first, tc.last
			if tc.disk {
				c.Tier = testDiskTier(t, c)
			}
			off := mustStore(t, c)
			defer off.Close()
			m := &opsModel{t: t, rng: rand.New(rand.NewPCG(7, uint64(tc.ev)+1)), plain: plain, off: off, maxSeqs: 3, recallLimit: 10, prefetch: tc.prefetch}
			st := m.run(ops)
			if st.Evictions == 0 || st.BytesIn == 0 || st.BytesOut == 0 || st.Hits == 0 || st.Misses == 0 {
				t.Errorf("the workload did not exercise the tier: %+v", st)
			}
			if tc.prefetch && (st.PrefetchIssued == 0 || st.PrefetchLoaded == 0 || st.PrefetchHits == 0 || st.PrefetchTaken == 0 || st.PrefetchPending != 0) {
				t.Errorf("the workload did not exercise prefetch, or left reservations: %+v", st)
			}
		})
	}
}

// TestOffloadReadFault: a failing tier read fails the recall (or the
// rollback) that needs the page, with an error wrapping the tier's
// sentinel, and leaves the store consistent and usable.
func TestOffloadReadFault(t *testing.T) {
	ctx := context.Background()
	c := offConfig(16, 3)
	mem, _ := tier.NewMemory(c.Capacity, c.PayloadBytes())
	c.Tier = mem
	s := mustStore(t, c)
	rng := rand.New(rand.NewPCG(5, 6))
	tok := c.KVHeads * c.HeadDim
	id, sh := s.Create(), newShadow(2)
	k, v := randKV(rng, 6*c.PageSize+2, tok)
	for l := range 2 { // layer 1 brings layer 0's offloaded pages back in
		appendBoth(t, s, id, sh, l, k, v)
	}
	pt := pageTable(t, s, id)
	if st := s.ResidencyStats(); st.TierOnly != 4 || st.BytesIn == 0 {
		t.Fatalf("after a 7-page fill of 2 layers on 3 slots: %+v", st)
	}
	f := &tier.Faulty{Tier: mem, FailRead: 2}
	s.res.tier = f
	if err := s.Recall(ctx, pt[:1]); err != nil { // read #1
		t.Fatal(err)
	}
	err := s.Recall(ctx, pt[1:2]) // read #2 fails
	if !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("recall with a failing read: %v, want ErrInjected", err)
	}
	checkRes(t, s)
	checkSeq(t, s, id, sh)
	if s.DeviceSlot(pt[1]) >= 0 {
		t.Fatal("a page whose read failed is resident")
	}
	if err := s.Recall(ctx, pt[1:3]); err != nil {
		t.Fatalf("recall after the fault: %v", err)
	}
	// A rollback into an offloaded page reads it before changing
	// anything: a failing read fails the rollback cleanly.
	if s.DeviceSlot(pt[4]) >= 0 {
		t.Fatalf("page %d unexpectedly resident", pt[4])
	}
	s.res.tier = &tier.Faulty{Tier: mem, FailReadSlots: []int{int(pt[4])}}
	before := takeSnapshot(t, s, id)
	n, _ := s.Len(id)
	if err := s.Rollback(id, n-(4*c.PageSize+1)); !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("rollback into an unreadable page: %v, want ErrInjected", err)
	}
	after := takeSnapshot(t, s, id)
	before.k, before.v, after.k, after.v = nil, nil, nil, nil // the device pool may differ
	before.equal(t, after)
	checkRes(t, s)
	s.res.tier = mem
	checkSeq(t, s, id, sh)
	if err := s.Rollback(id, n-(4*c.PageSize+1)); err != nil {
		t.Fatal(err)
	}
	sh.truncate(tok, 4*c.PageSize+1)
	checkSeq(t, s, id, sh)
	checkRes(t, s)
}

// TestOffloadWriteBackFault: a failing write-back fails the recall that
// needed the slot and keeps its victim resident, with its data.
func TestOffloadWriteBackFault(t *testing.T) {
	ctx := context.Background()
	c := offConfig(16, 3)
	mem, _ := tier.NewMemory(c.Capacity, c.PayloadBytes())
	c.Tier = mem
	s := mustStore(t, c)
	rng := rand.New(rand.NewPCG(7, 8))
	tok := c.KVHeads * c.HeadDim
	id, sh := s.Create(), newShadow(2)
	k, v := randKV(rng, 4*c.PageSize, tok)
	for l := range 2 {
		appendBoth(t, s, id, sh, l, k, v)
	}
	pt := pageTable(t, s, id) // pt[0] offloaded; pt[1], pt[2] resident and dirty; pt[3] the pinned tail
	if s.DeviceSlot(pt[0]) >= 0 || s.res.clean[pt[1]] {
		t.Fatalf("unexpected residency: slot of page 0 %d, page 1 clean %v", s.DeviceSlot(pt[0]), s.res.clean[pt[1]])
	}
	f := &tier.Faulty{Tier: mem, FailWrite: 1}
	s.res.tier = f
	if err := s.Recall(ctx, pt[:1]); !errors.Is(err, tier.ErrInjected) {
		t.Fatalf("recall needing a failing write-back: %v, want ErrInjected", err)
	}
	if s.DeviceSlot(pt[1]) < 0 || s.DeviceSlot(pt[0]) >= 0 {
		t.Fatal("the victim of a failed write-back left the device, or the page came in")
	}
	checkRes(t, s)
	checkSeq(t, s, id, sh)
	if err := s.Recall(ctx, pt[:1]); err != nil {
		t.Fatal(err)
	}
	checkRes(t, s)
	checkSeq(t, s, id, sh)
}

// TestEvictors checks the eviction order of both policies.
func TestEvictors(t *testing.T) {
	all := allowAll{}
	l, _ := NewEvictor(EvictLRU, 8, 0)
	for p := range int32(4) {
		l.Admit(p, 0)
	}
	l.Touch(0, 1)
	if v := l.Victim(all); v != 1 {
		t.Errorf("LRU victim %d, want 1", v)
	}
	l.Remove(1, false)
	if v := l.Victim(allowAll{not: 2}); v != 3 {
		t.Errorf("LRU victim skipping 2: %d, want 3", v)
	}
	if v := l.Victim(allowAll{none: true}); v != -1 {
		t.Errorf("LRU victim with none eligible: %d", v)
	}
	s, err := NewEvictor(EvictScore, 8, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	for p := range int32(3) {
		s.Admit(p, 0)
	}
	// Page 0 selected often long ago, page 1 once recently, page 2 never
	// since admission.
	for tick := uint64(1); tick <= 4; tick++ {
		s.Touch(0, tick)
	}
	s.Touch(1, 6)
	// At tick 6: page 0 ~ (1+0.5+0.25+0.125+1/16... ) * 0.25, page 1 = 1+1/64, page 2 = 1/64.
	if v := s.Victim(all); v != 2 {
		t.Errorf("score victim %d, want 2 (never used)", v)
	}
	if v := s.Victim(allowAll{not: 2}); v != 0 {
		t.Errorf("score victim skipping 2: %d, want 0 (decayed)", v)
	}
	for tick := uint64(7); tick <= 9; tick++ {
		s.Touch(0, tick)
	}
	if v := s.Victim(allowAll{not: 2}); v != 1 {
		t.Errorf("score victim after reuse of 0: %d, want 1", v)
	}
	// History survives an eviction, not a recycle.
	s.Remove(0, false)
	s.Admit(0, 10)
	if v := s.Victim(allowAll{not: 2}); v != 1 {
		t.Errorf("score victim after readmitting 0: %d, want 1", v)
	}
	s.Remove(0, true)
	s.Admit(0, 10)
	s.Touch(1, 10)
	s.Touch(1, 10)
	if v := s.Victim(allowAll{not: 2}); v != 0 {
		t.Errorf("score victim after recycling 0: %d, want 0", v)
	}
	if _, err := ParseEviction("mru"); !errors.Is(err, ErrInvalidConfig) {
		t.Error("ParseEviction accepted mru")
	}
}

type allowAll struct {
	not  int32
	none bool
}

func (a allowAll) Evictable(p int32) bool { return !a.none && (a.not == 0 || p != a.not) }

// TestOffloadDeviceFull: pins that fill the budget refuse appends that
// need a slot, with nothing changed.
func TestOffloadDeviceFull(t *testing.T) {
	c := offConfig(16, 2)
	c.PinLast = 2
	s := mustStore(t, c)
	rng := rand.New(rand.NewPCG(9, 9))
	tok := c.KVHeads * c.HeadDim
	id, sh := s.Create(), newShadow(2)
	k, v := randKV(rng, 2*c.PageSize, tok)
	for l := range 2 {
		appendBoth(t, s, id, sh, l, k, v)
	}
	before := takeSnapshot(t, s, id)
	k1, v1 := randKV(rng, 1, tok)
	if _, err := s.CheckAppend(id, 0, 1); !errors.Is(err, ErrDeviceFull) {
		t.Fatalf("CheckAppend with every slot pinned: %v", err)
	}
	if err := s.Append(id, 0, k1, v1); !errors.Is(err, ErrDeviceFull) {
		t.Fatalf("append with every slot pinned: %v, want ErrDeviceFull", err)
	}
	takeSnapshot(t, s, id).equal(t, before)
	if err := s.Recall(context.Background(), pageTable(t, s, id)); err != nil {
		t.Fatalf("recall of the pinned pages themselves: %v", err)
	}
	checkRes(t, s)
}

// TestLRUMatchesList drives the LRU evictor and a plain move-to-front
// list (the reference) with the same random admissions, uses, removals
// and victim queries, each query with a random set of refused pages: every
// victim is the same.
func TestLRUMatchesList(t *testing.T) {
	const capacity = 40
	rng := rand.New(rand.NewPCG(26, 1))
	ev, err := NewEvictor(EvictLRU, capacity, 0)
	if err != nil {
		t.Fatal(err)
	}
	var list []int32 // least recently used first
	find := func(p int32) int { return slices.Index(list, p) }
	use := func(p int32) {
		if i := find(p); i >= 0 {
			list = slices.Delete(list, i, i+1)
		}
		list = append(list, p)
	}
	victims := 0
	for op := range 20000 {
		p := int32(rng.IntN(capacity))
		switch r := rng.IntN(10); {
		case r < 2:
			ev.Admit(p, uint64(op))
			use(p)
		case r < 7:
			// The store touches resident pages only.
			if find(p) >= 0 {
				ev.Touch(p, uint64(op))
				use(p)
			}
		case r < 8:
			ev.Remove(p, rng.IntN(2) == 0)
			if i := find(p); i >= 0 {
				list = slices.Delete(list, i, i+1)
			}
		default:
			refuse := refuseSet{}
			for range rng.IntN(capacity) {
				refuse[int32(rng.IntN(capacity))] = true
			}
			want := int32(-1)
			for _, q := range list {
				if !refuse[q] {
					want = q
					break
				}
			}
			if got := ev.Victim(refuse); got != want {
				t.Fatalf("op %d: victim %d, want %d (list %v, refused %v)", op, got, want, list, refuse)
			}
			if want >= 0 && rng.IntN(2) == 0 { // evicted, or kept (a failed write-back)
				ev.Remove(want, false)
				list = slices.DeleteFunc(list, func(q int32) bool { return q == want })
			}
			victims++
		}
	}
	if victims < 1000 {
		t.Fatalf("only %d victim queries", victims)
	}
}

type refuseSet map[int32]bool

func (r refuseSet) Evictable(p int32) bool { return !r[p] }

// testDiskTier opens a disk tier of c's slots and payload in a temporary
// directory (16 slots a file, no syncs), closed with the test.
func testDiskTier(t *testing.T, c Config) *disktier.Tier {
	t.Helper()
	dc := disktier.DefaultConfig()
	dc.Dir, dc.Slots, dc.PayloadBytes, dc.SlotsPerFile = t.TempDir(), c.Capacity, c.PayloadBytes(), 16
	dc.Durability, dc.SlotAlign = disktier.SyncNone, 1
	d, err := disktier.Open(dc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
