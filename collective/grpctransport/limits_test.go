package grpctransport

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// Send refuses a message over its own or the peer's limit with
// ErrTooLarge and the stream stays up; a message at the limit passes.
func TestMessageLimit(t *testing.T) {
	limits := []int{1024, 512}
	trs := newGroup(t, 2, func(r int, c *Config) { c.MaxMessageBytes = limits[r] })
	ctx := ctxT(t)
	for _, tc := range []struct {
		from, to, size int
		ok             bool
	}{
		{0, 1, 512, true},
		{0, 1, 513, false}, // over the peer's limit
		{1, 0, 513, false}, // over its own limit
		{1, 0, 512, true},
		{0, 0, 1024, true}, // to itself: its own limit
		{0, 0, 1025, false},
		{0, 1, 1 << 20, false},
	} {
		msg := bytes.Repeat([]byte{byte(tc.size)}, tc.size)
		err := trs[tc.from].Send(ctx, tc.to, 1, msg)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrTooLarge)) {
			t.Errorf("send %d bytes %d->%d: %v, want ok=%v or ErrTooLarge", tc.size, tc.from, tc.to, err, tc.ok)
		}
		if err != nil {
			continue
		}
		got, err := trs[tc.to].Recv(ctx, tc.from, 1)
		if err != nil || !bytes.Equal(got, msg) {
			t.Errorf("recv %d bytes %d->%d: %d bytes, %v", tc.size, tc.from, tc.to, len(got), err)
		}
	}
}

// Messages at the default limit (16 MiB) cross intact.
func TestLargeMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("16 MiB message")
	}
	trs := newGroup(t, 2, nil)
	// The deadline only bounds a hang: what is tested is that the
	// message crosses intact, not how fast. 16 MiB through gRPC under
	// -race on a loaded 2-core machine passed ctxT's 10 s.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	msg := make([]byte, DefaultMaxMessageBytes)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	if err := trs[0].Send(ctx, 1, 1, msg); err != nil {
		t.Fatal(err)
	}
	got, err := trs[1].Recv(ctx, 0, 1)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("recv: %d bytes, %v", len(got), err)
	}
}
