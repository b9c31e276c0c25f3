// Package transporttest is the conformance suite every collective.Transport
// must pass (the in-process one here, the gRPC one later): matching by
// (sender, tag), buffering of messages nobody asked for yet, per-tag FIFO
// order, ownership of buffers, context deadlines and cancellation, and the
// behaviour of closed members and peers. Callers run it under goleak.
package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
)

// NewGroup returns the n members of a fresh group, member i with rank i.
// The suite closes every member it is given.
type NewGroup func(t *testing.T, n int) []collective.Transport

// CallDeadline is the deadline of the suite's calls that must succeed or
// fail promptly; no scheduling delay of a loaded machine comes near it.
const CallDeadline = 10 * time.Second

// Prompt is how long a call that must not wait (a pending Recv whose peer
// closed, a cancelled call) may take before the suite reports it: half of
// CallDeadline, so a call that waited for its deadline instead fails, and
// a prompt one on a loaded machine cannot.
const Prompt = CallDeadline / 2

// Run runs the suite against newGroup.
func Run(t *testing.T, newGroup NewGroup) {
	tests := []struct {
		name string
		f    func(*testing.T, NewGroup)
	}{
		{"RankSize", testRankSize},
		{"SendRecv", testSendRecv},
		{"BufferedFIFO", testBufferedFIFO},
		{"TagsOutOfOrder", testTagsOutOfOrder},
		{"FastRankAhead", testFastRankAhead},
		{"SendCopies", testSendCopies},
		{"SelfSend", testSelfSend},
		{"EmptyMessage", testEmptyMessage},
		{"BadRank", testBadRank},
		{"RecvDeadline", testRecvDeadline},
		{"RecvCancel", testRecvCancel},
		{"DoneContext", testDoneContext},
		{"PeerClosePending", testPeerClosePending},
		{"PeerCloseDrains", testPeerCloseDrains},
		{"SendToClosedPeer", testSendToClosedPeer},
		{"OwnClose", testOwnClose},
		{"Concurrent", testConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, newGroup) })
	}
}

func group(t *testing.T, newGroup NewGroup, n int) []collective.Transport {
	t.Helper()
	trs := newGroup(t, n)
	if len(trs) != n {
		t.Fatalf("newGroup(%d) returned %d members", n, len(trs))
	}
	t.Cleanup(func() {
		for _, tr := range trs {
			if err := tr.Close(); err != nil {
				t.Errorf("close rank %d: %v", tr.Rank(), err)
			}
		}
	})
	return trs
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), CallDeadline)
	t.Cleanup(cancel)
	return ctx
}

func send(t *testing.T, tr collective.Transport, to int, tag uint64, msg string) {
	t.Helper()
	if err := tr.Send(ctxT(t), to, tag, []byte(msg)); err != nil {
		t.Fatalf("rank %d send to %d tag %d: %v", tr.Rank(), to, tag, err)
	}
}

func recv(t *testing.T, tr collective.Transport, from int, tag uint64, want string) {
	t.Helper()
	got, err := tr.Recv(ctxT(t), from, tag)
	if err != nil {
		t.Fatalf("rank %d recv from %d tag %d: %v", tr.Rank(), from, tag, err)
	}
	if string(got) != want {
		t.Fatalf("rank %d recv from %d tag %d = %q, want %q", tr.Rank(), from, tag, got, want)
	}
}

// within runs f and fails unless it returns within d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	start := time.Now()
	f()
	if el := time.Since(start); el > d {
		t.Errorf("%s took %v, want < %v", what, el, d)
	}
}

func testRankSize(t *testing.T, ng NewGroup) {
	for _, n := range []int{1, 2, 5} {
		trs := group(t, ng, n)
		for i, tr := range trs {
			if tr.Rank() != i || tr.Size() != n {
				t.Errorf("member %d: rank %d size %d, want %d %d", i, tr.Rank(), tr.Size(), i, n)
			}
		}
	}
}

func testSendRecv(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 3)
	for from := range 3 {
		for to := range 3 {
			if from != to {
				send(t, trs[from], to, 7, fmt.Sprintf("%d->%d", from, to))
			}
		}
	}
	for to := range 3 {
		for from := 2; from >= 0; from-- {
			if from != to {
				recv(t, trs[to], from, 7, fmt.Sprintf("%d->%d", from, to))
			}
		}
	}
}

func testBufferedFIFO(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	for i := range 100 {
		send(t, trs[0], 1, 42, fmt.Sprint(i))
	}
	for i := range 100 {
		recv(t, trs[1], 0, 42, fmt.Sprint(i))
	}
}

func testTagsOutOfOrder(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 3)
	// Rank 0 and 2 send rounds 1..5 in opposite orders; rank 1 asks in
	// order and must get each round's message from each sender.
	for tag := uint64(5); tag >= 1; tag-- {
		send(t, trs[0], 1, tag, fmt.Sprintf("r0 t%d", tag))
	}
	for tag := uint64(1); tag <= 5; tag++ {
		send(t, trs[2], 1, tag, fmt.Sprintf("r2 t%d", tag))
	}
	for tag := uint64(1); tag <= 5; tag++ {
		recv(t, trs[1], 2, tag, fmt.Sprintf("r2 t%d", tag))
		recv(t, trs[1], 0, tag, fmt.Sprintf("r0 t%d", tag))
	}
	// A Recv pending on one tag is not satisfied by another tag.
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	go func() {
		_, err := trs[1].Recv(ctx, 0, 99)
		done <- err
	}()
	send(t, trs[0], 1, 98, "other tag")
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("recv tag 99 with only tag 98 sent: %v, want deadline", err)
	}
	recv(t, trs[1], 0, 98, "other tag")
}

// testFastRankAhead: every rank runs rounds of an all-to-all; odd ranks
// sleep before each round, so even ranks are already sending round t+1
// while odd ones receive round t.
func testFastRankAhead(t *testing.T, ng NewGroup) {
	const n, rounds = 4, 20
	trs := group(t, ng, n)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for r := range n {
		wg.Go(func() {
			tr := trs[r]
			for round := range uint64(rounds) {
				if r%2 == 1 {
					time.Sleep(time.Millisecond)
				}
				for p := range n {
					if p != r {
						if err := tr.Send(ctx, p, round, fmt.Appendf(nil, "%d/%d", r, round)); err != nil {
							errs <- err
							return
						}
					}
				}
				for p := range n {
					if p == r {
						continue
					}
					got, err := tr.Recv(ctx, p, round)
					if err != nil {
						errs <- err
						return
					}
					if want := fmt.Sprintf("%d/%d", p, round); string(got) != want {
						errs <- fmt.Errorf("rank %d round %d from %d: %q, want %q", r, round, p, got, want)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testSendCopies(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	msg := []byte("hello")
	if err := trs[0].Send(ctxT(t), 1, 1, msg); err != nil {
		t.Fatal(err)
	}
	copy(msg, "XXXXX")
	got, err := trs[1].Recv(ctxT(t), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "hello" {
		t.Fatalf("got %q after the sender reused its buffer, want hello", got)
	}
	got[0] = 'J' // the receiver owns it
}

func testSelfSend(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	send(t, trs[1], 1, 3, "me")
	recv(t, trs[1], 1, 3, "me")
}

func testEmptyMessage(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	send(t, trs[0], 1, 3, "")
	recv(t, trs[1], 0, 3, "")
}

func testBadRank(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	ctx := ctxT(t)
	for _, r := range []int{-1, 2} {
		if err := trs[0].Send(ctx, r, 1, nil); !errors.Is(err, collective.ErrBadRank) {
			t.Errorf("send to %d: %v, want ErrBadRank", r, err)
		}
		if _, err := trs[0].Recv(ctx, r, 1); !errors.Is(err, collective.ErrBadRank) {
			t.Errorf("recv from %d: %v, want ErrBadRank", r, err)
		}
	}
}

func testRecvDeadline(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	within(t, 50*time.Millisecond+Prompt, "recv past its deadline", func() {
		if _, err := trs[0].Recv(ctx, 1, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("recv: %v, want DeadlineExceeded", err)
		}
	})
	// The transport still works afterwards, for that (sender, tag) too.
	send(t, trs[1], 0, 1, "late")
	recv(t, trs[0], 1, 1, "late")
}

func testRecvCancel(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	within(t, Prompt, "cancelled recv", func() {
		if _, err := trs[0].Recv(ctx, 1, 1); !errors.Is(err, context.Canceled) {
			t.Errorf("recv: %v, want Canceled", err)
		}
	})
}

func testDoneContext(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := trs[0].Send(ctx, 1, 1, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Errorf("send with a done ctx: %v, want Canceled", err)
	}
	if _, err := trs[0].Recv(ctx, 1, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("recv with a done ctx: %v, want Canceled", err)
	}
}

func testPeerClosePending(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 3)
	ctx := ctxT(t)
	errc := make(chan error, 2)
	for _, r := range []int{0, 2} {
		go func() {
			_, err := trs[r].Recv(ctx, 1, 5)
			errc <- err
		}()
	}
	time.Sleep(20 * time.Millisecond)
	within(t, Prompt, "pending recvs from a closed peer", func() {
		if err := trs[1].Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		for range 2 {
			if err := <-errc; !errors.Is(err, collective.ErrPeerClosed) {
				t.Errorf("pending recv from closed peer: %v, want ErrPeerClosed", err)
			}
		}
	})
	within(t, Prompt, "later recv from a closed peer", func() {
		if _, err := trs[0].Recv(ctx, 1, 6); !errors.Is(err, collective.ErrPeerClosed) {
			t.Errorf("later recv from closed peer: %v, want ErrPeerClosed", err)
		}
	})
	// Others are unaffected.
	send(t, trs[0], 2, 5, "still here")
	recv(t, trs[2], 0, 5, "still here")
}

func testPeerCloseDrains(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	send(t, trs[1], 0, 5, "last words")
	if err := trs[1].Close(); err != nil {
		t.Fatal(err)
	}
	recv(t, trs[0], 1, 5, "last words")
	if _, err := trs[0].Recv(ctxT(t), 1, 5); !errors.Is(err, collective.ErrPeerClosed) {
		t.Errorf("recv after the drained messages: %v, want ErrPeerClosed", err)
	}
}

func testSendToClosedPeer(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	if err := trs[1].Close(); err != nil {
		t.Fatal(err)
	}
	within(t, Prompt, "send to a closed peer", func() {
		if err := trs[0].Send(ctxT(t), 1, 1, []byte("x")); !errors.Is(err, collective.ErrPeerClosed) {
			t.Errorf("send to closed peer: %v, want ErrPeerClosed", err)
		}
	})
}

func testOwnClose(t *testing.T, ng NewGroup) {
	trs := group(t, ng, 2)
	ctx := ctxT(t)
	errc := make(chan error, 1)
	go func() {
		_, err := trs[0].Recv(ctx, 1, 1)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	within(t, Prompt, "pending recv of a closed member", func() {
		if err := trs[0].Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := <-errc; !errors.Is(err, collective.ErrClosed) {
			t.Errorf("pending recv after own close: %v, want ErrClosed", err)
		}
	})
	if err := trs[0].Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := trs[0].Send(ctx, 1, 1, []byte("x")); !errors.Is(err, collective.ErrClosed) {
		t.Errorf("send after close: %v, want ErrClosed", err)
	}
	if _, err := trs[0].Recv(ctx, 1, 1); !errors.Is(err, collective.ErrClosed) {
		t.Errorf("recv after close: %v, want ErrClosed", err)
	}
}

func testConcurrent(t *testing.T, ng NewGroup) {
	const n, tags, per = 4, 16, 20
	trs := group(t, ng, n)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, n*tags*2)
	// Every rank sends per messages under each tag to every peer from one
	// goroutine per tag, and receives them from one goroutine per
	// (peer, tag): payloads identify sender, tag and sequence number.
	for r := range n {
		for tag := range uint64(tags) {
			wg.Go(func() {
				for i := range per {
					for p := range n {
						if p == r {
							continue
						}
						if err := trs[r].Send(ctx, p, tag, fmt.Appendf(nil, "%d:%d:%d", r, tag, i)); err != nil {
							errs <- err
							return
						}
					}
				}
			})
			for p := range n {
				if p == r {
					continue
				}
				wg.Go(func() {
					for i := range per {
						got, err := trs[r].Recv(ctx, p, tag)
						if err != nil {
							errs <- err
							return
						}
						if want := fmt.Appendf(nil, "%d:%d:%d", p, tag, i); !bytes.Equal(got, want) {
							errs <- fmt.Errorf("rank %d from %d tag %d: %q, want %q", r, p, tag, got, want)
							return
						}
					}
				})
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
