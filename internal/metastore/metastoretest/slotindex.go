package metastoretest

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/questrt/questrt/internal/metastore"
)

// SlotIndexOpener opens one storage's slot index; every call opens the
// same storage.
type SlotIndexOpener func(opt metastore.Options) (metastore.SlotIndex, error)

// RunSlotIndex checks the slot indexes of newStorage, which returns an
// opener of fresh, empty storage for each subtest.
func RunSlotIndex(t *testing.T, newStorage func(t *testing.T) SlotIndexOpener) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, SlotIndexOpener)
	}{
		{"Entries", testIdxEntries},
		{"Format", testIdxFormat},
		{"Lock", testIdxLock},
		{"Closed", testIdxClosed},
		{"Context", testIdxContext},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newStorage(t)) })
	}
}

var slotFormat = metastore.SlotFormat{PayloadBytes: 1000, SlotAlign: 4096, SlotsPerFile: 8, SlotBytes: 4096, Slots: 16}

func openIdx(t *testing.T, o SlotIndexOpener) metastore.SlotIndex {
	t.Helper()
	x, err := o(metastore.Options{Timeout: Timeout})
	if err != nil {
		t.Fatalf("open slot index: %v", err)
	}
	t.Cleanup(func() { x.Close() })
	return x
}

// initIdx runs Init with f and checks it returns want (by slot; nil:
// every slot free).
func initIdx(t *testing.T, x metastore.SlotIndex, f metastore.SlotFormat, want map[int]metastore.SlotEntry) {
	t.Helper()
	got, err := x.Init(context.Background(), f)
	must(t, err)
	w := make([]metastore.SlotEntry, f.Slots)
	for s, e := range want {
		w[s] = e
	}
	if !reflect.DeepEqual(got, w) {
		t.Fatalf("Init returned %+v, want %+v", got, w)
	}
}

// fillIdx writes slots 1, 3 and 9 and frees 3.
func fillIdx(t *testing.T, x metastore.SlotIndex) map[int]metastore.SlotEntry {
	t.Helper()
	ctx := context.Background()
	initIdx(t, x, slotFormat, nil)
	must(t, x.Commit(ctx, map[int]metastore.SlotEntry{1: {Used: true, CRC: 11}, 3: {Used: true, CRC: 13}, 9: {Used: true, CRC: 19}}))
	must(t, x.Commit(ctx, map[int]metastore.SlotEntry{3: {}, 1: {Used: true, CRC: 21}, 5: {}}))
	return map[int]metastore.SlotEntry{1: {Used: true, CRC: 21}, 9: {Used: true, CRC: 19}}
}

func testIdxEntries(t *testing.T, o SlotIndexOpener) {
	x := openIdx(t, o)
	want := fillIdx(t, x)
	must(t, x.Close())
	x = openIdx(t, o)
	initIdx(t, x, slotFormat, want)
	// Another slot count keeps the entries (it is informational)...
	more := slotFormat
	more.Slots = 32
	initIdx(t, x, more, want)
	must(t, x.Close())
	// ...unless a used slot lies past it.
	x = openIdx(t, o)
	fewer := slotFormat
	fewer.Slots = 4
	if _, err := x.Init(context.Background(), fewer); !errors.Is(err, metastore.ErrOtherFormat) {
		t.Fatalf("Init with 4 slots, slot 9 used: %v, want ErrOtherFormat", err)
	}
	initIdx(t, x, slotFormat, want) // nothing changed
}

func testIdxFormat(t *testing.T, o SlotIndexOpener) {
	x := openIdx(t, o)
	want := fillIdx(t, x)
	for _, f := range []metastore.SlotFormat{
		{PayloadBytes: 999, SlotAlign: 4096, SlotsPerFile: 8, SlotBytes: 4096, Slots: 16},
		{PayloadBytes: 1000, SlotAlign: 512, SlotsPerFile: 8, SlotBytes: 1024, Slots: 16},
		{PayloadBytes: 1000, SlotAlign: 4096, SlotsPerFile: 4, SlotBytes: 4096, Slots: 16},
	} {
		if _, err := x.Init(context.Background(), f); !errors.Is(err, metastore.ErrOtherFormat) {
			t.Fatalf("Init with %+v: %v, want ErrOtherFormat", f, err)
		}
	}
	initIdx(t, x, slotFormat, want)
}

func testIdxLock(t *testing.T, o SlotIndexOpener) {
	x := openIdx(t, o)
	if x2, err := o(metastore.Options{Timeout: Timeout}); !errors.Is(err, metastore.ErrInUse) {
		if x2 != nil {
			x2.Close()
		}
		t.Fatalf("a second open: %v, want ErrInUse", err)
	}
	must(t, x.Close())
	openIdx(t, o)
}

func testIdxClosed(t *testing.T, o SlotIndexOpener) {
	x := openIdx(t, o)
	fillIdx(t, x)
	must(t, x.Close())
	must(t, x.Close())
	_, ierr := x.Init(context.Background(), slotFormat)
	for name, err := range map[string]error{"Init": ierr, "Commit": x.Commit(context.Background(), nil)} {
		if !errors.Is(err, metastore.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func testIdxContext(t *testing.T, o SlotIndexOpener) {
	x := openIdx(t, o)
	want := fillIdx(t, x)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, ierr := x.Init(ctx, slotFormat)
	for name, err := range map[string]error{"Init": ierr, "Commit": x.Commit(ctx, map[int]metastore.SlotEntry{1: {}})} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled", name, err)
		}
	}
	initIdx(t, x, slotFormat, want)
}
