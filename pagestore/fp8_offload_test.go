package pagestore

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/plan"
)

// fp8OffConfig is a small fp8 store with S = 16 (tails 1, 15, 16, 17
// come up in the random appends).
func fp8OffConfig(capacity, budget int) Config {
	return Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 2, HeadDim: 8, PageSize: 16, DType: plan.FP8},
		Capacity: capacity, DeviceBudget: budget, MemoryLimit: -1}
}

// validRecords returns the stored records of sequence id's pages in
// packFP8's layout restricted to what is defined: per page and layer,
// the codes of the valid slots of each head's K and V, and the scales of
// a record with a valid slot, then the summaries' bits. It reads the
// payload wherever it lives (pool, device slot or tier).
func validRecords(t testing.TB, s *Store, id SeqID) [][]byte {
	t.Helper()
	c := s.Config()
	S, H, D := c.PageSize, c.KVHeads, c.HeadDim
	blk := H * S * D
	b := make([]byte, c.PayloadBytes())
	var out [][]byte
	for i, p := range pageTable(t, s, id) {
		if err := s.payload(p, b); err != nil {
			t.Fatal(err)
		}
		var rec []byte
		for l := range c.Layers {
			n, err := s.LayerLen(id, l)
			if err != nil {
				t.Fatal(err)
			}
			valid := min(max(n-i*S, 0), S)
			lb := b[l*fp8LayerBytes(blk, H):]
			for kv := range 2 {
				codes, scales := lb[kv*(blk+4*H):], lb[kv*(blk+4*H)+blk:]
				for hd := range H {
					rec = append(rec, codes[hd*S*D:hd*S*D+valid*D]...)
					if valid > 0 {
						rec = append(rec, scales[4*hd:4*hd+4]...)
					}
				}
			}
			for hd := range H {
				mn, mx := s.PageSummary(l, int(p), hd)
				for _, x := range append(slices.Clone(mn), mx...) {
					rec = fmt.Appendf(rec, "%08x", math.Float32bits(x))
				}
			}
		}
		out = append(out, rec)
	}
	return out
}

// sameRecords fails unless sequences a of store x and b of store y hold
// the same lengths and, page by page, the same valid records and
// summaries, byte for byte.
func sameRecords(t testing.TB, x *Store, a SeqID, y *Store, b SeqID) {
	t.Helper()
	for l := range x.Config().Layers {
		n1, _ := x.LayerLen(a, l)
		n2, _ := y.LayerLen(b, l)
		if n1 != n2 {
			t.Fatalf("layer %d: lengths %d and %d", l, n1, n2)
		}
	}
	ra, rb := validRecords(t, x, a), validRecords(t, y, b)
	if len(ra) != len(rb) {
		t.Fatalf("%d and %d pages", len(ra), len(rb))
	}
	for i := range ra {
		if !bytes.Equal(ra[i], rb[i]) {
			t.Fatalf("page %d of seq %d/%d: records or summaries differ with offload", i, a, b)
		}
	}
}

// TestFP8OffloadMatchesPlain is TestOffloadMatchesPlain on fp8 records:
// random appends (lagging layers included), forks, rollbacks, releases,
// recalls in random orders and prefetches on an fp8 store with a device
// budget of a quarter of its pages keep exactly the records, scales and
// summaries of the same store without offload.
func TestFP8OffloadMatchesPlain(t *testing.T) {
	ops := 300
	if testing.Short() {
		ops = 100
	}
	for _, tc := range []struct {
		ev       Eviction
		disk     bool
		prefetch bool
	}{{EvictLRU, false, false}, {EvictScore, false, true}, {EvictLRU, true, true}} {
		t.Run(fmt.Sprintf("%v_disk%v_prefetch%v", tc.ev, tc.disk, tc.prefetch), func(t *testing.T) {
			c := fp8OffConfig(48, 0)
			plain := mustStore(t, c)
			c.DeviceBudget, c.Eviction, c.PinFirst = 12, tc.ev, 1
			if tc.disk {
				c.Tier = testDiskTier(t, c)
			}
			off := mustStore(t, c)
			defer off.Close()
			m := &opsModel{t: t, rng: rand.New(rand.NewPCG(26, uint64(tc.ev)+1)), plain: plain, off: off, maxSeqs: 3, recallLimit: 8, prefetch: tc.prefetch, fp8: true}
			if st := m.run(ops); st.Evictions == 0 || st.BytesIn == 0 || st.BytesOut == 0 || st.Misses == 0 {
				t.Errorf("the workload did not exercise the tier: %+v", st)
			}
		})
	}
}

// TestFP8OffloadBytes: an evicted fp8 page's tier payload is its records
// as they were in the device slot (codes and scales of every layer,
// padding slots included), and a recall puts back exactly those bytes;
// the summaries never change on the way.
func TestFP8OffloadBytes(t *testing.T) {
	ctx := context.Background()
	c := fp8OffConfig(16, 4)
	s := mustStore(t, c)
	defer s.Close()
	rng := rand.New(rand.NewPCG(8, 26))
	id := s.Create()
	tok := c.KVHeads * c.HeadDim
	for l := range c.Layers {
		k, v := randKV(rng, 3*c.PageSize+1, tok)
		for i := range k { // one large magnitude per page: scales differ
			k[i] *= float32(1 + i/(c.PageSize*tok))
		}
		if err := s.Append(id, l, k, v); err != nil {
			t.Fatal(err)
		}
	}
	pt := pageTable(t, s, id)
	h := s.host
	slotBytes := func(p int32) []byte {
		b := make([]byte, c.PayloadBytes())
		packFP8(h.layers, h.pageBlk, c.KVHeads, s.DeviceSlot(p), b)
		return b
	}
	sums := func() []float32 {
		var out []float32
		for l := range c.Layers {
			out = append(out, s.Layer(l).Summary...)
		}
		return out
	}
	want := map[int32][]byte{}
	for _, p := range pt {
		if err := s.Recall(ctx, []int32{p}); err != nil {
			t.Fatal(err)
		}
		want[p] = slotBytes(p)
	}
	sum0 := sums()
	// A second sequence fills the device: every page of the first but
	// its tail (pinned) goes to the tier.
	other := s.Create()
	for l := range c.Layers {
		k, v := randKV(rng, 4*c.PageSize, tok)
		if err := s.Append(other, l, k, v); err != nil {
			t.Fatal(err)
		}
	}
	tierBuf := make([]byte, c.PayloadBytes())
	for _, p := range pt[:len(pt)-1] {
		if s.DeviceSlot(p) >= 0 {
			t.Fatalf("page %d still resident", p)
		}
		if err := s.res.tier.Read(ctx, int(p), tierBuf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tierBuf, want[p]) {
			t.Fatalf("page %d: the tier holds other bytes than the slot did", p)
		}
	}
	for _, p := range slices.Backward(pt) { // recall in reverse order
		if err := s.Recall(ctx, []int32{p}); err != nil {
			t.Fatal(err)
		}
		if got := slotBytes(p); !bytes.Equal(got, want[p]) {
			t.Fatalf("page %d: recalled records differ from the evicted ones", p)
		}
	}
	if !sameFirstPages(sum0, sums(), pt, c) {
		t.Fatal("summaries changed through eviction and recall")
	}
	checkRes(t, s)
}

// sameFirstPages reports whether the summaries of pages pt agree in two
// snapshots of every layer's summary pool (the other pages' may change).
func sameFirstPages(a, b []float32, pt []int32, c Config) bool {
	per := c.SummaryElems()
	for l := range c.Layers {
		for _, p := range pt {
			o := l*c.Capacity*per + int(p)*per
			if !slices.Equal(a[o:o+per], b[o:o+per]) {
				return false
			}
		}
	}
	return true
}

// TestFP8OffloadPersistence: an fp8 store with a device budget and a
// data directory recovers its records (into the tier) and summaries
// byte for byte after a restart, offloaded pages included.
func TestFP8OffloadPersistence(t *testing.T) {
	c := fp8OffConfig(16, 3)
	c.DataDir = t.TempDir()
	s := mustStore(t, c)
	rng := rand.New(rand.NewPCG(9, 26))
	id := s.Create()
	tok := c.KVHeads * c.HeadDim
	for _, n := range []int{17, 15, 40, 1} {
		for l := range c.Layers {
			k, v := randKV(rng, n, tok)
			if err := s.Append(id, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := validRecords(t, s, id)
	if st := s.ResidencyStats(); st.TierOnly == 0 {
		t.Fatalf("nothing offloaded: %+v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := mustStore(t, c)
	defer s2.Close()
	got := validRecords(t, s2, id)
	if len(got) != len(want) {
		t.Fatalf("%d pages after the restart, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("page %d: records or summaries differ after the restart", i)
		}
	}
	pt := pageTable(t, s2, id)
	if err := s2.Recall(context.Background(), pt[:3]); err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(validRecords(t, s2, id), want, bytes.Equal) {
		t.Fatal("records differ after recalling recovered pages")
	}
	checkRes(t, s2)
}
