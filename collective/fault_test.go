package collective_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
)

func pair(t *testing.T) (*collective.Faulty, collective.Transport) {
	t.Helper()
	trs := collective.NewInprocGroup(2)
	f := &collective.Faulty{Transport: trs[0]}
	t.Cleanup(func() { f.Close(); trs[1].Close() })
	return f, trs[1]
}

func TestFaultyFailNth(t *testing.T) {
	ctx := context.Background()
	errBoom := errors.New("boom")
	for _, sticky := range []bool{false, true} {
		f, peer := pair(t)
		f.FailSend, f.FailRecv, f.Sticky, f.Err = 2, 3, sticky, errBoom
		for i := 1; i <= 4; i++ {
			err := f.Send(ctx, 1, 1, []byte{byte(i)})
			wantFail := i == 2 || (sticky && i > 2)
			if wantFail != (err != nil) || (err != nil && !errors.Is(err, errBoom)) {
				t.Errorf("sticky=%v send #%d: %v, want failure %v", sticky, i, err, wantFail)
			}
			if err == nil {
				if got, err := peer.Recv(ctx, 0, 1); err != nil || got[0] != byte(i) {
					t.Errorf("sticky=%v send #%d arrived as %v, %v", sticky, i, got, err)
				}
			}
		}
		if f.Sends() != 4 {
			t.Errorf("Sends() = %d, want 4", f.Sends())
		}
		for i := 1; i <= 4; i++ {
			if err := peer.Send(ctx, 0, 2, []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		var got []byte
		for i := 1; i <= 4; i++ {
			msg, err := f.Recv(ctx, 1, 2)
			if err != nil {
				if !sticky && i != 3 {
					t.Errorf("recv #%d: %v", i, err)
				}
				continue
			}
			got = append(got, msg[0])
		}
		if !sticky && string(got) != "\x01\x02\x03" {
			// the failed Recv left its message buffered for the next one
			t.Errorf("received %v, want [1 2 3]", got)
		}
		if f.Recvs() != 4 {
			t.Errorf("Recvs() = %d, want 4", f.Recvs())
		}
	}
}

func TestFaultyDelay(t *testing.T) {
	f, peer := pair(t)
	f.Delay = 30 * time.Millisecond
	start := time.Now()
	if err := f.Send(context.Background(), 1, 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < f.Delay {
		t.Errorf("delayed send took %v, want >= %v", el, f.Delay)
	}
	if _, err := peer.Recv(context.Background(), 0, 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if err := f.Send(ctx, 1, 1, []byte("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("delay past the deadline: %v, want DeadlineExceeded", err)
	}
}

func TestFaultyBlockFrom(t *testing.T) {
	f, peer := pair(t)
	f.BlockFrom = 2
	ctx := context.Background()
	if err := f.Send(ctx, 1, 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Recv(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	peer.Send(ctx, 0, 1, []byte("y"))
	for _, call := range []string{"recv", "send"} {
		start := time.Now() // before the deadline is set: el >= 50ms holds
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		var err error
		if call == "recv" {
			_, err = f.Recv(dctx, 1, 1) // a message is there, but the call blocks
		} else {
			err = f.Send(dctx, 1, 1, []byte("z"))
		}
		cancel()
		el := time.Since(start)
		// Not before the deadline; the upper bound only tells "returned
		// once the deadline passed" from "hung", far beyond any
		// scheduling delay.
		if !errors.Is(err, context.DeadlineExceeded) || el < 50*time.Millisecond || el >= promptBound {
			t.Errorf("blocked %s: %v after %v, want DeadlineExceeded after 50ms (and before %v)", call, err, el, promptBound)
		}
	}
	// Close releases a call blocked without deadline.
	errc := make(chan error, 1)
	go func() {
		_, err := f.Recv(ctx, 1, 1)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	f.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, collective.ErrClosed) {
			t.Errorf("blocked recv after Close: %v, want ErrClosed", err)
		}
	case <-time.After(promptBound):
		t.Fatalf("Close did not release a blocked call within %v", promptBound)
	}
}
