// Package metastoretest is the conformance suite of metastore's
// interfaces: every implementation (the bbolt one and the in-memory
// twin) passes Run, as fstest.TestFS checks an fs.FS.
package metastoretest

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/plan"
)

// Opener opens one storage's sequence table; every call opens the same
// storage (a file, a Mem), so that what a closed table committed is
// there for the next.
type Opener func(opt metastore.Options) (metastore.SeqTable, error)

// Timeout is the lock timeout the suite opens with: an open that
// conflicts with another fails with ErrInUse within it.
const Timeout = 50 * time.Millisecond

// Run checks the sequence tables of newStorage, which returns an Opener
// of fresh, empty storage for each subtest.
func Run(t *testing.T, newStorage func(t *testing.T) Opener) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"Empty", testEmpty},
		{"Format", testFormat},
		{"Entries", testEntries},
		{"Marks", testMarks},
		{"Reopen", testReopen},
		{"Lock", testLock},
		{"ReadOnly", testReadOnly},
		{"Closed", testClosed},
		{"Context", testContext},
		{"Copies", testCopies},
		{"Concurrent", testConcurrent},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newStorage(t)) })
	}
}

// Sample values, every field set.
var (
	format = metastore.Format{Layers: 2, Geometry: plan.Geometry{QHeads: 4, KVHeads: 2, HeadDim: 16, PageSize: 16}, CP: 2, TP: 1,
		Ranks: []metastore.Rank{{TP: 0, CP: 0}, {TP: 0, CP: 1}}}
	other = metastore.Format{Layers: 3, Geometry: format.Geometry, CP: 1, TP: 1, Ranks: []metastore.Rank{{}}}
)

func entry(seq uint64) metastore.Entry {
	return metastore.Entry{Seq: seq, Grid: "g", Nodes: []string{"a", "b"}, Placement: plan.Contiguous, BlockPages: 2,
		Ranks: []metastore.EntryRank{{TP: 0, CP: 0, Store: seq + 10}, {TP: 0, CP: 1, Store: seq + 20}}}
}

func mark(step uint64) metastore.StepMark {
	return metastore.StepMark{Step: step, Lens: [][]int{{15, -1}, nil}}
}

func open(t *testing.T, o Opener, readOnly bool) metastore.SeqTable {
	t.Helper()
	st, err := o(metastore.Options{ReadOnly: readOnly, Timeout: Timeout})
	if err != nil {
		t.Fatalf("open (read-only %v): %v", readOnly, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// contents is everything a table holds.
type contents struct {
	Format   metastore.Format
	Formated bool
	Entries  []metastore.Record
	Marks    map[uint64]metastore.StepMark
}

func read(t *testing.T, st metastore.SeqTable) contents {
	t.Helper()
	ctx := context.Background()
	var c contents
	var err error
	c.Format, c.Formated, err = st.Format(ctx)
	must(t, err)
	c.Entries, err = st.Entries(ctx)
	must(t, err)
	c.Marks, err = st.Marks(ctx)
	must(t, err)
	return c
}

func wantContents(t *testing.T, st metastore.SeqTable, want contents) {
	t.Helper()
	if got := read(t, st); !reflect.DeepEqual(got, want) {
		t.Fatalf("the table holds\n%+v\nwant\n%+v", got, want)
	}
}

// fill writes format, entries 1..3 (2 deleted, 3 replaced) and a
// marker, and returns what the table then holds.
func fill(t *testing.T, st metastore.SeqTable) contents {
	t.Helper()
	ctx := context.Background()
	must(t, st.Init(ctx, format))
	for i := uint64(1); i <= 3; i++ {
		k, err := st.Add(ctx, entry(i))
		must(t, err)
		if k != i {
			t.Fatalf("Add gave key %d, want %d", k, i)
		}
	}
	must(t, st.Delete(ctx, 2))
	e3 := entry(33)
	must(t, st.Put(ctx, 3, e3))
	must(t, st.PutMarks(ctx, map[uint64]metastore.StepMark{1: mark(7)}))
	return contents{Format: format, Formated: true,
		Entries: []metastore.Record{{Key: 1, Entry: entry(1)}, {Key: 3, Entry: e3}},
		Marks:   map[uint64]metastore.StepMark{1: mark(7)}}
}

func testEmpty(t *testing.T, o Opener) {
	st := open(t, o, false)
	wantContents(t, st, contents{Marks: map[uint64]metastore.StepMark{}})
	ctx := context.Background()
	must(t, st.Delete(ctx, 5))
	must(t, st.DeleteMarks(ctx, 5))
	must(t, st.ClearMarks(ctx))
	wantContents(t, st, contents{Marks: map[uint64]metastore.StepMark{}})
}

func testFormat(t *testing.T, o Opener) {
	ctx := context.Background()
	st := open(t, o, false)
	must(t, st.Init(ctx, format))
	must(t, st.Init(ctx, format)) // the same record: accepted
	err := st.Init(ctx, other)
	var fe *metastore.FormatError
	if !errors.Is(err, metastore.ErrOtherFormat) || !errors.As(err, &fe) || len(fe.Have) == 0 || len(fe.Want) == 0 {
		t.Fatalf("Init with another format: %v, want a *FormatError (ErrOtherFormat)", err)
	}
	f, ok, err := st.Format(ctx)
	if err != nil || !ok || !reflect.DeepEqual(f, format) {
		t.Fatalf("Format after a refused Init: %+v, %v, %v; want the first record", f, ok, err)
	}
}

func testEntries(t *testing.T, o Opener) {
	ctx := context.Background()
	st := open(t, o, false)
	want := fill(t, st)
	wantContents(t, st, want)
	// A key Put beyond the next is never given by Add.
	must(t, st.Put(ctx, 10, entry(10)))
	k, err := st.Add(ctx, entry(11))
	if err != nil || k != 11 {
		t.Fatalf("Add after Put(10): key %d, %v; want 11", k, err)
	}
	// A deleted key is not given again.
	must(t, st.Delete(ctx, 11, 10, 99))
	if k, err := st.Add(ctx, entry(12)); err != nil || k != 12 {
		t.Fatalf("Add after deleting 11: key %d, %v; want 12", k, err)
	}
	if err := st.Put(ctx, 0, entry(1)); err == nil {
		t.Fatal("Put under key 0 succeeded")
	}
	want.Entries = append(want.Entries, metastore.Record{Key: 12, Entry: entry(12)})
	wantContents(t, st, want)
}

func testMarks(t *testing.T, o Opener) {
	ctx := context.Background()
	st := open(t, o, false)
	want := fill(t, st)
	must(t, st.PutMarks(ctx, map[uint64]metastore.StepMark{1: mark(8), 3: mark(8)}))
	want.Marks = map[uint64]metastore.StepMark{1: mark(8), 3: mark(8)}
	wantContents(t, st, want)
	must(t, st.DeleteMarks(ctx, 3, 42))
	delete(want.Marks, 3)
	wantContents(t, st, want)
	must(t, st.PutMarks(ctx, nil))
	wantContents(t, st, want)
	must(t, st.ClearMarks(ctx))
	want.Marks = map[uint64]metastore.StepMark{}
	wantContents(t, st, want) // the entries stay
}

func testReopen(t *testing.T, o Opener) {
	ctx := context.Background()
	st := open(t, o, false)
	want := fill(t, st)
	must(t, st.Close())
	st = open(t, o, false)
	wantContents(t, st, want)
	// The next key survives too.
	if k, err := st.Add(ctx, entry(4)); err != nil || k != 4 {
		t.Fatalf("Add after reopen: key %d, %v; want 4", k, err)
	}
	must(t, st.Close())
	ro := open(t, o, true)
	want.Entries = append(want.Entries, metastore.Record{Key: 4, Entry: entry(4)})
	wantContents(t, ro, want)
}

func testLock(t *testing.T, o Opener) {
	st := open(t, o, false)
	for _, ro := range []bool{false, true} {
		if st2, err := o(metastore.Options{ReadOnly: ro, Timeout: Timeout}); !errors.Is(err, metastore.ErrInUse) {
			if st2 != nil {
				st2.Close()
			}
			t.Fatalf("open (read-only %v) while a writer holds the table: %v, want ErrInUse", ro, err)
		}
	}
	must(t, st.Close())
	r1 := open(t, o, true)
	r2 := open(t, o, true) // readers share
	if st2, err := o(metastore.Options{Timeout: Timeout}); !errors.Is(err, metastore.ErrInUse) {
		if st2 != nil {
			st2.Close()
		}
		t.Fatalf("writable open while readers hold the table: %v, want ErrInUse", err)
	}
	must(t, r1.Close())
	must(t, r2.Close())
	open(t, o, false)
}

func testReadOnly(t *testing.T, o Opener) {
	ctx := context.Background()
	st := open(t, o, false)
	want := fill(t, st)
	must(t, st.Close())
	ro := open(t, o, true)
	for name, err := range map[string]error{
		"Init":        ro.Init(ctx, format),
		"Put":         ro.Put(ctx, 1, entry(1)),
		"Delete":      ro.Delete(ctx, 1),
		"PutMarks":    ro.PutMarks(ctx, map[uint64]metastore.StepMark{1: mark(1)}),
		"DeleteMarks": ro.DeleteMarks(ctx, 1),
		"ClearMarks":  ro.ClearMarks(ctx),
	} {
		if !errors.Is(err, metastore.ErrReadOnly) {
			t.Errorf("%s read-only: %v, want ErrReadOnly", name, err)
		}
	}
	if _, err := ro.Add(ctx, entry(9)); !errors.Is(err, metastore.ErrReadOnly) {
		t.Errorf("Add read-only: %v, want ErrReadOnly", err)
	}
	wantContents(t, ro, want)
}

func testClosed(t *testing.T, o Opener) {
	ctx := context.Background()
	st := open(t, o, false)
	fill(t, st)
	must(t, st.Close())
	must(t, st.Close()) // idempotent
	_, _, ferr := st.Format(ctx)
	_, eerr := st.Entries(ctx)
	_, merr := st.Marks(ctx)
	_, aerr := st.Add(ctx, entry(1))
	for name, err := range map[string]error{
		"Format": ferr, "Entries": eerr, "Marks": merr, "Add": aerr,
		"Init": st.Init(ctx, format), "Put": st.Put(ctx, 1, entry(1)), "Delete": st.Delete(ctx, 1),
		"PutMarks": st.PutMarks(ctx, nil), "DeleteMarks": st.DeleteMarks(ctx, 1), "ClearMarks": st.ClearMarks(ctx),
	} {
		if !errors.Is(err, metastore.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func testContext(t *testing.T, o Opener) {
	st := open(t, o, false)
	want := fill(t, st)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, ferr := st.Format(ctx)
	_, eerr := st.Entries(ctx)
	_, merr := st.Marks(ctx)
	_, aerr := st.Add(ctx, entry(9))
	for name, err := range map[string]error{
		"Format": ferr, "Entries": eerr, "Marks": merr, "Add": aerr,
		"Init": st.Init(ctx, other), "Put": st.Put(ctx, 1, entry(9)), "Delete": st.Delete(ctx, 1),
		"PutMarks": st.PutMarks(ctx, map[uint64]metastore.StepMark{3: mark(9)}), "DeleteMarks": st.DeleteMarks(ctx, 1),
		"ClearMarks": st.ClearMarks(ctx),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled", name, err)
		}
	}
	wantContents(t, st, want)
}

// testCopies: what a caller does to the values it passed or got changes
// nothing in the table.
func testCopies(t *testing.T, o Opener) {
	ctx := context.Background()
	st := open(t, o, false)
	want := fill(t, st)
	e := entry(5)
	k, err := st.Add(ctx, e)
	must(t, err)
	e.Nodes[0], e.Ranks[0].Store = "x", 99
	m := mark(9)
	must(t, st.PutMarks(ctx, map[uint64]metastore.StepMark{k: m}))
	m.Lens[0][0] = 99
	got := read(t, st)
	got.Entries[0].Entry.Nodes[0] = "y"
	got.Marks[1].Lens[0][0] = 98
	want.Entries = append(want.Entries, metastore.Record{Key: k, Entry: entry(5)})
	want.Marks[k] = mark(9)
	wantContents(t, st, want)
}

// testConcurrent: Adds from several goroutines get distinct keys, and
// every entry is there after.
func testConcurrent(t *testing.T, o Opener) {
	ctx := context.Background()
	st := open(t, o, false)
	must(t, st.Init(ctx, format))
	const n = 8
	keys := make([]uint64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := st.Add(ctx, entry(uint64(i)))
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		}()
	}
	wg.Wait()
	recs, err := st.Entries(ctx)
	must(t, err)
	seen := map[uint64]bool{}
	for i, k := range keys {
		if k == 0 || seen[k] {
			t.Fatalf("keys %v: not distinct", keys)
		}
		seen[k] = true
		if j := k - 1; int(j) >= len(recs) || recs[j].Entry.Seq != uint64(i) {
			t.Fatalf("entry %d under key %d: %+v", i, k, recs)
		}
	}
}
