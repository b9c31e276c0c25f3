package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// testHTTP is an HTTP server of startHTTP's kind on a loopback port, its
// registry and its log (JSON records).
type testHTTP struct {
	*httpServer
	reg *prometheus.Registry
	log *lockedBuffer
}

// startTestHTTP serves h (nil: questd's metrics handler on the server's
// own registry) under hc on lis (nil: a new loopback listener) as server
// "test"; the cleanup shuts it down.
func startTestHTTP(t *testing.T, hc httpServerConfig, lis net.Listener, h http.Handler) *testHTTP {
	t.Helper()
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	ts := &testHTTP{reg: prometheus.NewRegistry(), log: &lockedBuffer{}}
	log := slog.New(slog.NewJSONHandler(ts.log, nil))
	if h == nil {
		h = httpHandler(ts.reg, func() bool { return true }, log)
	}
	s, err := serveHTTP("test", "test-addr", lis, h, hc, ts.reg, log)
	if err != nil {
		t.Fatal(err)
	}
	ts.httpServer = s
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.shutdown(ctx)
	})
	return ts
}

// waitFor polls cond every 10 ms for up to d and reports whether it
// became true.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// dialTCP opens a raw connection to addr; the cleanup closes it.
func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedAfter reads c until the server closes it (at most limit) and
// returns how long that took, failing the test when c is still open.
func closedAfter(t *testing.T, c net.Conn, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(limit))
	_, err := io.Copy(io.Discard, c)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("connection not closed by the server within %v: %v", limit, err)
	}
	return took
}

// okHandler answers every request 200 "ok".
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })

// TestHTTPIdleTimeout: the server closes a kept-alive connection once it
// has waited --http-idle-timeout for its next request, a connection that
// says nothing and one that trickles its headers once
// --http-read-header-timeout has passed since its accept; each closed
// connection is counted out.
func TestHTTPIdleTimeout(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		hc := defaultHTTPServerConfig()
		hc.IdleTimeout, hc.ReadHeaderTimeout = 300*time.Millisecond, 5*time.Second // not the header timeout
		s := startTestHTTP(t, hc, nil, okHandler)
		// The idle timeout starts again after every request: two
		// requests 150 ms apart, then the close must come at least the
		// timeout after the second was sent (the server's idle wait
		// starts after it read it), not 300 ms after the accept or the
		// first. A gap between requests that a loaded machine stretched
		// near the timeout (CI under -race: a 150 ms sleep overshot) lets
		// the server close before the next request, rightly: that try
		// proves nothing and a new connection tries again.
		const void = 250 * time.Millisecond
		var br *bufio.Reader
		var sent time.Time
		tried := 0
	try:
		for tried = 1; tried <= 5; tried++ {
			c := dialTCP(t, s.addr)
			br = bufio.NewReader(c)
			var got time.Time
			for i := range 2 {
				if i > 0 {
					time.Sleep(150 * time.Millisecond)
					if gap := time.Since(got); gap >= void {
						t.Logf("try %d: %v between requests, near the idle timeout: trying again", tried, gap)
						c.Close()
						continue try
					}
				}
				sent = time.Now()
				fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: questd\r\n\r\n")
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got = time.Now()
				if resp.StatusCode != http.StatusOK || resp.Close {
					t.Fatalf("request %d: %s, close %v: want 200 kept alive", i, resp.Status, resp.Close)
				}
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			break
		}
		if tried > 5 {
			t.Fatalf("5 tries: each had a gap of %v or more between its requests", void)
		}
		_, err := br.ReadByte()
		idle := time.Since(sent)
		if !errors.Is(err, io.EOF) {
			t.Fatalf("idle connection: %v, want closed by the server", err)
		}
		if idle < 250*time.Millisecond || idle > 3*time.Second {
			t.Errorf("idle connection closed %v after its last request was sent, want about --http-idle-timeout 300ms", idle)
		}
		if !waitFor(2*time.Second, func() bool { return s.lis.open.Load() == 0 }) {
			t.Errorf("open connections %d after the close, want 0", s.lis.open.Load())
		}
	})
	t.Run("silent", func(t *testing.T) {
		hc := defaultHTTPServerConfig()
		hc.ReadHeaderTimeout, hc.IdleTimeout = 300*time.Millisecond, 5*time.Second
		s := startTestHTTP(t, hc, nil, okHandler)
		if took := closedAfter(t, dialTCP(t, s.addr), 5*time.Second); took < 250*time.Millisecond || took > 3*time.Second {
			t.Errorf("silent connection closed after %v, want about --http-read-header-timeout 300ms", took)
		}
		// Headers trickled a byte every 50 ms never end: the deadline
		// runs from the accept, not from the last byte.
		c := dialTCP(t, s.addr)
		start := time.Now()
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: questd\r\n")
		for i := 0; i < 100; i++ {
			time.Sleep(50 * time.Millisecond)
			if _, err := io.WriteString(c, "X: y\r\n"); err != nil {
				break
			}
		}
		closedAfter(t, c, 5*time.Second)
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("trickling connection closed after %v, want about 300ms", took)
		}
		if !waitFor(2*time.Second, func() bool { return s.lis.open.Load() == 0 }) {
			t.Errorf("open connections %d after the closes, want 0", s.lis.open.Load())
		}
	})
}

// TestHTTPMaxConns: with --http-max-conns N, 3N connections that say
// nothing never make the server hold more than N (the others wait in
// the listen backlog), and a valid /metrics request made behind them is
// answered once the read-header timeout has closed the ones ahead of it;
// nothing failed to accept.
func TestHTTPMaxConns(t *testing.T) {
	const n = 4
	hc := defaultHTTPServerConfig()
	hc.MaxConns, hc.ReadHeaderTimeout = n, 400*time.Millisecond
	s := startTestHTTP(t, hc.forMetrics(), nil, nil)
	for range 3 * n {
		dialTCP(t, s.addr)
	}
	if !waitFor(3*time.Second, func() bool { return s.lis.peak.Load() == n }) {
		t.Fatalf("the server holds %d connections at most, want the cap %d reached", s.lis.peak.Load(), n)
	}
	start := time.Now()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	resp, err := c.Get("http://" + s.addr + "/metrics")
	if err != nil {
		t.Fatalf("/metrics behind %d silent connections: %v", 3*n, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	// It waited behind the cap: at least one read-header timeout.
	if took < hc.ReadHeaderTimeout*3/4 {
		t.Errorf("/metrics answered after %v: the cap did not hold it back (read-header timeout %v)", took, hc.ReadHeaderTimeout)
	}
	t.Logf("/metrics answered after %v behind %d silent connections", took, 3*n)
	if p := s.lis.peak.Load(); p != n {
		t.Errorf("the server held %d connections at once, want at most the cap %d", p, n)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	if v := metric(t, mf, "questrt_http_connections", "server", "test").GetGauge().GetValue(); v < 1 || v > n {
		t.Errorf("questrt_http_connections = %v during the scrape, want 1..%d", v, n)
	}
	if v := metric(t, mf, "questrt_http_accept_errors_total", "server", "test").GetCounter().GetValue(); v != 0 {
		t.Errorf("questrt_http_accept_errors_total = %v, want 0", v)
	}
	if !waitFor(5*time.Second, func() bool { return s.lis.open.Load() == 0 }) {
		t.Errorf("open connections %d once every silent one timed out, want 0", s.lis.open.Load())
	}
}

// TestHTTPWriteStall: a response whose client stops reading fails once a
// write has made no progress for WriteStall, and the handler ends; a
// stream read steadily for many times WriteStall is not cut; a write
// deadline of one request does not fail the next one on the same
// connection.
func TestHTTPWriteStall(t *testing.T) {
	const stall = 300 * time.Millisecond
	chunk := make([]byte, 64<<10)
	type result struct {
		written int
		err     error
	}
	results := make(chan result, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		limit := 256 << 20 // a client that never reads stops us well before
		if r.URL.Path == "/small" {
			io.WriteString(w, "ok\n")
			return
		}
		if r.URL.Path == "/2mib" {
			limit = 2 << 20
		}
		var res result
		for res.written < limit {
			var n int
			n, res.err = w.Write(chunk)
			res.written += n
			if res.err == nil {
				res.err = rc.Flush()
			}
			if res.err != nil {
				break
			}
		}
		results <- res
	})
	hc := defaultHTTPServerConfig()
	hc.WriteStall = stall
	s := startTestHTTP(t, hc, nil, h)

	t.Run("reader stops", func(t *testing.T) {
		c := dialTCP(t, s.addr)
		c.(*net.TCPConn).SetReadBuffer(4 << 10)
		fmt.Fprintf(c, "GET /forever HTTP/1.1\r\nHost: questd\r\n\r\n")
		select {
		case res := <-results:
			if res.err == nil || !errors.Is(res.err, os.ErrDeadlineExceeded) {
				t.Errorf("stalled response: %d bytes written, err %v; want a write deadline error", res.written, res.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the write to a client that stopped reading did not fail")
		}
		// The server closed its end (the kernel may still hold the
		// unsent bytes of an orphaned socket: not the node's descriptor).
		if !waitFor(5*time.Second, func() bool { return s.lis.open.Load() == 0 }) {
			t.Errorf("open connections %d after the stalled write failed, want 0", s.lis.open.Load())
		}
	})
	t.Run("steady reader", func(t *testing.T) {
		c := dialTCP(t, s.addr)
		fmt.Fprintf(c, "GET /2mib HTTP/1.1\r\nHost: questd\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		got := 0
		buf := make([]byte, 32<<10)
		for i := 0; i < 10000; i++ { // 32 KiB every 20 ms: about 1.3 s, many stalls long
			n, err := resp.Body.Read(buf)
			got += n
			if err != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		resp.Body.Close()
		res := <-results
		if res.err != nil || got != 2<<20 {
			t.Errorf("steadily read stream: read %d of %d bytes in %v, handler err %v", got, 2<<20, time.Since(start), res.err)
		}
		if time.Since(start) < 2*stall {
			t.Errorf("the stream took %v: not long enough to show it outlives the %v stall bound", time.Since(start), stall)
		}
	})
	t.Run("keep-alive", func(t *testing.T) {
		c := dialTCP(t, s.addr)
		br := bufio.NewReader(c)
		for i := range 2 {
			fmt.Fprintf(c, "GET /small HTTP/1.1\r\nHost: questd\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(b) != "ok\n" {
				t.Fatalf("request %d: %s %q", i, resp.Status, b)
			}
			time.Sleep(2 * stall) // past the first request's write deadline
		}
	})
}

// emfileListener fails its first fails accepts with EMFILE (the
// open-file limit), then accepts.
type emfileListener struct {
	net.Listener
	fails atomic.Int64
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestHTTPAcceptRetry: accepts that fail at the open-file limit are
// retried by the listener with a backoff, counted, and logged once per
// acceptLogEvery, never by net/http (which logged every retry); the
// server then serves; a shutdown during the retries ends them.
func TestHTTPAcceptRetry(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	el := &emfileListener{Listener: tl}
	const fails = 8 // 5 ms doubling: about 1.3 s of retries
	el.fails.Store(fails)
	s := startTestHTTP(t, defaultHTTPServerConfig(), el, nil)
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	resp, err := c.Get("http://" + s.addr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz after %d failed accepts: %v", fails, err)
	}
	resp.Body.Close()
	if got := s.lis.failed.Load(); got != fails {
		t.Errorf("failed accepts counted %d, want %d", got, fails)
	}
	var ours, nethttp int
	for _, line := range strings.Split(strings.TrimSpace(s.log.String()), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		msg, _ := rec["msg"].(string)
		switch {
		case strings.HasPrefix(msg, "http accept failed"):
			ours++
			if rec["flag"] != "test-addr" || !strings.Contains(fmt.Sprint(rec["err"]), "too many open files") {
				t.Errorf("log record %v: want the flag and the error", rec)
			}
		case strings.Contains(msg, "Accept error"):
			nethttp++
		}
	}
	if ours != 1 || nethttp != 0 {
		t.Errorf("log: %d lines of ours and %d of net/http about %d failed accepts in %v, want 1 and 0:\n%s", ours, nethttp, fails, acceptLogEvery, s.log.String())
	}

	// A listener that keeps failing: the shutdown ends its retries.
	tl2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	el2 := &emfileListener{Listener: tl2}
	el2.fails.Store(1 << 40)
	s2 := startTestHTTP(t, defaultHTTPServerConfig(), el2, nil)
	if !waitFor(5*time.Second, func() bool { return s2.lis.failed.Load() >= 5 }) {
		t.Fatal("no retries")
	}
	start := time.Now()
	s2.shutdown(t.Context())
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("shutdown during the retries took %v", took)
	}
}

// TestOpenFilesWarning: questd warns when the HTTP servers' caps could
// take more than half the open-file limit.
func TestOpenFilesWarning(t *testing.T) {
	for _, c := range []struct {
		nofile            uint64
		servers, maxConns int
		warn              bool
	}{
		{1024, 2, 256, false},
		{1023, 2, 256, true},
		{1 << 20, 2, 256, false},
		{256, 1, 256, true},
		{256, 0, 256, false},
		{96, 2, 32, true},
		{128, 2, 32, false},
	} {
		msg := openFilesWarning(c.nofile, c.servers, c.maxConns)
		if (msg != "") != c.warn {
			t.Errorf("limit %d, %d servers x %d: warning %q, want one: %v", c.nofile, c.servers, c.maxConns, msg, c.warn)
		}
		if c.warn && !strings.Contains(msg, "--http-max-conns") {
			t.Errorf("warning %q does not name --http-max-conns", msg)
		}
	}
}

// TestHTTPFlags: the --http-* flags reach both servers' configs (the
// metrics server's with its own read and write timeouts), from the
// command line, the environment and the file, and bad values are refused
// naming the flag.
func TestHTTPFlags(t *testing.T) {
	c, err := load(t, map[string]string{"QUESTRT_HTTP_IDLE_TIMEOUT": "90s"}, "--plaintext", "--http-max-conns", "32",
		"--config", writeFile(t, "h.yaml", "http-read-header-timeout: 2s\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := httpServerConfig{MaxConns: 32, ReadHeaderTimeout: 2 * time.Second, IdleTimeout: 90 * time.Second,
		ReadTimeout: time.Minute, WriteStall: time.Minute, MaxHeaderBytes: 64 << 10}
	if got := c.httpServer(); got != want {
		t.Errorf("completions server config %+v, want %+v", got, want)
	}
	want.ReadTimeout, want.WriteTimeout, want.WriteStall = 10*time.Second, 30*time.Second, 0
	if got := c.httpServer().forMetrics(); got != want {
		t.Errorf("metrics server config %+v, want %+v", got, want)
	}
	for _, hc := range []httpServerConfig{defaultHTTPServerConfig(), defaultHTTPServerConfig().forMetrics()} {
		if err := hc.Validate(); err != nil {
			t.Errorf("%+v: %v", hc, err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-max-conns", "0"}, `--http-max-conns "0": want 1..1048576`},
		{[]string{"--http-max-conns", "-5"}, `--http-max-conns "-5": want 1..1048576`},
		{[]string{"--http-max-conns", "2000000"}, `--http-max-conns "2000000": want 1..1048576`},
		{[]string{"--http-max-conns", "many"}, `--http-max-conns "many": not an integer`},
		{[]string{"--http-idle-timeout", "0s"}, `--http-idle-timeout "0s": must be positive`},
		{[]string{"--http-idle-timeout", "-1s"}, `--http-idle-timeout "-1s": must be positive`},
		{[]string{"--http-idle-timeout", "1"}, `--http-idle-timeout "1": not a duration`},
		{[]string{"--http-read-header-timeout", "0s"}, `--http-read-header-timeout "0s": must be positive`},
	} {
		_, err := load(t, nil, append([]string{"--plaintext"}, tc.args...)...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.args, err, tc.want)
		}
	}
	_, err = load(t, map[string]string{"QUESTRT_HTTP_MAX_CONNS": "0"}, "--plaintext")
	if err == nil || !strings.HasSuffix(err.Error(), "(set by QUESTRT_HTTP_MAX_CONNS)") {
		t.Errorf("bad QUESTRT_HTTP_MAX_CONNS: %v", err)
	}
	for _, hc := range []httpServerConfig{
		{MaxConns: 1, ReadHeaderTimeout: 1, IdleTimeout: 1, WriteTimeout: 1, WriteStall: 1, MaxHeaderBytes: 1},
		{MaxConns: 1, ReadHeaderTimeout: 1, IdleTimeout: 1, ReadTimeout: -1, MaxHeaderBytes: 1},
		{MaxConns: 1, ReadHeaderTimeout: 1, IdleTimeout: 1},
	} {
		if err := hc.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", hc)
		}
	}
}

// fetch GETs (or, with a body, POSTs JSON to) url with no keep-alive
// and a timeout of d; it returns the status, the body and how long the
// answer took.
func fetch(url, body string, d time.Duration) (int, string, time.Duration, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: d}
	start := time.Now()
	var resp *http.Response
	var err error
	if body == "" {
		resp, err = c.Get(url)
	} else {
		resp, err = c.Post(url, "application/json", strings.NewReader(body))
	}
	if err != nil {
		return 0, "", time.Since(start), fmt.Errorf("%s: %w (after %v)", url, err, time.Since(start))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", time.Since(start), fmt.Errorf("%s: %w", url, err)
	}
	return resp.StatusCode, string(b), time.Since(start), nil
}

// fetched is fetch's answer.
type fetched struct {
	code int
	body string
	took time.Duration
	err  error
}

// fetchAsync runs fetch in the background.
func fetchAsync(url, body string, d time.Duration) <-chan fetched {
	ch := make(chan fetched, 1)
	go func() {
		var f fetched
		f.code, f.body, f.took, f.err = fetch(url, body, d)
		ch <- f
	}()
	return ch
}

// flood opens n connections to addr that say nothing and returns a
// function that closes them (also called by the cleanup).
func flood(t *testing.T, addr string, n int) (closeAll func()) {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	closeAll = func() {
		for _, c := range conns {
			c.Close()
		}
		conns = nil
	}
	t.Cleanup(closeAll)
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("flood connection %d of %d to %s: %v", i+1, n, addr, err)
		}
		conns = append(conns, c)
	}
	return closeAll
}

// logLines sorts the JSON log records of p: how many there are, how many
// are our failed-accept lines, net/http's accept errors, and the
// open-file warnings at start.
func logLines(p *questdProc) (total, ours, nethttp, warned int) {
	for _, line := range strings.Split(strings.TrimSpace(p.stderr.String()), "\n") {
		total++
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		msg, _ := rec["msg"].(string)
		switch {
		case strings.HasPrefix(msg, "http accept failed"):
			ours++
		case strings.Contains(msg, "Accept error"):
			nethttp++
		case strings.Contains(msg, "more than half the open-file limit"):
			warned++
		}
	}
	return total, ours, nethttp, warned
}

// TestQuestdOpenFileLimit runs questd as a process under an open-file
// limit of 128 (RLIMIT_NOFILE, soft and hard) and floods its HTTP
// servers with 160 connections each that say nothing, more than the
// whole limit. Capped (--http-max-conns 32, the servers' caps within
// half the limit), the servers never fail an accept: a valid /metrics
// request (and, with the test checkpoint, a completion) made behind the
// flood is answered within 30 s, nothing is logged about accepts and
// the log stays short. Uncapped (the control: a cap above the limit),
// questd warns at start, the flood does exhaust the limit (accepts
// fail and are counted), yet they are logged at most once per 10 s, not
// by net/http, /healthz is still answered behind the flood, /metrics
// once it is gone, and questd stops cleanly.
func TestQuestdOpenFileLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts questd processes and waits out their timeouts")
	}
	const nofile, capped, perServer = 128, 32, 160
	env := []string{nofileEnv + "=" + strconv.Itoa(nofile)}
	args := func(maxConns int, extra ...string) []string {
		a := append([]string(nil), smallNode...)
		a = append(a, "--name", "nofile", "--log-format", "json", "--http-max-conns", strconv.Itoa(maxConns),
			"--http-read-header-timeout", "1s", "--http-idle-timeout", "1s")
		return append(a, extra...)
	}
	// checkLog: the log stays short and says nothing about accepts.
	checkQuiet := func(t *testing.T, p *questdProc) {
		t.Helper()
		total, ours, nethttp, warned := logLines(p)
		if ours != 0 || nethttp != 0 || warned != 0 || total > 60 {
			t.Errorf("log: %d lines, %d failed-accept lines, %d of net/http, %d open-file warnings; want a short log with none:\n%s",
				total, ours, nethttp, warned, p.stderr.String())
		}
	}
	stop := func(t *testing.T, p *questdProc) {
		t.Helper()
		p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Errorf("questd exited %d after SIGTERM, want 0", code)
		}
	}

	t.Run("metrics capped", func(t *testing.T) {
		p := startQuestdEnv(t, env, args(capped)...)
		addr := p.ready["metrics"]
		flood(t, addr, perServer)
		code, body, took, err := fetch("http://"+addr+"/metrics", "", 30*time.Second)
		if err != nil || code != http.StatusOK || !strings.Contains(body, `questrt_http_accept_errors_total{server="metrics"} 0`) {
			t.Fatalf("/metrics behind the flood: %d, %v after %v\n%s", code, err, took, body)
		}
		t.Logf("/metrics answered in %v behind %d silent connections", took, perServer)
		mf := scrape(t, addr)
		if v := metric(t, mf, "questrt_http_connections", "server", "metrics").GetGauge().GetValue(); v > capped {
			t.Errorf("questrt_http_connections{server=metrics} = %v, above --http-max-conns %d", v, capped)
		}
		stop(t, p)
		checkQuiet(t, p)
	})

	t.Run("completions capped", func(t *testing.T) {
		p := startQuestdEnv(t, env, args(capped, "--model", passkeyModel(t), "--http-addr", "127.0.0.1:0")...)
		flood(t, p.ready["metrics"], perServer)
		flood(t, p.ready["http"], perServer)
		req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": "The pass key is 48213. The pass key is ", "max_tokens": 3, "temperature": 0})
		// Both at once, each behind its server's flood.
		cch := fetchAsync("http://"+p.ready["http"]+"/v1/completions", string(req), 30*time.Second)
		mch := fetchAsync("http://"+p.ready["metrics"]+"/metrics", "", 30*time.Second)
		c, m := <-cch, <-mch
		if c.err != nil || c.code != http.StatusOK || !strings.Contains(c.body, `"choices"`) {
			t.Fatalf("completion behind the flood: %d, %v after %v\n%s", c.code, c.err, c.took, c.body)
		}
		if m.err != nil || m.code != http.StatusOK {
			t.Fatalf("/metrics behind the flood: %d, %v after %v\n%s", m.code, m.err, m.took, m.body)
		}
		t.Logf("completion answered in %v and /metrics in %v, each behind %d silent connections", c.took, m.took, perServer)
		body := m.body
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mf, err := parser.TextToMetricFamilies(strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for _, srv := range []string{"metrics", "completions"} {
			if v := metric(t, mf, "questrt_http_accept_errors_total", "server", srv).GetCounter().GetValue(); v != 0 {
				t.Errorf("questrt_http_accept_errors_total{server=%s} = %v, want 0", srv, v)
			}
			if v := metric(t, mf, "questrt_http_connections", "server", srv).GetGauge().GetValue(); v > capped {
				t.Errorf("questrt_http_connections{server=%s} = %v, above --http-max-conns %d", srv, v, capped)
			}
		}
		stop(t, p)
		checkQuiet(t, p)
	})

	t.Run("metrics uncapped", func(t *testing.T) {
		p := startQuestdEnv(t, env, args(maxHTTPConns)...)
		addr := p.ready["metrics"]
		start := time.Now()
		closers := []func(){flood(t, addr, perServer)}
		hch := fetchAsync("http://"+addr+"/healthz", "", 30*time.Second)
		// Keep the limit reached for longer than acceptLogEvery: 40 more
		// silent connections every 250 ms while the server closes
		// about 100 a second.
		for time.Since(start) < acceptLogEvery+3*time.Second {
			time.Sleep(250 * time.Millisecond)
			closers = append(closers, flood(t, addr, 40))
		}
		h := <-hch
		if h.err != nil || h.code != http.StatusOK {
			t.Fatalf("/healthz behind the flood: %d, %v after %v", h.code, h.err, h.took)
		}
		t.Logf("/healthz answered in %v behind %d silent connections, without a cap", h.took, perServer)
		for _, c := range closers {
			c()
		}
		var failed float64
		if !waitFor(20*time.Second, func() bool {
			code, body, _, err := fetch("http://"+addr+"/metrics", "", 10*time.Second)
			if err != nil || code != http.StatusOK {
				return false
			}
			parser := expfmt.NewTextParser(model.UTF8Validation)
			mf, err := parser.TextToMetricFamilies(strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			failed = metric(t, mf, "questrt_http_accept_errors_total", "server", "metrics").GetCounter().GetValue()
			return true
		}) {
			t.Fatal("/metrics did not answer after the flood")
		}
		elapsed := time.Since(start)
		if failed == 0 {
			t.Fatalf("no accept failed without a cap: the flood did not reach the open-file limit %d, the test proves nothing", nofile)
		}
		stop(t, p)
		total, ours, nethttp, warned := logLines(p)
		if most := 1 + int(elapsed/acceptLogEvery) + 1; ours < 2 || ours > most || nethttp != 0 || warned != 1 || total > 60 {
			t.Errorf("log after %v failed accepts in %v: %d lines, %d failed-accept lines (want 2..%d), %d of net/http (want 0), %d open-file warnings (want 1):\n%s",
				failed, elapsed, total, ours, most, nethttp, warned, p.stderr.String())
		}
		t.Logf("%v failed accepts in %v, %d log lines about them", failed, elapsed, ours)
	})
}
