package pagestore

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/plan"
)

// faultyData is host page data that fails the next call of one method and
// keeps its own copy of the page tables from the Table calls.
type faultyData struct {
	h      *hostData
	fail   string // "write", "reset", "copy", "rescan" or "table"; "" fails nothing
	tables map[SeqID][]int32
}

func (f *faultyData) Table(id SeqID, at int, pages []int32, n int) error {
	if err := f.hit("table"); err != nil {
		return err
	}
	if f.tables == nil {
		f.tables = map[SeqID][]int32{}
	}
	t := f.tables[id]
	for len(t) < n {
		t = append(t, -1)
	}
	t = t[:n]
	copy(t[at:], pages)
	f.tables[id] = t
	return nil
}

func (f *faultyData) Drop(id SeqID) error {
	delete(f.tables, id)
	return nil
}

// checkTables asserts that the Table calls left the data's copy of every
// live sequence's page table equal to the store's, and nothing else.
func (f *faultyData) checkTables(t *testing.T, s *Store, ids ...SeqID) {
	t.Helper()
	for _, id := range ids {
		if want := pageTable(t, s, id); !slices.Equal(f.tables[id], want) {
			t.Fatalf("seq %d: the data's page table %v, the store's %v", id, f.tables[id], want)
		}
	}
	if len(f.tables) != len(ids) {
		t.Fatalf("the data keeps %d page tables for %d live sequences", len(f.tables), len(ids))
	}
}

var errFault = errors.New("injected device fault")

func (f *faultyData) hit(m string) error {
	if f.fail == m {
		f.fail = ""
		return errFault
	}
	return nil
}

func (f *faultyData) Write(layer int, pages []int32, slot int, k, v []float32) error {
	if err := f.hit("write"); err != nil {
		// A device may have written part of the tokens before failing.
		_ = f.h.Write(layer, pages[:1], slot, k[:f.h.tok], v[:f.h.tok])
		return err
	}
	return f.h.Write(layer, pages, slot, k, v)
}

func (f *faultyData) Reset(pages []int32) error {
	if err := f.hit("reset"); err != nil {
		return err
	}
	return f.h.Reset(pages)
}

func (f *faultyData) Copy(dst, src int32, valid []int) error {
	if err := f.hit("copy"); err != nil {
		return err
	}
	return f.h.Copy(dst, src, valid)
}

func (f *faultyData) Rescan(p int32, valid int) error {
	if err := f.hit("rescan"); err != nil {
		return err
	}
	return f.h.Rescan(p, valid)
}

// meta is the metadata of a store that a failed operation must keep.
type meta struct {
	free, used, shared int
	lens               map[SeqID][]int
	tables             map[SeqID][]int32
}

func takeMeta(t *testing.T, s *Store, ids ...SeqID) meta {
	t.Helper()
	st := s.Stats()
	m := meta{free: st.FreePages, used: st.UsedPages, shared: st.SharedPages, lens: map[SeqID][]int{}, tables: map[SeqID][]int32{}}
	for _, id := range ids {
		for l := range s.cfg.Layers {
			n, err := s.LayerLen(id, l)
			if err != nil {
				t.Fatal(err)
			}
			m.lens[id] = append(m.lens[id], n)
		}
		m.tables[id] = pageTable(t, s, id)
	}
	return m
}

func (m meta) equal(t *testing.T, o meta) {
	t.Helper()
	if m.free != o.free || m.used != o.used || m.shared != o.shared {
		t.Fatalf("pool changed: free/used/shared %d/%d/%d -> %d/%d/%d", m.free, m.used, m.shared, o.free, o.used, o.shared)
	}
	for id, l := range m.lens {
		if !slices.Equal(l, o.lens[id]) || !slices.Equal(m.tables[id], o.tables[id]) {
			t.Fatalf("seq %d changed: lens %v -> %v, table %v -> %v", id, l, o.lens[id], m.tables[id], o.tables[id])
		}
	}
}

// TestPageDataFaults: a store over external page data (NewWithData)
// behaves like a host store, and a failing page data surfaces as ErrData
// leaving the metadata as the Append and Rollback docs promise; the store
// keeps working after the fault.
func TestPageDataFaults(t *testing.T) {
	const L, S, H, D = 2, 4, 2, 3
	cfg := Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 16}
	sz, err := cfg.sizes()
	if err != nil {
		t.Fatal(err)
	}
	fd := &faultyData{h: newHostData(cfg, sz)}
	s, err := NewWithData(cfg, fd)
	if err != nil {
		t.Fatal(err)
	}
	if s.HostPages() {
		t.Fatal("a store over external data claims host pages")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Layer on a store over external data did not panic")
			}
		}()
		s.Layer(0)
	}()
	if _, err := NewWithData(cfg, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil page data: %v", err)
	}
	// The checks below read the contents through the host arrays.
	s.host = fd.h
	rng := rand.New(rand.NewPCG(3, 4))
	id := s.Create()
	sh := newShadow(L)
	for l := range L {
		k, v := randKV(rng, 6, H*D)
		appendBoth(t, s, id, sh, l, k, v)
	}
	child, err := s.Fork(id)
	if err != nil {
		t.Fatal(err)
	}
	shC := sh.clone()

	for _, tc := range []struct {
		name, fail string
		tokens     int // appended to the child's layer 0
	}{
		{"reset of a new page", "reset", 3}, // 6+3 tokens reach page 2
		{"copy of the shared tail", "copy", 1},
		{"write", "write", 5},
	} {
		before := takeMeta(t, s, id, child)
		fd.fail = tc.fail
		k, v := randKV(rng, tc.tokens, H*D)
		if err := s.Append(child, 0, k, v); !errors.Is(err, ErrData) || !errors.Is(err, errFault) {
			t.Fatalf("%s: append returned %v, want ErrData wrapping the fault", tc.name, err)
		}
		after := takeMeta(t, s, id, child)
		if tc.fail == "write" {
			// The copy-on-write of the shared tail page stays: one page
			// taken, one page no longer shared, the child's table names
			// the copy.
			if after.tables[child][1] == before.tables[child][1] {
				t.Fatalf("write: the shared tail page was not copied")
			}
			after.tables[child][1] = before.tables[child][1]
			after.free, after.used, after.shared = after.free+1, after.used-1, after.shared+1
		}
		before.equal(t, after)
		checkPool(t, s)
		checkSeq(t, s, id, sh) // the sibling never sees the fault
		fd.checkTables(t, s, id, child)
	}
	fd.fail = "table" // a fork whose table cannot be written does not happen
	if _, err := s.Fork(child); !errors.Is(err, ErrData) {
		t.Fatalf("table fault: fork returned %v", err)
	}
	fd.checkTables(t, s, id, child)
	checkPool(t, s)
	// A write fault widens at most the tail's summary: rescan it by a
	// rollback of one token, then the child works again.
	if err := s.Rollback(child, 1); err != nil {
		t.Fatal(err)
	}
	shC.truncate(H*D, 5)
	checkSeq(t, s, child, shC)
	fd.fail = "rescan"
	if err := s.Rollback(child, 2); !errors.Is(err, ErrData) {
		t.Fatalf("rescan fault: rollback returned %v", err)
	}
	if n, _ := s.Len(child); n != 3 {
		t.Fatalf("after a failed rescan the child has %d tokens, want 3 (rolled back)", n)
	}
	if err := s.Rollback(child, 1); err != nil { // rescans the tail again
		t.Fatal(err)
	}
	shC.truncate(H*D, 2)
	for l := range L {
		k, v := randKV(rng, 7, H*D)
		appendBoth(t, s, child, shC, l, k, v)
	}
	checkSeq(t, s, child, shC)
	checkSeq(t, s, id, sh)
	checkPool(t, s)
	fd.checkTables(t, s, id, child)
	if err := s.Rollback(child, 9); err != nil { // to a page boundary
		t.Fatal(err)
	}
	fd.checkTables(t, s, id, child)
	if err := s.Release(id); err != nil {
		t.Fatal(err)
	}
	fd.checkTables(t, s, child)
}

// TestPageDataTableFaults: when the data fails after a copy-on-write
// changed the page table (an append whose table report fails, a rollback
// whose tail copy fails), the data's copy of the page tables still ends up
// equal to the store's, and the sibling that shares the pages keeps its
// contents.
func TestPageDataTableFaults(t *testing.T) {
	const L, S, H, D = 2, 4, 2, 3
	cfg := Config{Layers: L, Geometry: plan.Geometry{KVHeads: H, HeadDim: D, PageSize: S}, Capacity: 16}
	sz, err := cfg.sizes()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, fail string }{
		{"append: table report of a copy-on-write", "table"},
		{"append: write after a copy-on-write", "write"},
		{"rollback: copy of the shared tail", "copy"},
		{"rollback: table report", "table-rollback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd := &faultyData{h: newHostData(cfg, sz)}
			s, err := NewWithData(cfg, fd)
			if err != nil {
				t.Fatal(err)
			}
			s.host = fd.h // the checks read the contents through the host arrays
			rng := rand.New(rand.NewPCG(5, 6))
			id := s.Create()
			sh := newShadow(L)
			for l := range L {
				k, v := randKV(rng, 6, H*D)
				appendBoth(t, s, id, sh, l, k, v)
			}
			child, err := s.Fork(id) // shares the partial tail page
			if err != nil {
				t.Fatal(err)
			}
			if tc.fail == "table-rollback" {
				fd.fail = "table"
			} else {
				fd.fail = tc.fail
			}
			if tc.fail == "table" || tc.fail == "write" {
				k, v := randKV(rng, 1, H*D)
				err = s.Append(child, 0, k, v)
			} else {
				err = s.Rollback(child, 1)
			}
			if !errors.Is(err, ErrData) {
				t.Fatalf("got %v, want ErrData", err)
			}
			fd.checkTables(t, s, id, child)
			checkSeq(t, s, id, sh)
			checkPool(t, s)
		})
	}
}
