package disktier_test

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/pagestore/tier/tiertest"
)

// The crash images below are copies of a directory taken while its tier
// is open and idle. A copy reads the page cache, so it shows what a crash
// leaves when every slab write had reached the disk; what it tests is the
// index: which updates were committed when the copy was taken.

// TestCrashSyncOnWrite: every Write and Free that returned is in the crash
// image.
func TestCrashSyncOnWrite(t *testing.T) {
	const slots, size = 8, 4096 + 100
	c := testConfig(t.TempDir(), slots, size)
	tr := mustOpen(t, c)
	ctx := ctxT(t)
	want := map[int][]byte{}
	for s := range 6 {
		want[s] = tiertest.Payload(s, 0, size)
		if err := tr.Write(ctx, s, want[s]); err != nil {
			t.Fatal(err)
		}
	}
	want[2] = tiertest.Payload(2, 1, size)
	if err := tr.Write(ctx, 2, want[2]); err != nil {
		t.Fatal(err)
	}
	if err := tr.Free(ctx, 4); err != nil {
		t.Fatal(err)
	}
	delete(want, 4)

	img := c
	img.Dir = copyDir(t, c.Dir)
	rec := mustOpen(t, img)
	checkState(t, rec, want)
	if got := rec.Used(); !slices.Equal(got, []int{0, 1, 2, 3, 5}) {
		t.Errorf("Used of the crash image = %v", got)
	}
}

// TestCrashSyncNone: the crash image holds the state of the last Sync;
// a slot overwritten since reads ErrCorrupt (its new bytes against the
// flushed checksum), a slot first written since reads ErrEmpty and a slot
// freed since reads its flushed payload.
func TestCrashSyncNone(t *testing.T) {
	const slots, size = 6, 1000
	c := testConfig(t.TempDir(), slots, size)
	c.Durability = disktier.SyncNone
	tr := mustOpen(t, c)
	ctx := ctxT(t)
	p := func(s, g int) []byte { return tiertest.Payload(s, g, size) }
	for s := range 3 {
		if err := tr.Write(ctx, s, p(s, 0)); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing flushed yet: the image is empty.
	img := c
	img.Dir = copyDir(t, c.Dir)
	checkState(t, mustOpen(t, img), nil)

	if err := tr.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if st := tr.Stats(); st.Pending != 0 || st.Flushes != 1 || st.FlushErr != nil {
		t.Errorf("Stats after Sync: %+v", st)
	}
	if err := tr.Free(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := tr.Write(ctx, 1, p(1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Write(ctx, 4, p(4, 0)); err != nil {
		t.Fatal(err)
	}
	if st := tr.Stats(); st.Pending != 3 {
		t.Errorf("Stats.Pending = %d, want 3", st.Pending)
	}
	img.Dir = copyDir(t, c.Dir)
	rec := mustOpen(t, img)
	dst := make([]byte, size)
	for s, want := range map[int]error{0: nil, 1: tier.ErrCorrupt, 2: nil, 3: tier.ErrEmpty, 4: tier.ErrEmpty} {
		err := rec.Read(ctx, s, dst)
		if !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("crash image slot %d: %v, want %v", s, err, want)
		}
		if err == nil && !bytes.Equal(dst, p(s, 0)) {
			t.Errorf("crash image slot %d: wrong bytes without an error", s)
		}
	}
	_ = rec.Close()

	if err := tr.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	img.Dir = copyDir(t, c.Dir)
	checkState(t, mustOpen(t, img), map[int][]byte{1: p(1, 1), 2: p(2, 0), 4: p(4, 0)})
}

// TestCrashPeriodic: the flusher commits writes without a Sync call.
func TestCrashPeriodic(t *testing.T) {
	const slots, size = 4, 512
	c := testConfig(t.TempDir(), slots, size)
	c.Durability = disktier.SyncPeriodic
	c.SyncInterval = 5 * time.Millisecond
	tr := mustOpen(t, c)
	ctx := ctxT(t)
	want := map[int][]byte{}
	for s := range slots {
		want[s] = tiertest.Payload(s, 0, size)
		if err := tr.Write(ctx, s, want[s]); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := tr.Stats()
		if st.Pending == 0 && st.Flushes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no flush within 10s: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	img := c
	img.Dir = copyDir(t, c.Dir)
	checkState(t, mustOpen(t, img), want)
}
