package cluster

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
)

// eventLog is a slog.Handler that keeps the time of every memberlist
// line about failure detection, by kind, for the load measurements:
// "suspect" (a probe failed), "refute" (a member refuted a suspicion of
// itself), "dead" (a suspicion timed out), "failedping" (a direct probe
// timed out).
type eventLog struct {
	mu    *sync.Mutex
	times map[string][]time.Time
	lines *[]string
}

func newEventLog() *eventLog {
	return &eventLog{mu: new(sync.Mutex), times: map[string][]time.Time{}, lines: new([]string)}
}

func (h *eventLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *eventLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *eventLog) WithGroup(string) slog.Handler            { return h }

func (h *eventLog) Handle(_ context.Context, r slog.Record) error {
	kind := ""
	switch msg := r.Message; {
	case strings.HasPrefix(msg, "Suspect "):
		kind = "suspect"
	case strings.HasPrefix(msg, "Refuting a suspect"):
		kind = "refute"
	case strings.HasPrefix(msg, "Marking ") && strings.Contains(msg, "as failed"):
		kind = "dead"
	case strings.HasPrefix(msg, "Failed UDP ping"):
		kind = "failedping"
	default:
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.times[kind] = append(h.times[kind], r.Time)
	*h.lines = append(*h.lines, r.Time.Format("15:04:05.000")+" "+r.Message)
	return nil
}

func (h *eventLog) count(kind string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.times[kind])
}

func (h *eventLog) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.times)
	*h.lines = nil
}

func (h *eventLog) dump() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(*h.lines)
}

// schedLatency samples, until ctx ends, how late a goroutine sleeping
// 2 ms wakes (timer wake-up) and how long a 1-byte UDP echo over
// loopback takes (netpoller wake-up of two goroutines, memberlist's
// path for a probe and its ack); it returns both sets of samples.
func schedLatency(ctx context.Context) (sleepLate, udpRTT []time.Duration) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			t0 := time.Now()
			time.Sleep(2 * time.Millisecond)
			sleepLate = append(sleepLate, time.Since(t0)-2*time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		srv, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return
		}
		defer srv.Close()
		cli, err := net.Dial("udp", srv.LocalAddr().String())
		if err != nil {
			return
		}
		defer cli.Close()
		go func() {
			b := make([]byte, 16)
			for {
				n, a, err := srv.ReadFrom(b)
				if err != nil {
					return
				}
				_, _ = srv.WriteTo(b[:n], a)
			}
		}()
		b := make([]byte, 16)
		for ctx.Err() == nil {
			t0 := time.Now()
			_ = cli.SetReadDeadline(t0.Add(5 * time.Second))
			if _, err := cli.Write([]byte{1}); err != nil {
				return
			}
			if _, err := cli.Read(b); err != nil {
				continue
			}
			udpRTT = append(udpRTT, time.Since(t0))
			time.Sleep(10 * time.Millisecond)
		}
	}()
	wg.Wait()
	return sleepLate, udpRTT
}

// quantiles returns the p50, p99 and max of ds.
func quantiles(ds []time.Duration) (p50, p99, mx time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100], s[len(s)-1]
}
