package pagestore

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// shadowSeq is the test-side reference copy of one sequence: every key and
// value appended, per layer, token-major [n][KVHeads][HeadDim].
type shadowSeq struct {
	k, v [][]float32
}

func newShadow(layers int) *shadowSeq {
	return &shadowSeq{k: make([][]float32, layers), v: make([][]float32, layers)}
}

func (sh *shadowSeq) clone() *shadowSeq {
	c := newShadow(len(sh.k))
	for l := range sh.k {
		c.k[l] = slices.Clone(sh.k[l])
		c.v[l] = slices.Clone(sh.v[l])
	}
	return c
}

func (sh *shadowSeq) truncate(tok, n int) {
	for l := range sh.k {
		sh.k[l] = sh.k[l][:n*tok]
		sh.v[l] = sh.v[l][:n*tok]
	}
}

func randKV(rng *rand.Rand, n, tok int) (k, v []float32) {
	k = make([]float32, n*tok)
	v = make([]float32, n*tok)
	for i := range k {
		k[i] = float32(rng.NormFloat64() * 3)
		v[i] = float32(rng.NormFloat64())
	}
	return k, v
}

// appendBoth appends to the store and the shadow, failing the test on error.
func appendBoth(t testing.TB, s *Store, id SeqID, sh *shadowSeq, layer int, k, v []float32) {
	t.Helper()
	if err := s.Append(id, layer, k, v); err != nil {
		t.Fatalf("append seq %d layer %d (%d floats): %v", id, layer, len(k), err)
	}
	sh.k[layer] = append(sh.k[layer], k...)
	sh.v[layer] = append(sh.v[layer], v...)
}

func mustStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pageTable(t testing.TB, s *Store, id SeqID) []int32 {
	t.Helper()
	pt, err := s.AppendPageTable(nil, id)
	if err != nil {
		t.Fatal(err)
	}
	return pt
}

// naiveMinMax recomputes a summary record in float64 over keys of one head.
func naiveMinMax(keys []float32, tok, head, D, from, to int) (mn, mx []float64) {
	mn = make([]float64, D)
	mx = make([]float64, D)
	for j := range D {
		mn[j], mx[j] = math.Inf(1), math.Inf(-1)
	}
	for r := from; r < to; r++ {
		for j := range D {
			x := float64(keys[r*tok+head*D+j])
			mn[j] = math.Min(mn[j], x)
			mx[j] = math.Max(mx[j], x)
		}
	}
	return mn, mx
}

// pageKVAny returns the K and V blocks of one page and head wherever they
// live: aliases of the pool (PageKV) without offload, copies (ReadKV)
// with it.
func pageKVAny(t testing.TB, s *Store, layer int, phys int32, head int) (k, v []float32) {
	t.Helper()
	if s.res == nil {
		return s.PageKV(layer, int(phys), head)
	}
	h := s.host
	k, v = make([]float32, h.pageBlk), make([]float32, h.pageBlk)
	if err := s.ReadKV(context.Background(), layer, phys, k, v); err != nil {
		t.Fatal(err)
	}
	o := head * h.headBlk
	return k[o : o+h.headBlk], v[o : o+h.headBlk]
}

// checkSeq asserts that the store's view of a sequence equals the shadow:
// lengths, page-table size, K/V of every valid slot, and every summary
// record equal to a naive recomputation over the valid keys only (fresh
// +Inf/-Inf for pages a layer has not reached).
func checkSeq(t testing.TB, s *Store, id SeqID, sh *shadowSeq) {
	t.Helper()
	cfg := s.Config()
	S, H, D := cfg.PageSize, cfg.KVHeads, cfg.HeadDim
	tok := H * D
	pt := pageTable(t, s, id)
	maxLen, minLen := 0, math.MaxInt
	for l := range cfg.Layers {
		n := len(sh.k[l]) / tok
		maxLen, minLen = max(maxLen, n), min(minLen, n)
		got, err := s.LayerLen(id, l)
		if err != nil || got != n {
			t.Fatalf("seq %d layer %d: LayerLen = %d, %v; want %d", id, l, got, err, n)
		}
		view, err := s.View(id, l)
		if err != nil {
			t.Fatal(err)
		}
		want := SeqView{Len: n}
		if n > 0 {
			want.Pages = (n + S - 1) / S
			want.LastPageLen = n - (want.Pages-1)*S
		}
		if view != want {
			t.Fatalf("seq %d layer %d: View = %+v, want %+v", id, l, view, want)
		}
		for p, phys := range pt {
			valid := min(max(n-p*S, 0), S)
			for h := range H {
				kk, vv := pageKVAny(t, s, l, phys, h)
				for r := range valid {
					tk := p*S + r
					for j := range D {
						if kk[r*D+j] != sh.k[l][tk*tok+h*D+j] || vv[r*D+j] != sh.v[l][tk*tok+h*D+j] {
							t.Fatalf("seq %d layer %d page %d (phys %d) head %d slot %d dim %d: K/V = %v/%v, want %v/%v",
								id, l, p, phys, h, r, j, kk[r*D+j], vv[r*D+j], sh.k[l][tk*tok+h*D+j], sh.v[l][tk*tok+h*D+j])
						}
					}
				}
				mn, mx := s.PageSummary(l, int(phys), h)
				wmn, wmx := naiveMinMax(sh.k[l], tok, h, D, p*S, p*S+valid)
				for j := range D {
					if float64(mn[j]) != wmn[j] || float64(mx[j]) != wmx[j] {
						t.Fatalf("seq %d layer %d page %d (phys %d, %d valid) head %d dim %d: summary [%v,%v], want [%v,%v]",
							id, l, p, phys, valid, h, j, mn[j], mx[j], wmn[j], wmx[j])
					}
				}
			}
		}
	}
	if wantPages := (maxLen + S - 1) / S; len(pt) != wantPages {
		t.Fatalf("seq %d: page table has %d pages, want %d", id, len(pt), wantPages)
	}
	if n, err := s.Len(id); err != nil || n != minLen {
		t.Fatalf("seq %d: Len = %d, %v; want %d", id, n, err, minLen)
	}
}

// checkPool asserts the pool bookkeeping against the live page tables:
// refcounts equal the number of page-table entries naming each page, the
// free list holds exactly the pages with refcount 0, each once.
func checkPool(t testing.TB, s *Store) {
	t.Helper()
	want := make([]int32, s.cfg.Capacity)
	s.seqMu.RLock()
	for _, sq := range s.seqs {
		sq.mu.Lock()
		seen := map[int32]bool{}
		for _, p := range sq.pages {
			if seen[p] {
				t.Fatalf("page %d twice in one page table %v", p, sq.pages)
			}
			seen[p] = true
			want[p]++
		}
		sq.mu.Unlock()
	}
	s.seqMu.RUnlock()
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	if !slices.Equal(s.ref, want) {
		t.Fatalf("refcounts %v, want %v", s.ref, want)
	}
	inFree := make([]bool, s.cfg.Capacity)
	for _, p := range s.free {
		if inFree[p] || want[p] != 0 {
			t.Fatalf("free list %v holds page %d (ref %d) wrongly", s.free, p, want[p])
		}
		inFree[p] = true
	}
	for p, r := range want {
		if r == 0 && !inFree[p] {
			t.Fatalf("page %d has no reference and is not free (free list %v)", p, s.free)
		}
	}
}

// isFresh reports whether every layer's and head's summary of phys is the
// empty box (+Inf min, -Inf max).
func isFresh(s *Store, layer, phys int) bool {
	for h := range s.cfg.KVHeads {
		mn, mx := s.PageSummary(layer, phys, h)
		for j := range mn {
			if !math.IsInf(float64(mn[j]), 1) || !math.IsInf(float64(mx[j]), -1) {
				return false
			}
		}
	}
	return true
}

// snapshot is the whole observable state of a store, for "no state change"
// assertions.
type snapshot struct {
	stats  Stats
	lens   map[SeqID][]int
	tables map[SeqID][]int32
	k, v   [][]float32
	sum    [][]float32
	ref    []int32
	free   []int32
}

func takeSnapshot(t testing.TB, s *Store, ids ...SeqID) snapshot {
	t.Helper()
	sn := snapshot{stats: s.Stats(), lens: map[SeqID][]int{}, tables: map[SeqID][]int32{}}
	for _, id := range ids {
		for l := range s.cfg.Layers {
			n, err := s.LayerLen(id, l)
			if err != nil {
				t.Fatal(err)
			}
			sn.lens[id] = append(sn.lens[id], n)
		}
		sn.tables[id] = pageTable(t, s, id)
	}
	for _, ld := range s.host.layers {
		sn.k = append(sn.k, slices.Clone(ld.K))
		sn.v = append(sn.v, slices.Clone(ld.V))
		sn.sum = append(sn.sum, slices.Clone(ld.Summary))
	}
	s.poolMu.Lock()
	sn.ref = slices.Clone(s.ref)
	sn.free = slices.Clone(s.free)
	s.poolMu.Unlock()
	return sn
}

func (a snapshot) equal(t testing.TB, b snapshot) {
	t.Helper()
	if a.stats != b.stats {
		t.Fatalf("stats changed: %+v -> %+v", a.stats, b.stats)
	}
	for id := range a.lens {
		if !slices.Equal(a.lens[id], b.lens[id]) {
			t.Fatalf("seq %d layer lengths changed: %v -> %v", id, a.lens[id], b.lens[id])
		}
		if !slices.Equal(a.tables[id], b.tables[id]) {
			t.Fatalf("seq %d page table changed: %v -> %v", id, a.tables[id], b.tables[id])
		}
	}
	for l := range a.k {
		if !slices.Equal(a.k[l], b.k[l]) || !slices.Equal(a.v[l], b.v[l]) {
			t.Fatalf("layer %d K/V pool changed", l)
		}
		if !slices.Equal(a.sum[l], b.sum[l]) {
			t.Fatalf("layer %d summary pool changed", l)
		}
	}
	if !slices.Equal(a.ref, b.ref) || !slices.Equal(a.free, b.free) {
		t.Fatalf("pool changed: ref %v free %v -> ref %v free %v", a.ref, a.free, b.ref, b.free)
	}
}

// scoreU computes U_p(q) (eq. 2-3) from a stored summary record in float64.
func scoreU(q []float64, mn, mx []float32) float64 {
	u := 0.0
	for j, qj := range q {
		u += math.Max(qj*float64(mn[j]), qj*float64(mx[j]))
	}
	return u
}

// scoreURecord computes U as the kernel does: dot([min(q,0); max(q,0)],
// record), in float64.
func scoreURecord(q []float64, mn, mx []float32) float64 {
	u := 0.0
	for j, qj := range q {
		u += math.Min(qj, 0) * float64(mn[j])
	}
	for j, qj := range q {
		u += math.Max(qj, 0) * float64(mx[j])
	}
	return u
}
