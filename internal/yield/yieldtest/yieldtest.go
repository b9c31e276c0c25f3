// Package yieldtest holds what the tests of busy loops' yields share: an
// item of work that burns about 100 us of CPU, and a loopback UDP echo
// timed while such loops run (the goroutines the network wakes are what
// the yields let in).
package yieldtest

import (
	"net"
	"slices"
	"testing"
	"time"
)

// Spin burns about 100 us of CPU for item i and returns a value the
// caller keeps (so the work is not optimised away).
func Spin(i int) uint64 {
	x := uint64(i + 1)
	for deadline := time.Now().Add(100 * time.Microsecond); time.Now().Before(deadline); {
		for range 256 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
	}
	return x
}

// EchoRTTs times a loopback UDP echo between two goroutines for d (one
// echo every 10 ms; a lost echo counts as 2 s) and returns the round
// trips sorted. Everything it starts has ended when it returns.
func EchoRTTs(tb testing.TB, d time.Duration) []time.Duration {
	tb.Helper()
	srv, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		b := make([]byte, 16)
		for {
			n, a, err := srv.ReadFrom(b)
			if err != nil {
				return
			}
			_, _ = srv.WriteTo(b[:n], a)
		}
	}()
	defer func() {
		_ = srv.Close()
		<-echoed
	}()
	cli, err := net.Dial("udp", srv.LocalAddr().String())
	if err != nil {
		tb.Fatal(err)
	}
	defer cli.Close()
	var rtts []time.Duration
	b := make([]byte, 16)
	for end := time.Now().Add(d); time.Now().Before(end); {
		t0 := time.Now()
		_ = cli.SetReadDeadline(t0.Add(2 * time.Second))
		if _, err := cli.Write([]byte{1}); err != nil {
			tb.Fatal(err)
		}
		if _, err := cli.Read(b); err != nil {
			rtts = append(rtts, 2*time.Second) // a lost echo counts as slow
			continue
		}
		rtts = append(rtts, time.Since(t0))
		time.Sleep(10 * time.Millisecond)
	}
	slices.Sort(rtts)
	return rtts
}
