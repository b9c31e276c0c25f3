package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"
)

// httpServerConfig bounds the connections of one of questd's HTTP
// servers (the completions API of --http-addr, the metrics server of
// --metrics-addr), so that clients that connect and say nothing, keep
// idle connections or stop reading cannot hold the node's file
// descriptors: at the open-file limit every accept fails, and valid
// requests, /metrics and the node's own files with them. Start from
// defaultHTTPServerConfig; Config.httpServer applies the flags.
//
// Why no write timeout on the completions API: net/http's WriteTimeout
// bounds a whole response from the end of its request's headers, and a
// completion may stream tokens for minutes (completion.Config.RequestTimeout
// bounds it from arrival, 5 min). It gets WriteStall instead, which
// bounds each write, not the response; idle connections are closed by
// IdleTimeout and ReadHeaderTimeout, and MaxConns caps what is left.
type httpServerConfig struct {
	// MaxConns caps the connections the server holds open at once
	// (golang.org/x/net/netutil.LimitListener): at the cap it accepts
	// nothing more, and new clients wait in the kernel's listen backlog,
	// holding no file descriptor of the node, until a connection closes
	// [--http-max-conns]. Default 256, per server.
	MaxConns int
	// ReadHeaderTimeout is how long a connection has to send its
	// request's headers: from its accept for the first request, from the
	// next request's first byte on a kept-alive connection. A connection
	// that says nothing is closed then, freeing its place under MaxConns
	// [--http-read-header-timeout]. Default 5s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that has waited this
	// long for its next request [--http-idle-timeout]. Default 60s:
	// longer than the OpenAI clients keep one (httpx and Node's undici:
	// a few seconds), so that the server seldom closes a connection a
	// client is about to reuse (a race its next request loses), short
	// enough that idle pools give their places back.
	IdleTimeout time.Duration
	// ReadTimeout bounds reading a request, headers and body, from its
	// start; 0: no bound. Safe with streaming: net/http clears the read
	// deadline once the body is read (the handler's background read), so
	// it never cancels a response in progress; POST /v1/completions sets
	// its own body deadline (completion.Config.RequestTimeout) and clears it.
	// Default 1 min; the metrics server's 10s (its requests have no
	// body).
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response, from the end of its
	// request's headers; 0: no bound. Default 0 (see the type's doc);
	// the metrics server's 30s, its responses being short.
	WriteTimeout time.Duration
	// WriteStall bounds each write and flush of a response: one that
	// makes no progress for this long fails and the connection closes,
	// so that a client that stops reading a stream gives its connection
	// and its request back, while a long stream that is read goes on. 0:
	// no bound. Default 1 min; the metrics server's 0 (WriteTimeout
	// bounds its responses whole).
	WriteStall time.Duration
	// MaxHeaderBytes bounds a request's header bytes (net/http adds 4
	// KiB of slack); larger requests get 431. Default 64 KiB: a bearer
	// token and the usual headers take well under 4 KiB.
	MaxHeaderBytes int
	// TLS, when set, serves HTTPS with it (the completions API's
	// --http-tls-cert and --http-tls-key). Default nil: plaintext.
	TLS *tls.Config
}

// Defaults of defaultHTTPServerConfig (the completions API's; the
// metrics server's differ in forMetrics).
const (
	defaultHTTPMaxConns          = 256
	defaultHTTPReadHeaderTimeout = 5 * time.Second
	defaultHTTPIdleTimeout       = 60 * time.Second
	defaultHTTPReadTimeout       = time.Minute
	defaultHTTPWriteStall        = time.Minute
	defaultHTTPMaxHeaderBytes    = 64 << 10

	metricsReadTimeout  = 10 * time.Second
	metricsWriteTimeout = 30 * time.Second
)

// maxHTTPConns is the largest MaxConns: far above any open-file limit
// one would set for a node.
const maxHTTPConns = 1 << 20

// defaultHTTPServerConfig returns the completions API's defaults.
func defaultHTTPServerConfig() httpServerConfig {
	return httpServerConfig{
		MaxConns:          defaultHTTPMaxConns,
		ReadHeaderTimeout: defaultHTTPReadHeaderTimeout,
		IdleTimeout:       defaultHTTPIdleTimeout,
		ReadTimeout:       defaultHTTPReadTimeout,
		WriteStall:        defaultHTTPWriteStall,
		MaxHeaderBytes:    defaultHTTPMaxHeaderBytes,
	}
}

// forMetrics returns h for the metrics server: short GET requests and
// answers, bounded whole by ReadTimeout and WriteTimeout.
func (h httpServerConfig) forMetrics() httpServerConfig {
	h.ReadTimeout, h.WriteTimeout, h.WriteStall = metricsReadTimeout, metricsWriteTimeout, 0
	return h
}

// Validate reports the first invalid field of h.
func (h httpServerConfig) Validate() error {
	switch {
	case h.MaxConns < 1 || h.MaxConns > maxHTTPConns:
		return fmt.Errorf("http server: MaxConns %d: want 1..%d", h.MaxConns, maxHTTPConns)
	case h.ReadHeaderTimeout <= 0:
		return fmt.Errorf("http server: ReadHeaderTimeout %v: want more than 0", h.ReadHeaderTimeout)
	case h.IdleTimeout <= 0:
		return fmt.Errorf("http server: IdleTimeout %v: want more than 0", h.IdleTimeout)
	case h.ReadTimeout < 0 || h.WriteTimeout < 0 || h.WriteStall < 0:
		return fmt.Errorf("http server: ReadTimeout %v, WriteTimeout %v, WriteStall %v: want 0 (none) or more", h.ReadTimeout, h.WriteTimeout, h.WriteStall)
	case h.WriteTimeout > 0 && h.WriteStall > 0:
		return errors.New("http server: WriteTimeout and WriteStall both set: WriteStall's deadlines would replace WriteTimeout's")
	case h.MaxHeaderBytes < 1:
		return fmt.Errorf("http server: MaxHeaderBytes %d: want at least 1", h.MaxHeaderBytes)
	}
	return nil
}

// httpServer is one of questd's HTTP servers: the completions API or
// the metrics server.
type httpServer struct {
	srv  *http.Server
	lis  *connListener // under the MaxConns cap
	wg   sync.WaitGroup
	addr string
}

// startMetricsServer serves h on lis, the listener of --metrics-addr,
// until shutdown; it takes lis over (closed when it fails).
func startMetricsServer(lis net.Listener, h http.Handler, hc httpServerConfig, reg prometheus.Registerer, log *slog.Logger) (*httpServer, error) {
	return serveHTTP("metrics", "metrics-addr", lis, h, hc.forMetrics(), reg, log)
}

// startHTTP listens on addr (the value of --flag) and serves h under hc
// until shutdown. Its connection metrics go to reg, labelled
// server=name.
func startHTTP(name, flag, addr string, h http.Handler, hc httpServerConfig, reg prometheus.Registerer, log *slog.Logger) (*httpServer, error) {
	tl, err := listenTCP(flag, addr)
	if err != nil {
		return nil, err
	}
	return serveHTTP(name, flag, tl, h, hc, reg, log)
}

// serveHTTP is startHTTP on tl, a listener it takes over (closed when
// it fails).
func serveHTTP(name, flag string, tl net.Listener, h http.Handler, hc httpServerConfig, reg prometheus.Registerer, log *slog.Logger) (*httpServer, error) {
	if err := hc.Validate(); err != nil {
		tl.Close()
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	cl := &connListener{Listener: tl, flag: flag, max: hc.MaxConns, log: log, done: make(chan struct{})}
	if err := cl.register(name, reg); err != nil {
		tl.Close()
		return nil, err
	}
	if hc.WriteStall > 0 {
		h = stallBound(h, hc.WriteStall)
	}
	s := &httpServer{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: hc.ReadHeaderTimeout,
			ReadTimeout:       hc.ReadTimeout,
			WriteTimeout:      hc.WriteTimeout,
			IdleTimeout:       hc.IdleTimeout,
			MaxHeaderBytes:    hc.MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		lis: cl, addr: tl.Addr().String(),
	}
	lis := netutil.LimitListener(cl, hc.MaxConns)
	s.srv.TLSConfig = hc.TLS
	s.wg.Go(func() {
		serve := s.srv.Serve
		if hc.TLS != nil {
			serve = func(l net.Listener) error { return s.srv.ServeTLS(l, "", "") }
		}
		if err := serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "flag", flag, "err", err)
		}
	})
	return s, nil
}

// shutdown stops the server, letting the requests in progress end
// within ctx, and waits for it.
func (s *httpServer) shutdown(ctx context.Context) {
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	s.wg.Wait()
}

// Accept retries of connListener, as net/http's own: 5 ms doubling to
// 1 s.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// acceptLogEvery is the shortest time between two log lines of a
// connListener about the same condition (failed accepts, the cap
// reached).
const acceptLogEvery = 10 * time.Second

// connListener is the listener under an HTTP server's MaxConns cap (the
// LimitListener wraps it, so that it never holds more than the cap): it
// counts the connections open, and retries the accepts that fail for
// want of file descriptors or memory itself, with net/http's backoff,
// logging them at most once per acceptLogEvery with their count instead
// of handing them to http.Server, which logs every retry: at the
// open-file limit that filled the log.
type connListener struct {
	net.Listener
	flag string // of the address, for the logs
	max  int    // the cap, for the logs
	log  *slog.Logger

	open     atomic.Int64  // connections accepted and not closed
	peak     atomic.Int64  // the most open at once
	failed   atomic.Uint64 // accepts retried
	done     chan struct{} // closed by Close
	doneOnce sync.Once

	mu         sync.Mutex
	lastFailed time.Time // of the last line about failed accepts
	unlogged   uint64    // failed accepts since that line
	lastFull   time.Time // of the last line about the cap
}

// register exports the listener's counts on reg.
func (l *connListener) register(name string, reg prometheus.Registerer) error {
	labels := prometheus.Labels{"server": name}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "questrt_http_connections",
			Help:        "Connections open on questd's HTTP servers, by server: completions (--http-addr) and metrics (--metrics-addr); at most --http-max-conns each, further clients wait in the listen backlog.",
			ConstLabels: labels,
		}, func() float64 { return float64(l.open.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "questrt_http_accept_errors_total",
			Help:        "Accepts of questd's HTTP servers that failed for want of file descriptors or memory (the open-file limit reached) and were retried, by server.",
			ConstLabels: labels,
		}, func() float64 { return float64(l.failed.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("http metrics: %w", err)
		}
	}
	return nil
}

// Accept returns the next connection; a failure for want of resources
// is retried until one comes or Close.
func (l *connListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			n := l.open.Add(1)
			for p := l.peak.Load(); n > p && !l.peak.CompareAndSwap(p, n); p = l.peak.Load() {
			}
			if n >= int64(l.max) {
				l.logFull()
			}
			return &countedConn{Conn: c, l: l}, nil
		}
		if !outOfResources(err) {
			return nil, err
		}
		l.failed.Add(1)
		l.logFailed(err)
		delay = min(max(2*delay, acceptRetryMin), acceptRetryMax)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// Close closes the listener and ends a retry in progress.
func (l *connListener) Close() error {
	l.doneOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// outOfResources reports whether an accept failed for want of file
// descriptors (the process's or the system's) or kernel memory.
func outOfResources(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// logFailed logs a failed accept: the first at once, then at most one
// line per acceptLogEvery, with the failures since the last line.
func (l *connListener) logFailed(err error) {
	l.mu.Lock()
	l.unlogged++
	now := time.Now()
	if !l.lastFailed.IsZero() && now.Sub(l.lastFailed) < acceptLogEvery {
		l.mu.Unlock()
		return
	}
	n := l.unlogged
	l.lastFailed, l.unlogged = now, 0
	l.mu.Unlock()
	l.log.Warn("http accept failed: out of file descriptors or memory (the open-file limit, ulimit -n?); retrying, logged at most every "+acceptLogEvery.String(),
		"flag", l.flag, "err", err, "failed", n, "open", l.open.Load(), "max_conns", l.max)
}

// logFull logs, at most once per acceptLogEvery, that the cap is
// reached.
func (l *connListener) logFull() {
	l.mu.Lock()
	now := time.Now()
	if !l.lastFull.IsZero() && now.Sub(l.lastFull) < acceptLogEvery {
		l.mu.Unlock()
		return
	}
	l.lastFull = now
	l.mu.Unlock()
	l.log.Info("http connections at --http-max-conns: new clients wait for one to close (idle ones close after --http-idle-timeout, silent ones after --http-read-header-timeout)",
		"flag", l.flag, "max_conns", l.max)
}

// countedConn is a connection of a connListener: its Close counts it
// out, once.
type countedConn struct {
	net.Conn
	l    *connListener
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

// stallBound wraps h so that every write and flush of a response must
// make progress within d (httpServerConfig.WriteStall): each sets the
// connection's write deadline d ahead first, and so does the end of
// the handler for net/http's last flush. A long stream that is read
// never meets a deadline; a client that stops reading fails the
// write, and the handler (serve's stream: "the client is gone") ends.
func stallBound(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
		h.ServeHTTP(sw, r)
		sw.arm()
	})
}

// stallWriter is a ResponseWriter whose writes and flushes each get d.
// It unwraps for http.ResponseController (read deadlines, hijacking).
type stallWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

// arm sets the write deadline d from now (a writer without deadlines,
// in tests, has none).
func (w *stallWriter) arm() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) }

func (w *stallWriter) Write(p []byte) (int, error) {
	w.arm()
	return w.ResponseWriter.Write(p)
}

// FlushError flushes (what http.ResponseController.Flush calls).
func (w *stallWriter) FlushError() error {
	w.arm()
	return w.rc.Flush()
}

// Flush implements http.Flusher.
func (w *stallWriter) Flush() { _ = w.FlushError() }

// Unwrap returns the wrapped ResponseWriter (http.ResponseController).
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// openFilesWarning says, when the HTTP servers could hold more than
// half of the open-file limit nofile with their caps (servers x
// maxConns), what that risks; "" when they fit.
func openFilesWarning(nofile uint64, servers, maxConns int) string {
	held := uint64(servers) * uint64(maxConns)
	if servers == 0 || held <= nofile/2 {
		return ""
	}
	return fmt.Sprintf("the HTTP servers may hold %d connections (%d x --http-max-conns %d), more than half the open-file limit %d: at the limit gRPC, gossip and data files fail to open; lower --http-max-conns or raise the limit (ulimit -n, LimitNOFILE=)",
		held, servers, maxConns, nofile)
}

// warnOpenFiles logs openFilesWarning for this process's open-file
// limit (the soft one, which Go raised to the hard one at start).
func warnOpenFiles(cfg Config, log *slog.Logger) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return
	}
	servers := 0
	if cfg.Node.MetricsAddr != "" {
		servers++
	}
	if cfg.Serve.Addr != "" {
		servers++
	}
	if msg := openFilesWarning(rl.Cur, servers, cfg.HTTP.MaxConns); msg != "" {
		log.Warn(msg)
	}
}
