package metastoretest

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/plan"
)

// ManifestsOpener opens one storage's manifests; every call opens the
// same storage.
type ManifestsOpener func(opt metastore.Options) (metastore.Manifests, error)

// RunManifests checks the manifests of newStorage, which returns an
// opener of fresh, empty storage for each subtest.
func RunManifests(t *testing.T, newStorage func(t *testing.T) ManifestsOpener) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, ManifestsOpener)
	}{
		{"Empty", testManEmpty},
		{"Format", testManFormat},
		{"Commit", testManCommit},
		{"LongTables", testManLong},
		{"Reopen", testManReopen},
		{"Lock", testManLock},
		{"Closed", testManClosed},
		{"Context", testManContext},
		{"Copies", testManCopies},
		{"Summaries", testManSummaries},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newStorage(t)) })
	}
}

var manFormat = metastore.ManifestFormat{Layers: 2, KVHeads: 2, HeadDim: 16, PageSize: 16, DType: plan.Float32}

func manifest(id uint64, slots ...int32) metastore.Manifest {
	return metastore.Manifest{ID: id, LenRec: int32(id) + 3, Lens: []int{len(slots) * 16, len(slots)*16 - 1}, Slots: slots}
}

func openMan(t *testing.T, o ManifestsOpener, readOnly bool) metastore.Manifests {
	t.Helper()
	m, err := o(metastore.Options{ReadOnly: readOnly, Timeout: Timeout})
	if err != nil {
		t.Fatalf("open manifests (read-only %v): %v", readOnly, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func load(t *testing.T, m metastore.Manifests) metastore.Loaded {
	t.Helper()
	l, err := m.Load(context.Background())
	must(t, err)
	return l
}

func wantLoaded(t *testing.T, m metastore.Manifests, want metastore.Loaded) {
	t.Helper()
	if got := load(t, m); !reflect.DeepEqual(got, want) {
		t.Fatalf("the manifests hold\n%+v\nwant\n%+v", got, want)
	}
}

// fillMan commits three manifests (2 deleted, 3 replaced) with their
// slot records and returns what the manifests then hold.
func fillMan(t *testing.T, m metastore.Manifests) metastore.Loaded {
	t.Helper()
	ctx := context.Background()
	must(t, m.Init(ctx, manFormat))
	must(t, m.Commit(ctx, metastore.ManifestBatch{
		SlotCRC: map[int32]uint32{0: 10, 1: 11, 2: 12, 3: 13},
		Put:     []metastore.Manifest{manifest(1, 0, 1), manifest(2, 2), manifest(3, 3)},
		NextID:  4,
	}))
	must(t, m.Commit(ctx, metastore.ManifestBatch{
		SlotCRC: map[int32]uint32{4: 14},
		Put:     []metastore.Manifest{manifest(3, 3, 4)},
		Delete:  []uint64{2},
	}))
	return metastore.Loaded{NextID: 4,
		Manifests: []metastore.ManifestRecord{{Manifest: manifest(1, 0, 1)}, {Manifest: manifest(3, 3, 4)}},
		SlotCRC:   map[int32]uint32{0: 10, 1: 11, 2: 12, 3: 13, 4: 14}, BadSlots: map[int32]error{}}
}

func emptyLoaded() metastore.Loaded {
	return metastore.Loaded{SlotCRC: map[int32]uint32{}, BadSlots: map[int32]error{}}
}

func testManEmpty(t *testing.T, o ManifestsOpener) {
	m := openMan(t, o, false)
	wantLoaded(t, m, emptyLoaded())
	must(t, m.Init(context.Background(), manFormat))
	wantLoaded(t, m, emptyLoaded())
}

func testManFormat(t *testing.T, o ManifestsOpener) {
	ctx := context.Background()
	m := openMan(t, o, false)
	want := fillMan(t, m)
	must(t, m.Init(ctx, manFormat))
	for _, f := range []metastore.ManifestFormat{
		{Layers: 3, KVHeads: 2, HeadDim: 16, PageSize: 16},
		{Layers: 2, KVHeads: 2, HeadDim: 16, PageSize: 16, DType: plan.FP8},
	} {
		err := m.Init(ctx, f)
		var fe *metastore.FormatError
		if !errors.Is(err, metastore.ErrOtherFormat) || !errors.As(err, &fe) {
			t.Fatalf("Init with %+v: %v, want a *FormatError", f, err)
		}
	}
	wantLoaded(t, m, want)
}

func testManCommit(t *testing.T, o ManifestsOpener) {
	ctx := context.Background()
	m := openMan(t, o, false)
	want := fillMan(t, m)
	wantLoaded(t, m, want)
	// Recovery's commit: keep only the slots still named, record the id.
	must(t, m.Commit(ctx, metastore.ManifestBatch{Delete: []uint64{1, 99}, RetainSlots: map[int32]bool{3: true, 4: true, 7: true}, NextID: 9}))
	want = metastore.Loaded{NextID: 9, Manifests: want.Manifests[1:], SlotCRC: map[int32]uint32{3: 13, 4: 14}, BadSlots: map[int32]error{}}
	wantLoaded(t, m, want)
	// An empty batch changes nothing; NextID 0 keeps the recorded one.
	must(t, m.Commit(ctx, metastore.ManifestBatch{}))
	wantLoaded(t, m, want)
	// A manifest of no pages.
	must(t, m.Commit(ctx, metastore.ManifestBatch{Put: []metastore.Manifest{{ID: 5, Lens: []int{0, 0}}}}))
	want.Manifests = append(want.Manifests, metastore.ManifestRecord{Manifest: metastore.Manifest{ID: 5, Lens: []int{0, 0}}})
	wantLoaded(t, m, want)
}

// testManLong: tables of several thousand slots grow, change in the
// middle and shrink.
func testManLong(t *testing.T, o ManifestsOpener) {
	ctx := context.Background()
	m := openMan(t, o, false)
	must(t, m.Init(ctx, manFormat))
	slots := make([]int32, 2500)
	for i := range slots {
		slots[i] = int32(i)
	}
	for _, n := range []int{1024, 2500, 1025, 3} {
		s := append([]int32(nil), slots[:n]...)
		s[n/2] = int32(n) + 10000
		must(t, m.Commit(ctx, metastore.ManifestBatch{Put: []metastore.Manifest{manifest(1, s...)}}))
		l := load(t, m)
		if len(l.Manifests) != 1 || l.Manifests[0].Err != nil || !reflect.DeepEqual(l.Manifests[0].Manifest, manifest(1, s...)) {
			t.Fatalf("a table of %d slots read back as %d (%v)", n, len(l.Manifests[0].Manifest.Slots), l.Manifests[0].Err)
		}
	}
}

func testManReopen(t *testing.T, o ManifestsOpener) {
	m := openMan(t, o, false)
	want := fillMan(t, m)
	must(t, m.Close())
	m = openMan(t, o, false)
	must(t, m.Init(context.Background(), manFormat))
	wantLoaded(t, m, want)
}

func testManLock(t *testing.T, o ManifestsOpener) {
	m := openMan(t, o, false)
	if m2, err := o(metastore.Options{Timeout: Timeout}); !errors.Is(err, metastore.ErrInUse) {
		if m2 != nil {
			m2.Close()
		}
		t.Fatalf("a second open: %v, want ErrInUse", err)
	}
	must(t, m.Close())
	openMan(t, o, false)
}

func testManClosed(t *testing.T, o ManifestsOpener) {
	ctx := context.Background()
	m := openMan(t, o, false)
	fillMan(t, m)
	must(t, m.Close())
	must(t, m.Close())
	_, lerr := m.Load(ctx)
	for name, err := range map[string]error{"Load": lerr, "Init": m.Init(ctx, manFormat), "Commit": m.Commit(ctx, metastore.ManifestBatch{})} {
		if !errors.Is(err, metastore.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func testManContext(t *testing.T, o ManifestsOpener) {
	m := openMan(t, o, false)
	want := fillMan(t, m)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, lerr := m.Load(ctx)
	for name, err := range map[string]error{"Load": lerr, "Init": m.Init(ctx, manFormat),
		"Commit": m.Commit(ctx, metastore.ManifestBatch{Delete: []uint64{1}, NextID: 50})} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled", name, err)
		}
	}
	wantLoaded(t, m, want)
}

func testManCopies(t *testing.T, o ManifestsOpener) {
	ctx := context.Background()
	m := openMan(t, o, false)
	want := fillMan(t, m)
	p := manifest(6, 8)
	must(t, m.Commit(ctx, metastore.ManifestBatch{Put: []metastore.Manifest{p}}))
	p.Slots[0], p.Lens[0] = 99, 99
	got := load(t, m)
	got.Manifests[0].Manifest.Slots[0] = 98
	want.Manifests = append(want.Manifests, metastore.ManifestRecord{Manifest: manifest(6, 8)})
	wantLoaded(t, m, want)
}

// testManSummaries: a slot's summary record comes back with its slot
// record, goes with a rewrite of the slot that carries none and with
// RetainSlots, and is a copy both ways.
func testManSummaries(t *testing.T, o ManifestsOpener) {
	ctx := context.Background()
	m := openMan(t, o, false)
	want := fillMan(t, m)
	if got := load(t, m); got.Summaries != nil || got.BadSummaries != nil {
		t.Fatalf("summaries %v, bad %v before any was recorded", got.Summaries, got.BadSummaries)
	}
	sum5, sum6 := []byte{1, 2, 3, 4, 5}, []byte{6}
	must(t, m.Commit(ctx, metastore.ManifestBatch{
		SlotCRC:   map[int32]uint32{5: 15, 6: 16, 0: 20},
		Summaries: map[int32][]byte{5: sum5, 6: sum6, 9: {9}}, // 9: no slot record, ignored
		Put:       []metastore.Manifest{manifest(7, 5, 6)},
	}))
	sum5[0] = 99
	want.Manifests = append(want.Manifests, metastore.ManifestRecord{Manifest: manifest(7, 5, 6)})
	want.SlotCRC[5], want.SlotCRC[6], want.SlotCRC[0] = 15, 16, 20
	want.Summaries = map[int32][]byte{5: {1, 2, 3, 4, 5}, 6: {6}}
	wantLoaded(t, m, want)
	got := load(t, m)
	got.Summaries[5][0] = 42
	wantLoaded(t, m, want)
	// Slot 6 rewritten without a summary: its record goes.
	must(t, m.Commit(ctx, metastore.ManifestBatch{SlotCRC: map[int32]uint32{6: 26}}))
	want.SlotCRC[6] = 26
	delete(want.Summaries, 6)
	wantLoaded(t, m, want)
	// RetainSlots drops the summary records of the slots it drops.
	must(t, m.Commit(ctx, metastore.ManifestBatch{SlotCRC: map[int32]uint32{6: 26}, Summaries: map[int32][]byte{6: {7}}}))
	must(t, m.Commit(ctx, metastore.ManifestBatch{RetainSlots: map[int32]bool{0: true, 1: true, 3: true, 4: true, 6: true}}))
	want.Manifests = want.Manifests[:2]
	must(t, m.Commit(ctx, metastore.ManifestBatch{Delete: []uint64{7}}))
	want.SlotCRC = map[int32]uint32{0: 20, 1: 11, 3: 13, 4: 14, 6: 26}
	want.Summaries = map[int32][]byte{6: {7}}
	wantLoaded(t, m, want)
}
