package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of [Config] and [Faults].
const (
	// DefaultChunkSize is Config.ChunkSize's default: the payload of one
	// TCP segment on Ethernet (MTU 1500 less IP and TCP headers with
	// timestamps).
	DefaultChunkSize = 1448
	// DefaultDialTimeout is Config.DialTimeout's default.
	DefaultDialTimeout = 5 * time.Second
	// DefaultLossDelay is Faults.LossDelay's default: Linux's minimum
	// TCP retransmission timeout.
	DefaultLossDelay = 200 * time.Millisecond
)

// queueLen bounds the chunks read but not yet written, per direction of a
// connection: past it, reading waits for the writer.
const queueLen = 256

// readSize is the buffer of one read.
const readSize = 32 << 10

// LossMode is what a lost chunk does.
type LossMode int

const (
	// LossStall holds a lost chunk (and the chunks behind it) for
	// Faults.LossDelay: a TCP retransmission. It emulates packet loss.
	LossStall LossMode = iota
	// LossReset resets the connection, both ways.
	LossReset
)

func (m LossMode) String() string {
	switch m {
	case LossStall:
		return "stall"
	case LossReset:
		return "reset"
	}
	return fmt.Sprintf("LossMode(%d)", int(m))
}

// Faults are the faults a proxy injects into every chunk it reads, in
// both directions. The zero value injects none.
type Faults struct {
	// Latency delays every chunk (one way: a round trip through the
	// proxy grows by twice it).
	Latency time.Duration
	// SpikeDelay is added to the delay of a chunk drawn with probability
	// SpikeProb, and of every chunk read within the first SpikeFor of
	// each SpikeEvery since the proxy started (periodic windows; both
	// SpikeEvery and SpikeFor 0: none).
	SpikeDelay           time.Duration
	SpikeProb            float64
	SpikeEvery, SpikeFor time.Duration
	// LossProb is the probability that a chunk is lost; Loss says what
	// that does: under LossStall the chunk is held LossDelay longer
	// (default DefaultLossDelay), under LossReset the connection is
	// reset.
	LossProb  float64
	Loss      LossMode
	LossDelay time.Duration
}

// Validate reports the first invalid field.
func (f Faults) Validate() error {
	prob := func(p float64) bool { return p >= 0 && p <= 1 && !math.IsNaN(p) }
	switch {
	case f.Latency < 0 || f.SpikeDelay < 0 || f.SpikeEvery < 0 || f.SpikeFor < 0 || f.LossDelay < 0:
		return fmt.Errorf("faultproxy: negative duration in %+v", f)
	case !prob(f.SpikeProb):
		return fmt.Errorf("faultproxy: spike probability %v outside [0, 1]", f.SpikeProb)
	case !prob(f.LossProb):
		return fmt.Errorf("faultproxy: loss probability %v outside [0, 1]", f.LossProb)
	case f.SpikeFor > f.SpikeEvery:
		return fmt.Errorf("faultproxy: spike window %v longer than its period %v", f.SpikeFor, f.SpikeEvery)
	case f.Loss != LossStall && f.Loss != LossReset:
		return fmt.Errorf("faultproxy: unknown loss mode %v", f.Loss)
	}
	return nil
}

// Config configures a proxy.
type Config struct {
	// Target is the host:port every accepted connection is forwarded
	// to. Required.
	Target string
	// Faults are the initial faults (Proxy.SetFaults changes them).
	Faults Faults
	// ChunkSize is the most bytes one fault decision covers (default
	// DefaultChunkSize).
	ChunkSize int
	// DialTimeout bounds the dial of Target (default
	// DefaultDialTimeout); a connection whose dial fails is reset.
	DialTimeout time.Duration
	// Seed seeds the proxy's random source.
	Seed uint64
}

// Stats counts what a proxy did since it started.
type Stats struct {
	// Accepted counts the connections accepted, DialFailures those whose
	// Target dial failed; Open is the connections forwarding now.
	Accepted, DialFailures int64
	Open                   int
	// Chunks and Bytes count what was written on, both directions.
	Chunks, Bytes int64
	// Spiked counts the chunks delayed by a spike, Stalled those held by
	// a LossStall loss, Resets the connections reset by a LossReset loss.
	Spiked, Stalled, Resets int64
}

// Proxy is a running fault-injecting TCP proxy. Its methods are safe for
// concurrent use.
type Proxy struct {
	cfg   Config
	lis   net.Listener
	start time.Time
	// faults are the current faults (never nil).
	faults atomic.Pointer[Faults]

	rngMu sync.Mutex
	rng   *rand.Rand

	mu     sync.Mutex
	conns  map[*pair]struct{}
	closed bool

	// dialCtx ends at shutdown (the dials in progress end).
	dialCtx    context.Context
	dialCancel context.CancelFunc
	done       chan struct{} // closed at shutdown
	once       sync.Once
	wg         sync.WaitGroup

	accepted, dialFailures, chunks, bytes, spiked, stalled, resets atomic.Int64
}

// Listen listens on addr (host:port; port 0 picks a free one) and serves
// a proxy on it (New).
func Listen(ctx context.Context, addr string, cfg Config) (*Proxy, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	return New(ctx, l, cfg)
}

// New serves a proxy on l, which it takes over (it closes it, also when
// it returns an error). The proxy runs until Close, or until ctx ends
// (which closes it as Close does; Close still waits for its goroutines).
func New(ctx context.Context, l net.Listener, cfg Config) (*Proxy, error) {
	if err := cfg.validate(); err != nil {
		l.Close()
		return nil, err
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = DefaultChunkSize
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	p := &Proxy{
		cfg:   cfg,
		lis:   l,
		start: time.Now(),
		rng:   newRand(cfg.Seed),
		conns: map[*pair]struct{}{},
		done:  make(chan struct{}),
	}
	f := cfg.Faults
	p.faults.Store(&f)
	p.dialCtx, p.dialCancel = context.WithCancel(context.Background())
	p.wg.Go(func() {
		select {
		case <-ctx.Done():
			p.shutdown()
		case <-p.done:
		}
	})
	p.wg.Go(p.accept)
	return p, nil
}

// newRand is the proxy's random source for seed.
func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

func (c Config) validate() error {
	if c.Target == "" {
		return errors.New("faultproxy: no target")
	}
	if _, _, err := net.SplitHostPort(c.Target); err != nil {
		return fmt.Errorf("faultproxy: target %q: %w", c.Target, err)
	}
	if c.ChunkSize < 0 || c.DialTimeout < 0 {
		return fmt.Errorf("faultproxy: negative chunk size %d or dial timeout %v", c.ChunkSize, c.DialTimeout)
	}
	return c.Faults.Validate()
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() net.Addr { return p.lis.Addr() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.cfg.Target }

// SetFaults replaces the faults; the chunks read from then on, on every
// connection, get them (queued chunks keep their release times).
func (p *Proxy) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.faults.Store(&f)
	return nil
}

// Faults returns the current faults.
func (p *Proxy) Faults() Faults { return *p.faults.Load() }

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.conns)
	p.mu.Unlock()
	return Stats{Accepted: p.accepted.Load(), DialFailures: p.dialFailures.Load(), Open: open,
		Chunks: p.chunks.Load(), Bytes: p.bytes.Load(), Spiked: p.spiked.Load(), Stalled: p.stalled.Load(), Resets: p.resets.Load()}
}

// Close stops the proxy: it closes the listener and every connection
// (their queued chunks are dropped) and waits for every goroutine of the
// proxy to end. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.shutdown()
	p.wg.Wait()
	return nil
}

// shutdown closes the listener and the connections, once.
func (p *Proxy) shutdown() {
	p.once.Do(func() {
		close(p.done)
		p.dialCancel()
		p.lis.Close()
		p.mu.Lock()
		p.closed = true
		for pr := range p.conns {
			pr.end(false)
		}
		p.mu.Unlock()
	})
}

// accept accepts connections until the listener closes.
func (p *Proxy) accept() {
	backoff := 5 * time.Millisecond
	for {
		c, err := p.lis.Accept()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient failure (out of file descriptors): wait a little.
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		p.accepted.Add(1)
		p.wg.Go(func() { p.serve(c) })
	}
}

// pair is one forwarded connection: a (accepted) and b (to Target).
type pair struct {
	a, b net.Conn
	dead chan struct{} // closed by end
	once sync.Once
}

// end closes both connections, with an RST when reset (SO_LINGER 0).
func (pr *pair) end(reset bool) {
	pr.once.Do(func() {
		if reset {
			linger0(pr.a)
			linger0(pr.b)
		}
		pr.a.Close()
		pr.b.Close()
		close(pr.dead)
	})
}

func linger0(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
}

// chunk is a piece of a direction's bytes and its release time.
type chunk struct {
	data []byte
	at   time.Time
}

// serve dials Target for the accepted c and forwards both ways until both
// directions end (or one fails, which ends both).
func (p *Proxy) serve(c net.Conn) {
	dctx, cancel := context.WithTimeout(p.dialCtx, p.cfg.DialTimeout)
	var d net.Dialer
	up, err := d.DialContext(dctx, "tcp", p.cfg.Target)
	cancel()
	if err != nil {
		p.dialFailures.Add(1)
		linger0(c)
		c.Close()
		return
	}
	pr := &pair{a: c, b: up, dead: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pr.end(false)
		return
	}
	p.conns[pr] = struct{}{}
	p.mu.Unlock()
	var writers sync.WaitGroup
	for _, dir := range [2][2]net.Conn{{pr.a, pr.b}, {pr.b, pr.a}} {
		q := make(chan chunk, queueLen)
		p.wg.Go(func() { p.read(pr, dir[0], q) })
		writers.Add(1)
		p.wg.Go(func() {
			defer writers.Done()
			p.write(pr, dir[1], q)
		})
	}
	writers.Wait()
	pr.end(false)
	p.mu.Lock()
	delete(p.conns, pr)
	p.mu.Unlock()
}

// read reads src into chunks with their release times and queues them
// for the writer, until src ends (EOF: q is closed, the writer
// half-closes its side) or fails (the pair ends with a reset).
func (p *Proxy) read(pr *pair, src net.Conn, q chan<- chunk) {
	defer close(q)
	buf := make([]byte, readSize)
	var last time.Time
	for {
		n, err := src.Read(buf)
		if n > 0 {
			now := time.Now()
			for off := 0; off < n; off += p.cfg.ChunkSize {
				delay, reset := p.fate(now)
				if reset {
					p.resets.Add(1)
					pr.end(true)
					return
				}
				at := now.Add(delay)
				if at.Before(last) {
					at = last
				}
				last = at
				select {
				case q <- chunk{data: bytes.Clone(buf[off:min(off+p.cfg.ChunkSize, n)]), at: at}:
				case <-pr.dead:
					return
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				pr.end(true)
			}
			return
		}
	}
}

// write writes each chunk of q to dst at its release time; after the last
// one (src's EOF) it half-closes dst.
func (p *Proxy) write(pr *pair, dst net.Conn, q <-chan chunk) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for c := range q {
		if d := time.Until(c.at); d > 0 {
			t.Reset(d)
			select {
			case <-t.C:
			case <-pr.dead:
				t.Stop()
				return
			}
		}
		if _, err := dst.Write(c.data); err != nil {
			pr.end(true)
			return
		}
		p.chunks.Add(1)
		p.bytes.Add(int64(len(c.data)))
	}
	select {
	case <-pr.dead:
		return
	default:
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// fate draws the delay of a chunk read at now, or whether the connection
// is reset.
func (p *Proxy) fate(now time.Time) (time.Duration, bool) {
	f := p.faults.Load()
	var spikeDraw, lossDraw float64 = 1, 1
	if f.SpikeProb > 0 || f.LossProb > 0 {
		p.rngMu.Lock()
		spikeDraw, lossDraw = p.rng.Float64(), p.rng.Float64()
		p.rngMu.Unlock()
	}
	o := decide(f, now.Sub(p.start), spikeDraw, lossDraw)
	if o.spike {
		p.spiked.Add(1)
	}
	if o.stall {
		p.stalled.Add(1)
	}
	return o.delay, o.reset
}

// outcome is the fate of one chunk.
type outcome struct {
	delay               time.Duration
	spike, stall, reset bool
}

// decide is the fate of a chunk read since after the proxy started, given
// two uniform draws in [0, 1): a pure function of its arguments.
func decide(f *Faults, since time.Duration, spikeDraw, lossDraw float64) outcome {
	o := outcome{delay: f.Latency}
	o.spike = spikeDraw < f.SpikeProb || (f.SpikeEvery > 0 && f.SpikeFor > 0 && since%f.SpikeEvery < f.SpikeFor)
	if o.spike {
		o.delay += f.SpikeDelay
	}
	if lossDraw < f.LossProb {
		if f.Loss == LossReset {
			return outcome{reset: true}
		}
		o.stall = true
		if f.LossDelay > 0 {
			o.delay += f.LossDelay
		} else {
			o.delay += DefaultLossDelay
		}
	}
	return o
}
