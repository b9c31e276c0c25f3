package pagestore_test

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// lazyWrite writes x, y, z (9, 13, 7 tokens) and w, a fork of x that
// shares its sealed pages, closes the store and returns the ids and
// the token streams.
func lazyWrite(t *testing.T, c pagestore.Config) (streams, [4]pagestore.SeqID) {
	t.Helper()
	s := openP(t, c)
	st := streams{}
	x, y, z := s.Create(), s.Create(), s.Create()
	appendN(t, s, st, x, 1, 9)
	appendN(t, s, st, y, 2, 13)
	appendN(t, s, st, z, 3, 7)
	w, err := s.Fork(x)
	if err != nil {
		t.Fatal(err)
	}
	st[w] = slices.Clone(st[x])
	appendN(t, s, st, w, 4, 2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return st, [4]pagestore.SeqID{x, y, z, w}
}

func lazyConfig(dir string, rate int64) pagestore.Config {
	c := pConfig(dir)
	c.Verify, c.ScrubRate = pagestore.VerifyOnRead, rate
	return c
}

// sameStores requires every sequence of ids to have the same lengths,
// K/V and summaries in got and want (bit for bit).
func sameStores(t *testing.T, what string, got, want *pagestore.Store, ids []pagestore.SeqID) {
	t.Helper()
	for _, id := range ids {
		n := mustLen(t, want, id)
		if g := mustLen(t, got, id); g != n {
			t.Fatalf("%s: seq %d has %d tokens, want %d", what, id, g, n)
		}
		sameSummaries(t, what, got, want, id, id, (n+pS-1)/pS)
	}
}

// TestLazyOpenReadsNoPayload: with VerifyOnRead an open reads no page
// payload (counted by the store's slab reads, and proved by slabs
// overwritten with garbage: the open still recovers every sequence);
// the sequences then read their pages at first use and equal, bit for
// bit, what an open that reads every page recovers, whose check of the
// persisted summaries against the keys finds none different. Float32
// and fp8 pages, with and without offload.
func TestLazyOpenReadsNoPayload(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dtype  plan.DType
		budget int
	}{{"f32", plan.Float32, 0}, {"fp8", plan.FP8, 0}, {"offload", plan.Float32, 12}, {"fp8-offload", plan.FP8, 12}} {
		t.Run(tc.name, func(t *testing.T) {
			c := lazyConfig(t.TempDir(), -1)
			c.DType, c.DeviceBudget = tc.dtype, tc.budget
			_, ids := lazyWrite(t, c)
			eager := c
			eager.Verify, eager.DataDir = pagestore.VerifyAtOpen, copyDir(t, c.DataDir)
			garbage := copyDir(t, c.DataDir)

			ref := openP(t, eager)
			defer ref.Close()
			rr := ref.Recovery()
			if len(rr.Sequences) != 4 || len(rr.Damaged) != 0 || rr.BadSummaries != nil || rr.Pending != 0 || rr.PayloadBytesRead != int64(rr.Pages*c.PayloadBytes()) {
				t.Fatalf("eager open: %+v", rr)
			}

			s := openP(t, c)
			rep := s.Recovery()
			if len(rep.Sequences) != 4 || len(rep.Damaged) != 0 || rep.PayloadBytesRead != 0 || rep.Pending != rep.Pages || rep.Pages != rr.Pages {
				t.Fatalf("lazy open: %+v (eager: %d pages)", rep, rr.Pages)
			}
			if sc := s.Scrub(); sc.Pending != rep.Pages || sc.BytesRead != 0 || sc.Running {
				t.Fatalf("before any use: %+v", sc)
			}
			sameStores(t, tc.name, s, ref, ids[:])
			if sc := s.Scrub(); sc.Pending != 0 || sc.Verified != rep.Pages || sc.BytesRead != int64(rep.Pages*c.PayloadBytes()) || len(sc.Damaged) != 0 {
				t.Fatalf("after use: %+v", sc)
			}
			if err := s.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			// Every slab byte garbage: the open still recovers all.
			ents, _ := filepath.Glob(filepath.Join(garbage, "slab-*"))
			for _, e := range ents {
				b, err := os.ReadFile(e)
				if err != nil {
					t.Fatal(err)
				}
				for i := range b {
					b[i] ^= 0x5a
				}
				os.WriteFile(e, b, 0o600)
			}
			c.DataDir = garbage
			g := openP(t, c)
			defer g.Close()
			if r := g.Recovery(); len(r.Sequences) != 4 || len(r.Damaged) != 0 || r.PayloadBytesRead != 0 {
				t.Fatalf("lazy open of garbage slabs: %+v", r)
			}
			for _, id := range ids {
				if _, err := g.View(id, 0); !errors.Is(err, pagestore.ErrDamaged) || !errors.Is(err, tier.ErrCorrupt) {
					t.Fatalf("seq %d on garbage slabs: %v, want ErrDamaged", id, err)
				}
			}
		})
	}
}

// corruptSlot flips a byte of slab slot sl's payload.
func corruptSlot(t *testing.T, c pagestore.Config, sl uint32) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(c.DataDir, "slab-000000"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	slotBytes := (int64(c.PayloadBytes()) + 4095) / 4096 * 4096
	var b [1]byte
	f.ReadAt(b[:], int64(sl)*slotBytes+5)
	b[0] ^= 0x40
	f.WriteAt(b[:], int64(sl)*slotBytes+5)
}

// TestLazyCorruptPayload: a flipped payload byte in a page x shares
// with its fork w is found at the first use of x (ErrDamaged,
// tier.ErrCorrupt; again at every later call), and of w; y and z are
// intact, bit for bit; the damaged sequences are gone at the next open,
// which reports nothing (the damage was reported once).
func TestLazyCorruptPayload(t *testing.T) {
	c := lazyConfig(t.TempDir(), -1)
	st, ids := lazyWrite(t, c)
	x, y, z, w := ids[0], ids[1], ids[2], ids[3]
	sl := seqSlots(t, c.DataDir, x)[1]
	corruptSlot(t, c, sl)
	s := openP(t, c)
	if r := s.Recovery(); len(r.Sequences) != 4 || len(r.Damaged) != 0 {
		t.Fatalf("open: %+v", r)
	}
	ref := openP(t, pConfig(""))
	defer ref.Close()
	for _, id := range []pagestore.SeqID{ref.Create(), ref.Create(), ref.Create()} {
		_ = id
	}
	rst := streams{}
	appendN(t, ref, rst, y, 2, 13)
	appendN(t, ref, rst, z, 3, 7)
	sameStores(t, "intact", s, ref, []pagestore.SeqID{y, z})
	for _, id := range []pagestore.SeqID{x, x, w} {
		if _, err := s.View(id, 0); !errors.Is(err, pagestore.ErrDamaged) || !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("seq %d: %v, want ErrDamaged", id, err)
		}
	}
	if err := s.Append(x, 0, make([]float32, pTok), make([]float32, pTok)); !errors.Is(err, pagestore.ErrDamaged) {
		t.Fatalf("append to damaged x: %v", err)
	}
	sc := s.Scrub()
	if len(sc.Damaged) != 2 || sc.Damaged[0].ID != x || sc.Damaged[1].ID != w || sc.Damaged[0].Tokens != len(st[x]) || !slices.Equal(sc.CorruptSlots, []int{int(sl)}) {
		t.Fatalf("scrub report %+v", sc)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Sequences != 2 {
		t.Fatalf("%d sequences live, want y and z", st.Sequences)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	again := openP(t, c)
	defer again.Close()
	if r := again.Recovery(); len(r.Damaged) != 0 || len(r.Sequences) != 2 || r.Sequences[0].ID != y || r.Sequences[1].ID != z {
		t.Fatalf("second open %+v", r)
	}
	sameStores(t, "reopened", again, ref, []pagestore.SeqID{y, z})
}

func waitScrub(t *testing.T, s *pagestore.Store) pagestore.ScrubReport {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if sc := s.Scrub(); !sc.Running {
			return sc
		}
	}
	t.Fatal("the scrub did not finish in 10s")
	return pagestore.ScrubReport{}
}

// TestScrubFindsCorruption: the background scrub reads every pending
// page without any use of the sequences, reports the corrupt page's
// sequences (and only them) damaged, and leaves the others verified:
// their first use then reads nothing.
func TestScrubFindsCorruption(t *testing.T) {
	c := lazyConfig(t.TempDir(), 1<<40)
	_, ids := lazyWrite(t, c)
	x, y, z, w := ids[0], ids[1], ids[2], ids[3]
	sl := seqSlots(t, c.DataDir, x)[0]
	corruptSlot(t, c, sl)
	s := openP(t, c)
	defer s.Close()
	rep := s.Recovery()
	sc := waitScrub(t, s)
	if sc.Pending != 0 || sc.Verified == 0 || sc.Verified > rep.Pending || len(sc.Damaged) != 2 || sc.Damaged[0].ID != x || sc.Damaged[1].ID != w ||
		!errors.Is(sc.Damaged[0].Err, pagestore.ErrDamaged) || !slices.Equal(sc.CorruptSlots, []int{int(sl)}) {
		t.Fatalf("scrub: %+v (open: %+v)", sc, rep)
	}
	for _, id := range []pagestore.SeqID{x, w} {
		if _, err := s.Len(id); !errors.Is(err, pagestore.ErrDamaged) {
			t.Fatalf("seq %d: %v", id, err)
		}
	}
	for _, id := range []pagestore.SeqID{y, z} {
		mustLen(t, s, id)
	}
	if got := s.Scrub(); got.BytesRead != sc.BytesRead {
		t.Fatalf("first use after the scrub read %d bytes", got.BytesRead-sc.BytesRead)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// setSumRecord rewrites slot sl's summary record in store.db with f
// applied to its summary bytes, keeping its checksum valid when
// reseal (a record that passes its check but lies), else not.
func setSumRecord(t *testing.T, dir string, sl uint32, reseal bool, f func([]byte)) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "store.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("sums"))
		k := binary.BigEndian.AppendUint32(nil, sl)
		v := slices.Clone(b.Get(k))
		if v == nil {
			t.Fatalf("slot %d has no summary record", sl)
		}
		body := v[:len(v)-4]
		f(body[8:])
		if reseal {
			tab := crc32.MakeTable(crc32.Castagnoli)
			binary.LittleEndian.PutUint32(v[len(v)-4:], crc32.Update(crc32.Update(0, tab, k), tab, body))
		}
		return b.Put(k, v)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCorruptSummaryRecord: a summary record that fails its checksum
// is not trusted: the open reads that page (as VerifyAtOpen would),
// reports the slot in BadSummaries and rewrites the record, and the
// sequence is intact; one that passes its checksum but differs from
// the summaries of the keys (a lie the bound would suffer from) is
// found at the page's first read (VerifyOnRead: the sequence is
// damaged) or at open (VerifyAtOpen: reported and rewritten).
func TestCorruptSummaryRecord(t *testing.T) {
	flipMax := func(b []byte) { b[len(b)-1] ^= 0x01 } // a max of the last head of the last layer
	t.Run("checksum", func(t *testing.T) {
		c := lazyConfig(t.TempDir(), -1)
		_, ids := lazyWrite(t, c)
		sl := seqSlots(t, c.DataDir, ids[1])[2]
		setSumRecord(t, c.DataDir, sl, false, flipMax)
		s := openP(t, c)
		r := s.Recovery()
		if len(r.Damaged) != 0 || !slices.Equal(r.BadSummaries, []int{int(sl)}) || r.PayloadBytesRead != int64(c.PayloadBytes()) {
			t.Fatalf("open: %+v", r)
		}
		for _, id := range ids {
			mustLen(t, s, id)
		}
		s.Close()
		s = openP(t, c)
		defer s.Close()
		if r := s.Recovery(); r.BadSummaries != nil || r.PayloadBytesRead != 0 {
			t.Fatalf("after the rewrite: %+v", r)
		}
	})
	for _, v := range []pagestore.Verify{pagestore.VerifyOnRead, pagestore.VerifyAtOpen} {
		t.Run("lie-"+v.String(), func(t *testing.T) {
			c := lazyConfig(t.TempDir(), -1)
			_, ids := lazyWrite(t, c)
			sl := seqSlots(t, c.DataDir, ids[1])[2]
			setSumRecord(t, c.DataDir, sl, true, func(b []byte) {
				x := math.Float32frombits(binary.LittleEndian.Uint32(b[len(b)-4:]))
				binary.LittleEndian.PutUint32(b[len(b)-4:], math.Float32bits(x+1))
			})
			c.Verify = v
			s := openP(t, c)
			defer s.Close()
			r := s.Recovery()
			if v == pagestore.VerifyAtOpen {
				if len(r.Damaged) != 0 || !slices.Equal(r.BadSummaries, []int{int(sl)}) {
					t.Fatalf("open: %+v", r)
				}
				mustLen(t, s, ids[1])
				return
			}
			if len(r.Damaged) != 0 || r.BadSummaries != nil {
				t.Fatalf("open: %+v", r)
			}
			if _, err := s.View(ids[1], 0); !errors.Is(err, pagestore.ErrDamaged) || !errors.Is(err, tier.ErrCorrupt) {
				t.Fatalf("y with a lying summary record: %v", err)
			}
			for _, id := range []pagestore.SeqID{ids[0], ids[2], ids[3]} {
				mustLen(t, s, id)
			}
		})
	}
}

// TestScrubStopsOnClose: a scrub paced to a few bytes a second is
// stopped by Close, which returns at once, with no goroutine left.
func TestScrubStopsOnClose(t *testing.T) {
	c := lazyConfig(t.TempDir(), 16)
	lazyWrite(t, c)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := openP(t, c)
	// The first page is read at once, the next after its bytes' time at
	// the pace: wait (bounded) for the first on a loaded machine.
	sc := s.Scrub()
	for deadline := time.Now().Add(10 * time.Second); sc.Verified < 1 && time.Now().Before(deadline); sc = s.Scrub() {
		time.Sleep(5 * time.Millisecond)
	}
	if !sc.Running || sc.Verified != 1 {
		t.Fatalf("a slow scrub: %+v, want running after one page", sc)
	}
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if sc := s.Scrub(); sc.Running {
		t.Fatalf("after Close: %+v", sc)
	}
}

// TestLazyOldFormat: the format-1 crash image (testdata/lengths-v1,
// written before summary records) opens with VerifyOnRead as it does
// with VerifyAtOpen (every page read, the same sequences), its summary
// records are written then, and the next open reads no payload.
func TestLazyOldFormat(t *testing.T) {
	dir := copyDir(t, "testdata/lengths-v1")
	os.Remove(filepath.Join(dir, "README"))
	eagerDir := copyDir(t, dir)
	c := lazyConfig(dir, -1)
	c.Capacity = 8
	s := openP(t, c)
	r := s.Recovery()
	e := c
	e.Verify, e.DataDir = pagestore.VerifyAtOpen, eagerDir
	ref := openP(t, e)
	defer ref.Close()
	rr := ref.Recovery()
	if len(r.Sequences) != 2 || len(r.Damaged) != 0 || r.Pending != 0 || r.PayloadBytesRead != int64(r.Pages*c.PayloadBytes()) ||
		!slices.Equal(seqIDs(r), seqIDs(rr)) || r.BadSummaries != nil {
		t.Fatalf("lazy open of the old format: %+v, eager: %+v", r, rr)
	}
	sameStores(t, "old format", s, ref, seqIDs(r))
	s.Close()
	s = openP(t, c)
	defer s.Close()
	if r := s.Recovery(); len(r.Sequences) != 2 || r.PayloadBytesRead != 0 || r.Pending != r.Pages {
		t.Fatalf("second open: %+v", r)
	}
	sameStores(t, "old format, reopened", s, ref, seqIDs(r))
}

func seqIDs(r pagestore.RecoveryReport) []pagestore.SeqID {
	var ids []pagestore.SeqID
	for _, s := range r.Sequences {
		ids = append(ids, s.ID)
	}
	return ids
}

// TestScrubConcurrent: the scrub runs while the sequences are used
// (first uses, appends, releases and lengths from several goroutines; no
// fork, rollback or truncation of a pending sequence yet): the
// result equals, bit for bit, the same operations on an eager open of
// the same directory, and the pool's invariants hold (run with -race).
func TestScrubConcurrent(t *testing.T) {
	c := lazyConfig(t.TempDir(), 256<<10)
	s := openP(t, c)
	st := streams{}
	var ids []pagestore.SeqID
	for i := range 8 {
		id := s.Create()
		appendN(t, s, st, id, uint64(i+1), 5+3*i)
		ids = append(ids, id)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	e := c
	e.Verify, e.DataDir = pagestore.VerifyAtOpen, copyDir(t, c.DataDir)
	ref := openP(t, e)
	defer ref.Close()
	lz := openP(t, c)
	defer lz.Close()
	work := func(s *pagestore.Store, st streams, id pagestore.SeqID, i int) {
		switch i % 3 {
		case 0:
			appendN(t, s, st, id, uint64(100+i), 3)
		case 1:
			if err := s.Release(id); err != nil {
				t.Error(err)
			}
		case 2:
			mustLen(t, s, id)
		}
	}
	rst, lst := streams{}, streams{}
	for _, id := range ids {
		rst[id], lst[id] = slices.Clone(st[id]), slices.Clone(st[id])
	}
	for i, id := range ids {
		work(ref, rst, id, i)
	}
	done := make(chan streams, len(ids))
	for i, id := range ids {
		go func() {
			own := streams{id: lst[id]}
			work(lz, own, id, i)
			done <- own
		}()
	}
	for range ids {
		<-done
	}
	waitScrub(t, lz)
	if sc := lz.Scrub(); sc.Pending != 0 || len(sc.Damaged) != 0 {
		t.Fatalf("scrub %+v", sc)
	}
	var live []pagestore.SeqID
	for i, id := range ids {
		if i%3 != 1 {
			live = append(live, id)
		}
	}
	sameStores(t, "concurrent", lz, ref, live)
	if err := lz.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestParseVerify: String's names parse back, "" is the default, and
// anything else is ErrInvalidConfig.
func TestParseVerify(t *testing.T) {
	for _, v := range []pagestore.Verify{pagestore.VerifyAtOpen, pagestore.VerifyOnRead} {
		if got, err := pagestore.ParseVerify(v.String()); err != nil || got != v {
			t.Errorf("ParseVerify(%q) = %v, %v; want %v", v.String(), got, err, v)
		}
	}
	if got, err := pagestore.ParseVerify(""); err != nil || got != pagestore.VerifyAtOpen {
		t.Errorf(`ParseVerify("") = %v, %v; want at-open`, got, err)
	}
	for _, bad := range []string{"lazy", "open", "On-Read", "at-open "} {
		if _, err := pagestore.ParseVerify(bad); !errors.Is(err, pagestore.ErrInvalidConfig) {
			t.Errorf("ParseVerify(%q) = %v; want ErrInvalidConfig", bad, err)
		}
	}
}
