package pagestore

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/plan"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 2, HeadDim: 4, PageSize: 3}, Capacity: 5}
	with := func(f func(*Config)) Config { c := ok; f(&c); return c }
	tests := []struct {
		name    string
		cfg     Config
		wantSub string // "" means valid
	}{
		{"default", DefaultConfig(), ""},
		{"small", ok, ""},
		{"page size 1", with(func(c *Config) { c.PageSize = 1 }), ""},
		{"page size not power of two", with(func(c *Config) { c.PageSize = 12 }), ""},
		{"zero layers", with(func(c *Config) { c.Layers = 0 }), "Layers = 0"},
		{"negative heads", with(func(c *Config) { c.KVHeads = -1 }), "KVHeads = -1"},
		{"zero head dim", with(func(c *Config) { c.HeadDim = 0 }), "HeadDim = 0"},
		{"zero page size", with(func(c *Config) { c.PageSize = 0 }), "PageSize = 0"},
		{"zero capacity", with(func(c *Config) { c.Capacity = 0 }), "Capacity = 0"},
		{"unknown dtype", with(func(c *Config) { c.DType = 9 }), "unknown dtype"},
		{"capacity beyond int32", with(func(c *Config) { c.Capacity = math.MaxInt32 + 1 }), "int32"},
		{"pool overflows int", with(func(c *Config) { c.Capacity = 1 << 30; c.HeadDim = 1 << 30; c.PageSize = 1 << 10 }), "overflows int"},
		{"bytes overflow int", with(func(c *Config) {
			c.Capacity = 1 << 30
			c.HeadDim = 1 << 20
			c.PageSize = 1 << 10
			c.KVHeads = 1
			c.Layers = 8
		}), "overflow int"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.wantSub == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig containing %q", err, tc.wantSub)
			}
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
	// The 16-bit types are valid configs (a device's pools hold them) that
	// New, whose host pools hold float32, refuses.
	for _, dt := range []plan.DType{plan.Float16, plan.BFloat16} {
		c := DefaultConfig()
		c.DType = dt
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(%v) = %v, want nil", dt, err)
		}
		if _, err := New(c); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "reserved for the GPU backend") {
			t.Errorf("New(%v) = %v, want ErrInvalidConfig naming the GPU backend", dt, err)
		}
	}
	kv, sum, err := DefaultConfig().PoolBytes()
	if err != nil || kv != 1<<30 || sum != 64<<20 {
		t.Fatalf("default PoolBytes = %d, %d, %v; want 1 GiB, 64 MiB", kv, sum, err)
	}
}

// TestFigure2 replays the notes' two-page example (Figure 2): S = 3, D = 2,
// page A full, page B with two keys, then (-2,5) appended to B.
func TestFigure2(t *testing.T) {
	s := mustStore(t, Config{Layers: 1, Geometry: plan.Geometry{KVHeads: 1, HeadDim: 2, PageSize: 3}, Capacity: 2})
	id := s.Create()
	// Page A: m_A = (-1,-2), M_A = (3,1); page B: m_B = (0,2), M_B = (1,4).
	keys := []float32{3, 1, 1, -2, -1, 0 /* A */, 1, 2, 0, 4 /* B */}
	vals := make([]float32, len(keys))
	if err := s.Append(id, 0, keys, vals); err != nil {
		t.Fatal(err)
	}
	pt := pageTable(t, s, id)
	if len(pt) != 2 {
		t.Fatalf("page table %v, want 2 pages", pt)
	}
	U := func(page int, q ...float64) float64 {
		mn, mx := s.PageSummary(0, int(pt[page]), 0)
		u := scoreU(q, mn, mx)
		if r := scoreURecord(q, mn, mx); r != u {
			t.Fatalf("record-dot score %v != eq. 3 score %v", r, u)
		}
		return u
	}
	check := func(step string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: U = %v, want %v", step, got, want)
		}
	}
	check("step t, q=(2,-1), A", U(0, 2, -1), 8)
	check("step t, q=(2,-1), B", U(1, 2, -1), 0)
	check("no append, q=(0,1), B", U(1, 0, 1), 4)
	check("no append, q=(0,1), A", U(0, 0, 1), 1)
	if v, err := s.View(id, 0); err != nil || v != (SeqView{Len: 5, Pages: 2, LastPageLen: 2}) {
		t.Fatalf("View = %+v, %v", v, err)
	}

	if err := s.Append(id, 0, []float32{-2, 5}, []float32{0, 0}); err != nil {
		t.Fatal(err)
	}
	mn, mx := s.PageSummary(0, int(pt[1]), 0)
	if !slices.Equal(mn, []float32{-2, 2}) || !slices.Equal(mx, []float32{1, 5}) {
		t.Fatalf("after append m_B = %v, M_B = %v; want (-2,2), (1,5)", mn, mx)
	}
	mn, mx = s.PageSummary(0, int(pt[0]), 0)
	if !slices.Equal(mn, []float32{-1, -2}) || !slices.Equal(mx, []float32{3, 1}) {
		t.Fatalf("page A changed: m_A = %v, M_A = %v", mn, mx)
	}
	check("step t+1, q=(0,1), A", U(0, 0, 1), 1)
	check("step t+1, q=(0,1), B", U(1, 0, 1), 5)
	if got := pageTable(t, s, id); !slices.Equal(got, pt) {
		t.Fatalf("page table changed by a tail append: %v -> %v", pt, got)
	}
}

// TestTailLengths covers tail lengths 1, 15, 16, 17 at S = 16 and S-1, S,
// S+1 for other S, with prefill, one-token decode and chunked appends, two
// layers (the second one lagging) and three heads.
func TestTailLengths(t *testing.T) {
	type tc struct{ S, n int }
	var cases []tc
	for _, n := range []int{1, 15, 16, 17} {
		cases = append(cases, tc{16, n})
	}
	for _, S := range []int{1, 4, 64} {
		for _, n := range []int{S - 1, S, S + 1} {
			if n > 0 {
				cases = append(cases, tc{S, n})
			}
		}
	}
	modes := []struct {
		name  string
		chunk func(S int) int
	}{
		{"prefill", func(int) int { return 1 << 30 }},
		{"decode", func(int) int { return 1 }},
		{"chunk3", func(int) int { return 3 }},
	}
	const L, H, D = 2, 3, 4
	for _, c := range cases {
		for _, m := range modes {
			t.Run(fmt.Sprintf("S=%d/n=%d/%s", c.S, c.n, m.name), func(t *testing.T) {
				cfg := Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: c.S}, Capacity: (c.n+c.S-1)/c.S + 3}
				s := mustStore(t, cfg)
				rng := rand.New(rand.NewPCG(uint64(c.S), uint64(c.n)))
				id := s.Create()
				sh := newShadow(L)
				k, v := randKV(rng, c.n, H*D)
				lag := c.n / 2 // layer 1 only gets the first half
				for l, n := range []int{c.n, lag} {
					for i := 0; i < n; {
						e := min(n, i+m.chunk(c.S))
						appendBoth(t, s, id, sh, l, k[i*H*D:e*H*D], v[i*H*D:e*H*D])
						i = e
					}
				}
				checkSeq(t, s, id, sh)
				checkPool(t, s)
				// Pages not in the table were never allocated: fresh.
				pt := pageTable(t, s, id)
				for p := range cfg.Capacity {
					if !slices.Contains(pt, int32(p)) {
						for l := range L {
							if !isFresh(s, l, p) {
								t.Fatalf("unallocated page %d layer %d has a non-fresh summary", p, l)
							}
						}
					}
				}
				// Bring layer 1 level and check again.
				appendBoth(t, s, id, sh, 1, k[lag*H*D:], v[lag*H*D:])
				checkSeq(t, s, id, sh)
				if n, _ := s.Len(id); n != c.n {
					t.Fatalf("Len = %d, want %d", n, c.n)
				}
			})
		}
	}
}

func TestRecycle(t *testing.T) {
	const S, H, D = 4, 2, 3
	s := mustStore(t, Config{Layers: 2, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 2})
	rng := rand.New(rand.NewPCG(1, 2))
	a := s.Create()
	shA := newShadow(2)
	k, v := randKV(rng, 2*S, H*D)
	for i := range k { // extreme keys that must not survive recycling
		k[i] *= 1000
	}
	appendBoth(t, s, a, shA, 0, k, v)
	appendBoth(t, s, a, shA, 1, k, v)
	checkSeq(t, s, a, shA)
	ptA := pageTable(t, s, a)
	if st := s.Stats(); st.FreePages != 0 || st.UsedPages != 2 {
		t.Fatalf("stats %+v, want pool full", st)
	}
	if err := s.Release(a); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.FreePages != 2 || st.UsedPages != 0 || st.Sequences != 0 {
		t.Fatalf("stats after release %+v", st)
	}
	if _, err := s.Len(a); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("Len of released seq: %v", err)
	}
	if err := s.Release(a); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("double release: %v", err)
	}

	b := s.Create()
	shB := newShadow(2)
	// Fill both pages in layer 0 only: layer 1 of the recycled pages must be
	// fresh although it held A's extreme keys.
	k2, v2 := randKV(rng, 2*S, H*D)
	appendBoth(t, s, b, shB, 0, k2[:H*D], v2[:H*D])
	appendBoth(t, s, b, shB, 0, k2[H*D:], v2[H*D:])
	ptB := pageTable(t, s, b)
	if !slices.Equal(slices.Sorted(slices.Values(ptB)), slices.Sorted(slices.Values(ptA))) {
		t.Fatalf("B got pages %v, want the recycled %v", ptB, ptA)
	}
	for _, p := range ptB {
		if !isFresh(s, 1, int(p)) {
			t.Fatalf("recycled page %d: layer 1 summary not fresh before writes", p)
		}
	}
	checkSeq(t, s, b, shB) // layer 0 equals naive over B's keys only
	appendBoth(t, s, b, shB, 1, k2[:S*H*D+H*D], v2[:S*H*D+H*D])
	checkSeq(t, s, b, shB)
	checkPool(t, s)
}

func TestForkIsolation(t *testing.T) {
	const L, S, H, D = 2, 4, 2, 3
	for _, forkLen := range []int{10, 8, 3, 0} {
		t.Run(fmt.Sprintf("len=%d", forkLen), func(t *testing.T) {
			s := mustStore(t, Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 32})
			rng := rand.New(rand.NewPCG(3, uint64(forkLen)))
			par := s.Create()
			shP := newShadow(L)
			if forkLen > 0 {
				k, v := randKV(rng, forkLen, H*D)
				for l := range L {
					appendBoth(t, s, par, shP, l, k, v)
				}
			}
			ptBefore := pageTable(t, s, par)
			child, err := s.Fork(par)
			if err != nil {
				t.Fatal(err)
			}
			shC := shP.clone()
			if got := pageTable(t, s, child); !slices.Equal(got, ptBefore) {
				t.Fatalf("child page table %v, want parent's %v", got, ptBefore)
			}
			if st := s.Stats(); st.SharedPages != len(ptBefore) || st.Sequences != 2 {
				t.Fatalf("after fork: %+v, want %d shared pages", st, len(ptBefore))
			}
			checkPool(t, s)

			// Child writes first (copies the shared tail), layer by layer.
			for l := range L {
				k, v := randKV(rng, 1, H*D)
				appendBoth(t, s, child, shC, l, k, v)
			}
			// Then the parent (its tail is private again when partial).
			for l := range L {
				k, v := randKV(rng, 3, H*D)
				appendBoth(t, s, par, shP, l, k, v)
			}
			// And a longer child append.
			for l := range L {
				k, v := randKV(rng, 6, H*D)
				appendBoth(t, s, child, shC, l, k, v)
			}
			checkSeq(t, s, par, shP)
			checkSeq(t, s, child, shC)
			checkPool(t, s)

			ptP, ptC := pageTable(t, s, par), pageTable(t, s, child)
			sealed := forkLen / S
			for p := range ptBefore {
				if p < sealed {
					if ptP[p] != ptBefore[p] || ptC[p] != ptBefore[p] {
						t.Fatalf("sealed page %d not shared: parent %v child %v before %v", p, ptP, ptC, ptBefore)
					}
				} else if ptP[p] == ptC[p] {
					t.Fatalf("partial tail page %d still shared after writes: parent %v child %v", p, ptP, ptC)
				}
			}
			for p := len(ptBefore); p < min(len(ptP), len(ptC)); p++ {
				if ptP[p] == ptC[p] {
					t.Fatalf("page %d allocated after the fork is shared", p)
				}
			}
			if st := s.Stats(); st.SharedPages != sealed {
				t.Fatalf("shared pages %d, want %d", st.SharedPages, sealed)
			}
			// Releasing one branch leaves the other intact.
			if err := s.Release(child); err != nil {
				t.Fatal(err)
			}
			checkSeq(t, s, par, shP)
			checkPool(t, s)
		})
	}
}

// TestForkThreeWays shares one tail among three branches: the first two
// writers copy it, the last one writes in place.
func TestForkThreeWays(t *testing.T) {
	const S, H, D = 4, 1, 2
	s := mustStore(t, Config{Layers: 1, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 8})
	rng := rand.New(rand.NewPCG(5, 5))
	a := s.Create()
	sh := map[SeqID]*shadowSeq{a: newShadow(1)}
	k, v := randKV(rng, 6, H*D)
	appendBoth(t, s, a, sh[a], 0, k, v)
	b, _ := s.Fork(a)
	c, _ := s.Fork(b)
	sh[b], sh[c] = sh[a].clone(), sh[a].clone()
	tail := pageTable(t, s, a)[1]
	for i, id := range []SeqID{a, c, b} {
		k, v := randKV(rng, 1, H*D)
		appendBoth(t, s, id, sh[id], 0, k, v)
		got := pageTable(t, s, id)[1]
		if inPlace := got == tail; inPlace != (i == 2) {
			t.Fatalf("writer %d: tail %d (shared tail was %d)", i, got, tail)
		}
	}
	for id, x := range sh {
		checkSeq(t, s, id, x)
	}
	checkPool(t, s)
}

func TestRollback(t *testing.T) {
	const L, S, H, D = 2, 4, 2, 3
	tests := []struct {
		name      string
		n         int // initial length
		forkFirst bool
		back      int
		wantFreed int // pages returned to the free list
	}{
		{"inside tail page", 10, false, 1, 0},
		{"to page boundary", 10, false, 2, 1},
		{"across pages into sealed page", 10, false, 5, 1},
		{"across several pages", 15, false, 10, 2},
		{"to zero", 10, false, 10, 3},
		{"shared tail inside", 10, true, 1, -1},     // COW: one page taken
		{"shared tail to boundary", 10, true, 2, 0}, // drops a shared page
		{"shared sealed page reopened", 10, true, 3, -1},
		{"shared to zero", 10, true, 10, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustStore(t, Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 16})
			rng := rand.New(rand.NewPCG(7, uint64(tc.n*100+tc.back)))
			id := s.Create()
			sh := newShadow(L)
			k, v := randKV(rng, tc.n, H*D)
			// The rolled-back tokens carry the extremes of their pages.
			for i := (tc.n - tc.back) * H * D; i < len(k); i++ {
				k[i] = float32(1000 * (1 - 2*(i%2)))
			}
			for l := range L {
				appendBoth(t, s, id, sh, l, k, v)
			}
			var other SeqID
			var shO *shadowSeq
			if tc.forkFirst {
				var err error
				if other, err = s.Fork(id); err != nil {
					t.Fatal(err)
				}
				shO = sh.clone()
			}
			before := s.Stats()
			if err := s.Rollback(id, tc.back); err != nil {
				t.Fatal(err)
			}
			sh.truncate(H*D, tc.n-tc.back)
			checkSeq(t, s, id, sh)
			if tc.forkFirst {
				checkSeq(t, s, other, shO) // the sibling keeps its tokens
			}
			checkPool(t, s)
			if got := s.Stats().FreePages - before.FreePages; got != tc.wantFreed {
				t.Fatalf("free pages changed by %d, want %d", got, tc.wantFreed)
			}
			for l := range L { // no rolled-back extreme is left in any summary
				pt := pageTable(t, s, id)
				for _, p := range pt {
					for h := range H {
						mn, mx := s.PageSummary(l, int(p), h)
						if slices.Contains(mn, -1000) || slices.Contains(mx, 1000) {
							t.Fatalf("layer %d page %d head %d keeps a rolled-back extreme: %v %v", l, p, h, mn, mx)
						}
					}
				}
			}
			// The sequence keeps working after the rollback.
			for l := range L {
				k, v := randKV(rng, 5, H*D)
				appendBoth(t, s, id, sh, l, k, v)
			}
			checkSeq(t, s, id, sh)
			if tc.forkFirst {
				checkSeq(t, s, other, shO)
			}
			checkPool(t, s)
		})
	}
}

func TestPoolExhaustion(t *testing.T) {
	const S, H, D = 4, 2, 2
	s := mustStore(t, Config{Layers: 2, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 4})
	rng := rand.New(rand.NewPCG(9, 9))
	id := s.Create()
	sh := newShadow(2)
	k, v := randKV(rng, 10, H*D)
	appendBoth(t, s, id, sh, 0, k, v) // layer 0: 3 pages
	expectExhausted := func(what string, f func() error) {
		t.Helper()
		before := takeSnapshot(t, s, id)
		err := f()
		if !errors.Is(err, ErrPoolExhausted) {
			t.Fatalf("%s: err = %v, want ErrPoolExhausted", what, err)
		}
		takeSnapshot(t, s, id).equal(t, before)
	}
	big, bigV := randKV(rng, 7, H*D)
	expectExhausted("append needing 2 pages with 1 free", func() error { return s.Append(id, 0, big, bigV) })
	huge, hugeV := randKV(rng, 100, H*D)
	expectExhausted("append larger than the pool", func() error { return s.Append(id, 0, huge, hugeV) })
	checkSeq(t, s, id, sh)

	// A lagging layer needs no page; a smaller append still fits.
	appendBoth(t, s, id, sh, 1, k, v)
	appendBoth(t, s, id, sh, 0, big[:6*H*D], bigV[:6*H*D]) // 16 tokens: 4 pages
	if st := s.Stats(); st.FreePages != 0 {
		t.Fatalf("stats %+v, want full pool", st)
	}
	appendBoth(t, s, id, sh, 1, big[:6*H*D], bigV[:6*H*D])
	checkSeq(t, s, id, sh)
	one, oneV := randKV(rng, 1, H*D)
	expectExhausted("append on a full pool", func() error { return s.Append(id, 0, one, oneV) })

	// Copy-on-write needs a page too.
	s.Rollback(id, 2)
	sh.truncate(H*D, 14)
	appendBoth(t, s, id, sh, 0, one, oneV) // page 3 is private: in place
	appendBoth(t, s, id, sh, 1, one, oneV)
	child, err := s.Fork(id)
	if err != nil {
		t.Fatal(err)
	}
	expectExhausted("copy-on-write append", func() error { return s.Append(child, 0, one, oneV) })
	expectExhausted("copy-on-write rollback", func() error { return s.Rollback(child, 1) })
	checkSeq(t, s, id, sh)
	checkSeq(t, s, child, sh)
	checkPool(t, s)
	// Rollback to a page boundary needs no copy and frees nothing shared.
	if err := s.Rollback(child, 3); err != nil {
		t.Fatal(err)
	}
	shC := sh.clone()
	shC.truncate(H*D, 12)
	checkSeq(t, s, child, shC)
	checkPool(t, s)
}

// TestRollbackCOWUsesDroppedPage: on a full pool, a rollback that drops a
// private page and reopens a shared one copies into the page it frees.
func TestRollbackCOWUsesDroppedPage(t *testing.T) {
	const S, H, D = 4, 1, 2
	s := mustStore(t, Config{Layers: 1, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 3})
	rng := rand.New(rand.NewPCG(11, 11))
	par := s.Create()
	sh := newShadow(1)
	k, v := randKV(rng, 8, H*D)
	appendBoth(t, s, par, sh, 0, k, v)
	child, _ := s.Fork(par)
	shC := sh.clone()
	k2, v2 := randKV(rng, 4, H*D)
	appendBoth(t, s, child, shC, 0, k2, v2) // page 2, private
	if st := s.Stats(); st.FreePages != 0 {
		t.Fatalf("%+v", st)
	}
	if err := s.Rollback(child, 6); err != nil {
		t.Fatal(err)
	}
	shC.truncate(H*D, 6)
	checkSeq(t, s, child, shC)
	checkSeq(t, s, par, sh)
	checkPool(t, s)
}

func TestBadInput(t *testing.T) {
	const L, S, H, D = 2, 4, 2, 3
	s := mustStore(t, Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 16})
	rng := rand.New(rand.NewPCG(13, 13))
	even := s.Create()
	k, v := randKV(rng, 6, H*D)
	for l := range L {
		if err := s.Append(even, l, k, v); err != nil {
			t.Fatal(err)
		}
	}
	uneven := s.Create()
	if err := s.Append(uneven, 0, k[:5*H*D], v[:5*H*D]); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(uneven, 1, k[:3*H*D], v[:3*H*D]); err != nil {
		t.Fatal(err)
	}
	good, goodV := randKV(rng, 2, H*D)
	poison := func(src []float32, i int, x float64) []float32 {
		c := slices.Clone(src)
		c[i] = float32(x)
		return c
	}
	nan, inf := math.NaN(), math.Inf(1)
	last := len(good) - 1
	tests := []struct {
		name string
		op   func() error
		want error
	}{
		{"k one float short", func() error { return s.Append(even, 0, good[:len(good)-1], goodV[:len(good)-1]) }, ErrBadShape},
		{"k and v lengths differ", func() error { return s.Append(even, 0, good, goodV[:H*D]) }, ErrBadShape},
		{"empty", func() error { return s.Append(even, 0, nil, nil) }, ErrBadShape},
		{"NaN in k", func() error { return s.Append(even, 0, poison(good, 0, nan), goodV) }, ErrNonFinite},
		{"+Inf in k", func() error { return s.Append(even, 0, poison(good, last, inf), goodV) }, ErrNonFinite},
		{"-Inf in k", func() error { return s.Append(even, 0, poison(good, 7, -inf), goodV) }, ErrNonFinite},
		{"NaN in v", func() error { return s.Append(even, 0, good, poison(goodV, last, nan)) }, ErrNonFinite},
		{"+Inf in v", func() error { return s.Append(even, 0, good, poison(goodV, 3, inf)) }, ErrNonFinite},
		{"-Inf in v", func() error { return s.Append(even, 0, good, poison(goodV, 0, -inf)) }, ErrNonFinite},
		{"unknown seq append", func() error { return s.Append(999, 0, good, goodV) }, ErrUnknownSequence},
		{"seq 0 append", func() error { return s.Append(0, 0, good, goodV) }, ErrUnknownSequence},
		{"layer -1", func() error { return s.Append(even, -1, good, goodV) }, ErrLayerOutOfRange},
		{"layer L", func() error { return s.Append(even, L, good, goodV) }, ErrLayerOutOfRange},
		{"rollback past start", func() error { return s.Rollback(even, 7) }, ErrOutOfRange},
		{"rollback 0", func() error { return s.Rollback(even, 0) }, ErrOutOfRange},
		{"rollback negative", func() error { return s.Rollback(even, -1) }, ErrOutOfRange},
		{"rollback unknown", func() error { return s.Rollback(999, 1) }, ErrUnknownSequence},
		{"rollback uneven", func() error { return s.Rollback(uneven, 1) }, ErrUnevenLayers},
		{"fork uneven", func() error { _, err := s.Fork(uneven); return err }, ErrUnevenLayers},
		{"fork unknown", func() error { _, err := s.Fork(999); return err }, ErrUnknownSequence},
		{"release unknown", func() error { return s.Release(999) }, ErrUnknownSequence},
		{"view bad layer", func() error { _, err := s.View(even, L); return err }, ErrLayerOutOfRange},
		{"view unknown", func() error { _, err := s.View(999, 0); return err }, ErrUnknownSequence},
		{"layer len bad layer", func() error { _, err := s.LayerLen(even, -1); return err }, ErrLayerOutOfRange},
		{"page table unknown", func() error { _, err := s.AppendPageTable(nil, 999); return err }, ErrUnknownSequence},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := takeSnapshot(t, s, even, uneven)
			err := tc.op()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), "seq") {
				t.Errorf("error %q names no sequence", err)
			}
			takeSnapshot(t, s, even, uneven).equal(t, before)
		})
	}
	if id := s.Create(); id != 3 {
		t.Fatalf("ids not sequential from 1: third Create = %d", id)
	}
}

func TestReadAPINoAlloc(t *testing.T) {
	s := mustStore(t, Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 2, HeadDim: 4, PageSize: 4}, Capacity: 8})
	id := s.Create()
	k, v := randKV(rand.New(rand.NewPCG(1, 1)), 9, 8)
	if err := s.Append(id, 0, k, v); err != nil {
		t.Fatal(err)
	}
	buf := make([]int32, 0, 16)
	var sink float32
	allocs := testing.AllocsPerRun(100, func() {
		pt, _ := s.AppendPageTable(buf[:0], id)
		view, _ := s.View(id, 0)
		ld := s.Layer(1)
		kk, vv := s.PageKV(0, int(pt[view.Pages-1]), 1)
		mn, mx := s.PageSummary(0, int(pt[0]), 0)
		sink += kk[0] + vv[0] + mn[0] + mx[0] + ld.K[0]
	})
	if allocs != 0 {
		t.Fatalf("read API allocates %v times per call", allocs)
	}
	_ = sink
	// Layer 1 lags 9 tokens behind layer 0: decode appends into allocated
	// pages do not allocate (AllocsPerRun calls the function runs+1 times).
	decode := testing.AllocsPerRun(8, func() {
		if err := s.Append(id, 1, k[:8], v[:8]); err != nil {
			t.Fatal(err)
		}
	})
	if decode != 0 {
		t.Fatalf("decode append into an allocated page allocates %v times", decode)
	}
}

func TestSummaryLayout(t *testing.T) {
	// The accessors and the documented flat layout agree.
	const L, S, H, D = 2, 3, 2, 2
	s := mustStore(t, Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 4})
	id := s.Create()
	k := []float32{1, 2, 3, 4, 5, 6, 7, 8} // 2 tokens x 2 heads x 2 dims
	v := []float32{-1, -2, -3, -4, -5, -6, -7, -8}
	if err := s.Append(id, 1, k, v); err != nil {
		t.Fatal(err)
	}
	p := int(pageTable(t, s, id)[0])
	ld := s.Layer(1)
	// K[p][h=1][slot=1][:] = token 1, head 1 = (7,8)
	if o := ((p*H+1)*S + 1) * D; ld.K[o] != 7 || ld.K[o+1] != 8 || ld.V[o] != -7 {
		t.Fatalf("K layout: %v", ld.K[o:o+D])
	}
	// Summary[p][h=1] = min (3,4), max (7,8)
	o := (p*H + 1) * 2 * D
	if got := ld.Summary[o : o+2*D]; !slices.Equal(got, []float32{3, 4, 7, 8}) {
		t.Fatalf("summary record %v, want [3 4 7 8]", got)
	}
}

// TestCheckAppendRollback: the dry runs agree with the real operations on
// a full pool, with and without copy-on-write, and change nothing.
func TestCheckAppendRollback(t *testing.T) {
	st, err := New(Config{Layers: 1, Geometry: plan.Geometry{KVHeads: 1, HeadDim: 2, PageSize: 4}, Capacity: 3})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Create()
	tok := func(n int) []float32 { return make([]float32, n*2) }
	if need, err := st.CheckAppend(id, 0, 12); err != nil || need != 3 {
		t.Fatalf("12 tokens into an empty pool of 3: need %d, %v", need, err)
	}
	if _, err := st.CheckAppend(id, 0, 13); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("13 tokens: %v", err)
	}
	if err := st.Append(id, 0, tok(6), tok(6)); err != nil {
		t.Fatal(err)
	}
	child, err := st.Fork(id)
	if err != nil {
		t.Fatal(err)
	}
	// The shared tail needs a copy: 1 page free, so one token fits, and
	// the pool holds exactly the copy.
	if need, err := st.CheckAppend(child, 0, 1); err != nil || need != 1 {
		t.Fatalf("append to shared tail: need %d, %v", need, err)
	}
	if _, err := st.CheckAppend(child, 0, 3); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("copy plus a new page: %v", err)
	}
	before := st.Stats()
	if err := st.CheckRollback(child, 1); err != nil {
		t.Fatalf("rollback inside the shared tail with one free page: %v", err)
	}
	if err := st.CheckRollback(child, 7); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("rollback past the start: %v", err)
	}
	if st.Stats() != before {
		t.Fatal("dry runs changed the pool")
	}
	other := st.Create() // takes the last free page
	if err := st.Append(other, 0, tok(1), tok(1)); err != nil {
		t.Fatal(err)
	}
	if err := st.CheckRollback(child, 1); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("no page left for the copy: %v", err)
	}
	if err := st.Rollback(child, 1); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("real rollback disagrees with the check: %v", err)
	}
}
