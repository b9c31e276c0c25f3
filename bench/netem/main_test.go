package main

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseLink(t *testing.T) {
	good, err := parseLink("ns0:qt0:10.1.2.3")
	if err != nil || good.ns != "ns0" || good.dev != "qt0" || good.ip != netip.MustParseAddr("10.1.2.3") {
		t.Fatalf("parseLink: %+v, %v", good, err)
	}
	for _, bad := range []string{"", "ns0:qt0", ":qt0:10.1.2.3", "ns0::10.1.2.3", "ns0:qt0:fe80::1", "ns0:qt0:10.1.2",
		"ns0:a-device-name-too-long:10.1.2.3", "a:b:c:d"} {
		if _, err := parseLink(bad); err == nil {
			t.Errorf("parseLink(%q): no error", bad)
		}
	}
}

// ipv4 is a minimal IPv4 header to dst with n bytes of payload.
func ipv4(dst string, n int) []byte {
	p := make([]byte, 20+n)
	p[0] = 0x45
	a := netip.MustParseAddr(dst).As4()
	copy(p[16:20], a[:])
	return p
}

func TestDst(t *testing.T) {
	if a, ok := dst(ipv4("10.9.8.7", 0)); !ok || a != netip.MustParseAddr("10.9.8.7") {
		t.Errorf("dst = %v, %v", a, ok)
	}
	v6 := make([]byte, 40)
	v6[0] = 0x60
	for _, p := range [][]byte{nil, make([]byte, 19), v6} {
		if _, ok := dst(p); ok {
			t.Errorf("dst(%x): ok", p)
		}
	}
}

// clockWriter records each write and when it came.
type clockWriter struct {
	mu   sync.Mutex
	at   []time.Time
	lens []int
}

func (w *clockWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.at = append(w.at, time.Now())
	w.lens = append(w.lens, len(p))
	return len(p), nil
}

// TestForwardDelay: each packet is written to the line of its
// destination no earlier than its arrival plus the delay, in order;
// packets for unknown addresses are counted and dropped, as are those
// past a full queue.
func TestForwardDelay(t *testing.T) {
	const delay = 20 * time.Millisecond
	w := &clockWriter{}
	l := &line{q: make(chan packet, 8), w: w}
	f := &forwarder{delay: delay, byIP: map[netip.Addr]*line{netip.MustParseAddr("10.0.0.2"): l}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.run(ctx) })
	var sent []time.Time
	for i := range 5 {
		now := time.Now()
		sent = append(sent, now)
		f.forward(ipv4("10.0.0.2", i), now)
		time.Sleep(time.Millisecond)
	}
	f.forward(ipv4("10.0.0.9", 0), time.Now())
	f.forward([]byte{1, 2, 3}, time.Now())
	deadline := time.Now().Add(10 * time.Second)
	for l.pkts.Load() < 5 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if got := l.pkts.Load(); got != 5 {
		t.Fatalf("%d packets written, want 5", got)
	}
	for i, at := range w.at {
		if w.lens[i] != 20+i {
			t.Errorf("write %d: %d bytes, want %d (order)", i, w.lens[i], 20+i)
		}
		if d := at.Sub(sent[i]); d < delay {
			t.Errorf("packet %d written %v after its arrival, want >= %v", i, d, delay)
		}
	}
	if got := f.unknown.Load(); got != 2 {
		t.Errorf("unknown destinations %d, want 2", got)
	}
	if len(l.late) != 5 {
		t.Errorf("%d lateness samples, want 5", len(l.late))
	}

	// A full queue drops (the line's writer is not running).
	full := &line{q: make(chan packet, 2), w: w}
	f2 := &forwarder{delay: delay, byIP: map[netip.Addr]*line{netip.MustParseAddr("10.0.0.3"): full}}
	for range 5 {
		f2.forward(ipv4("10.0.0.3", 0), time.Now())
	}
	if got := full.dropped.Load(); got != 3 {
		t.Errorf("dropped %d past a queue of 2, want 3", got)
	}
}

func TestQuantile(t *testing.T) {
	s := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if q := quantile(s, 0.5); q != 5 {
		t.Errorf("p50 = %v, want 5", q)
	}
	if q := quantile(s, 0.99); q != 10 {
		t.Errorf("p99 = %v, want 10", q)
	}
	if q := quantile(nil, 0.5); q != 0 {
		t.Errorf("p50 of nothing = %v", q)
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	// Refused before any namespace is opened (these do not exist).
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--delay", "-1ms", "--link", "nx1:t:10.0.0.1", "--link", "nx2:t:10.0.0.2"}, "--delay"},
		{[]string{"--delay", "1ms", "--link", "nx1:t:10.0.0.1"}, "at least 2"},
		{[]string{"--link", "nx1:t:10.0.0.1", "--link", "nx2:t:10.0.0.1"}, "twice"},
		{[]string{"--link", "nx1:t:10.0.0"}, "IPv4"},
	} {
		var out, errb clockWriter
		err := run(c.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q) = %v, want an error about %q", c.args, err, c.want)
		}
	}
}
