package collective_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
)

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestMailboxesForgetBounded forgets a million tags, two per layer of
// failed steps as the workers do: the tags remembered and the heap stay
// bounded, a late message under a recently forgotten tag is still
// dropped, not buffered, and one under a tag never forgotten is kept.
func TestMailboxesForgetBounded(t *testing.T) {
	const n = 1_000_000
	const layers = 4
	b := collective.NewMailboxes()
	defer b.Close()
	// The tags kept, in the order forgotten: the first and the last ones
	// (allocated before the heap is measured).
	tags := make([]uint64, 0, 4*collective.ForgetHistory+20)
	before := heapAlloc()
	for i := range n / 2 {
		step, layer := uint64(1+i/layers), i%layers
		for _, op := range []collective.Op{collective.OpSelect, collective.OpReduce} {
			tag := collective.MakeTag(step, layer, op)
			b.Forget(tag)
			b.Forget(tag) // EndStep may forget a layer twice: no new entry
			if len(tags) < 2*collective.ForgetHistory+10 || i >= n/2-collective.ForgetHistory {
				tags = append(tags, tag)
			}
		}
		if i%(n/20) == 0 {
			if got := b.Forgotten(); got > 2*collective.ForgetHistory {
				t.Fatalf("after %d tags: %d forgotten tags remembered, want at most %d", 2*i, got, 2*collective.ForgetHistory)
			}
		}
	}
	if got := b.Forgotten(); got < collective.ForgetHistory || got > 2*collective.ForgetHistory {
		t.Fatalf("%d forgotten tags remembered, want %d..%d", got, collective.ForgetHistory, 2*collective.ForgetHistory)
	}
	grown := int64(heapAlloc()) - int64(before)
	t.Logf("%d tags forgotten: %d remembered, heap grew %d KiB", n, b.Forgotten(), grown/1024)
	// Two maps of at most ForgetHistory uint64 keys each: measured 251
	// KiB for ForgetHistory 4096 on amd64 (1117 KiB for 16384); the bound
	// leaves 4x, and scales with ForgetHistory.
	if limit := int64(collective.ForgetHistory) * 256; grown > limit {
		t.Errorf("heap grew %d KiB after %d forgotten tags, want < %d KiB", grown/1024, n, limit/1024)
	}

	// The last ForgetHistory forgotten tags are all still forgotten: late
	// messages under them are dropped.
	recent := tags[len(tags)-collective.ForgetHistory:]
	for i, tag := range recent {
		if err := b.Put(1, tag, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if p := b.Pending(); p != 0 {
		t.Fatalf("%d late messages of the last %d forgotten tags were buffered, want all dropped", p, collective.ForgetHistory)
	}
	// A tag forgotten 2*ForgetHistory+ tags ago is no longer remembered:
	// its message is buffered like any other (the documented price of the
	// bound).
	old := tags[0]
	if err := b.Put(1, old, []byte("late")); err != nil {
		t.Fatal(err)
	}
	// A tag never forgotten is kept and received.
	fresh := collective.MakeTag(n, 0, collective.OpSelect)
	if err := b.Put(2, fresh, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if p := b.Pending(); p != 2 {
		t.Fatalf("pending %d, want 2 (the evicted tag's and the fresh tag's)", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if msg, err := b.Take(ctx, 2, fresh, nil, nil); err != nil || string(msg) != "ok" {
		t.Fatalf("take fresh: %q, %v", msg, err)
	}
	// Forgetting the old tag again drops its buffered message and makes
	// it the latest forgotten tag.
	b.Forget(old)
	if p := b.Pending(); p != 0 {
		t.Fatalf("pending %d after forgetting the old tag again, want 0", p)
	}
	for i := range collective.ForgetHistory - 1 {
		b.Forget(collective.MakeTag(uint64(n+1+i), 0, collective.OpReduce))
	}
	if err := b.Put(1, old, []byte("late again")); err != nil {
		t.Fatal(err)
	}
	if p := b.Pending(); p != 0 {
		t.Fatalf("a re-forgotten tag's late message was buffered after %d more forgotten tags", collective.ForgetHistory-1)
	}
}

// TestMailboxesForgetWaiter: Forget drops what nobody waits on; a message
// of a forgotten tag put while a Take waits on it is dropped too, and the
// waiter ends with its context.
func TestMailboxesForgetWaiter(t *testing.T) {
	b := collective.NewMailboxes()
	defer b.Close()
	tag := collective.MakeTag(7, 1, collective.OpReduce)
	if err := b.Put(0, tag, []byte("x")); err != nil {
		t.Fatal(err)
	}
	b.Forget(tag)
	if p := b.Pending(); p != 0 {
		t.Fatalf("pending %d after Forget, want 0", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.Take(ctx, 0, tag, nil, nil)
		done <- err
	}()
	if err := b.Put(0, tag, []byte("late")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != context.DeadlineExceeded {
		t.Fatalf("take under a forgotten tag: %v, want the deadline", err)
	}
	if p := b.Pending(); p != 0 {
		t.Fatalf("pending %d, want 0", p)
	}
	b.Close()
	b.Forget(tag) // after Close: nothing, no panic
	if err := b.Put(0, tag, nil); err != collective.ErrClosed {
		t.Fatalf("put after close: %v", err)
	}
}
