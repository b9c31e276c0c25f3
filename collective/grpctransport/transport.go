package grpctransport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	pb "github.com/questrt/questrt/api/collective/v1"
	"github.com/questrt/questrt/collective"
)

// Errors of this package; test with errors.Is.
var (
	// ErrTooLarge: Send was given a message over the limit of the
	// member or of its peer (Config.MaxMessageBytes). Nothing was sent
	// and the stream is still up.
	ErrTooLarge = errors.New("grpctransport: message too large")
	// ErrHandshake: a peer refused this member's stream, or answered
	// with a Hello that does not match (another group, size or rank).
	ErrHandshake = errors.New("grpctransport: handshake refused")
)

// Transport is one member of a group whose members talk over gRPC; it
// implements collective.Transport, with the threading contract documented
// there. Make one with New.
type Transport struct {
	cfg        Config
	rank, size int
	log        *slog.Logger
	boxes      *collective.Mailboxes
	lis        net.Listener
	server     *grpc.Server

	// base is the parent of the client streams' contexts; cancelled by
	// Close once the peers had CloseTimeout to acknowledge.
	base   context.Context
	cancel context.CancelFunc

	done      chan struct{} // closed by Close: pending and later calls fail
	closeOnce sync.Once

	mu     sync.Mutex
	closed bool
	links  []*link       // by rank; nil for this member, and for peers until connected
	up     int           // links registered
	allUp  chan struct{} // closed when every peer's link is registered
	// wg counts every goroutine of the transport: the server's Serve, each
	// link's sender and reader, and the server handlers (which run the
	// readers of the streams dialed by higher ranks). Added to only under
	// mu while !closed, so never after Close starts waiting.
	wg sync.WaitGroup
}

var _ collective.Transport = (*Transport)(nil)

// New makes member cfg.Rank of the group of len(cfg.Peers) members: it
// listens, dials every lower rank and waits until every higher rank has
// dialed it, so that on return the member has one established stream with
// each peer. ctx bounds that wait (a peer still starting up is retried
// until then); it does not bound the Transport's life. New takes over
// cfg.Listener: Close closes it, and so does New when it fails.
func New(ctx context.Context, cfg Config) (*Transport, error) {
	t, err := newTransport(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("grpctransport: rank %d of group %q: %w", cfg.Rank, cfg.Group, err)
	}
	return t, nil
}

func newTransport(ctx context.Context, cfg Config) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	lis := cfg.Listener
	if lis == nil {
		addr := cfg.ListenAddr
		if addr == "" {
			addr = cfg.Peers[cfg.Rank]
		}
		var err error
		if lis, err = net.Listen("tcp", addr); err != nil {
			return nil, fmt.Errorf("listen: %w", err)
		}
	}
	n := len(cfg.Peers)
	cfg.Peers = slices.Clone(cfg.Peers)
	t := &Transport{
		cfg: cfg, rank: cfg.Rank, size: n,
		log:   cfg.logger().With("group", cfg.Group, "rank", cfg.Rank),
		boxes: collective.NewMailboxes(),
		lis:   lis,
		done:  make(chan struct{}),
		links: make([]*link, n),
		allUp: make(chan struct{}),
	}
	t.base, t.cancel = context.WithCancel(context.Background())
	if n == 1 {
		close(t.allUp)
	}
	t.server = grpc.NewServer(cfg.serverOptions()...)
	pb.RegisterCollectiveServer(t.server, &service{t: t})
	t.wg.Go(func() {
		if err := t.server.Serve(lis); err != nil && !isDone(t.done) {
			t.log.Warn("grpctransport: serving stopped", "addr", lis.Addr().String(), "err", err)
		}
	})

	// Dial the lower ranks concurrently; the first failure cancels the
	// others and is the one reported.
	dctx, dcancel := context.WithCancel(ctx)
	defer dcancel()
	var first error
	var once sync.Once
	var dials sync.WaitGroup
	for peer := range t.rank {
		dials.Go(func() {
			if err := t.dial(dctx, peer); err != nil {
				once.Do(func() { first = err; dcancel() })
			}
		})
	}
	dials.Wait()
	if first != nil {
		t.Close()
		return nil, first
	}
	select {
	case <-t.allUp:
		return t, nil
	case <-ctx.Done():
		missing := t.unconnected()
		t.Close()
		return nil, fmt.Errorf("waiting for ranks %v to connect: %w", missing, ctx.Err())
	}
}

// register records l as the link to its peer and, unless the transport is
// closed or already has a link to that peer, adds the goroutines the
// caller will start (so Close waits for them); it reports which.
func (t *Transport) register(l *link, goroutines int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return collective.ErrClosed
	}
	if t.links[l.peer] != nil {
		return fmt.Errorf("rank %d is already connected", l.peer)
	}
	t.links[l.peer] = l
	t.up++
	if t.up == t.size-1 {
		close(t.allUp)
	}
	t.wg.Add(goroutines)
	return nil
}

// unconnected returns the peers without a link yet.
func (t *Transport) unconnected() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for r, l := range t.links {
		if r != t.rank && l == nil {
			out = append(out, r)
		}
	}
	return out
}

// Rank returns this member's rank.
func (t *Transport) Rank() int { return t.rank }

// Size returns the number of members of the group.
func (t *Transport) Size() int { return t.size }

// Addr returns the address this member listens on.
func (t *Transport) Addr() net.Addr { return t.lis.Addr() }

// Pending returns the number of messages received by this member and not
// yet taken by Recv (diagnostics and tests).
func (t *Transport) Pending() int { return t.boxes.Pending() }

// Send queues a copy of msg for rank to's sender goroutine (a message to
// this member itself goes straight to its mailbox) and returns; it blocks
// only while the peer's queue is full, until ctx ends. A message over the
// limit fails with ErrTooLarge and nothing is sent.
func (t *Transport) Send(ctx context.Context, to int, tag uint64, msg []byte) error {
	if err := t.send(ctx, to, tag, msg); err != nil {
		return fmt.Errorf("send to %d tag %#x: %w", to, tag, err)
	}
	return nil
}

func (t *Transport) send(ctx context.Context, to int, tag uint64, msg []byte) error {
	if to < 0 || to >= t.size {
		return fmt.Errorf("%w: %d not in [0, %d)", collective.ErrBadRank, to, t.size)
	}
	if isDone(t.done) {
		return collective.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if to == t.rank {
		if len(msg) > t.cfg.MaxMessageBytes {
			return fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(msg), t.cfg.MaxMessageBytes)
		}
		_ = t.boxes.Put(to, tag, append([]byte{}, msg...)) // closed: dropped, as the peer would
		return nil
	}
	l := t.links[to]
	if len(msg) > l.maxSend {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(msg), l.maxSend)
	}
	if err := l.sendable(); err != nil {
		return err
	}
	f := &pb.Frame{Kind: &pb.Frame_Message{Message: &pb.Message{Tag: tag, Payload: bytes.Clone(msg)}}}
	select {
	case l.queue <- f:
		return nil
	default:
	}
	select {
	case l.queue <- f:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.gone:
		return l.err()
	case <-l.sendDone:
		return l.sendable()
	case <-t.done:
		return collective.ErrClosed
	}
}

// Recv returns the oldest message rank from sent under tag, waiting for
// one until ctx ends, the peer is gone or this member closes.
func (t *Transport) Recv(ctx context.Context, from int, tag uint64) ([]byte, error) {
	if from < 0 || from >= t.size {
		return nil, fmt.Errorf("recv from %d tag %#x: %w: %d not in [0, %d)", from, tag, collective.ErrBadRank, from, t.size)
	}
	var l *link
	var gone <-chan struct{}
	if from != t.rank {
		l = t.links[from]
		gone = l.gone
	}
	msg, err := t.boxes.Take(ctx, from, tag, gone, t.done)
	if l != nil && errors.Is(err, collective.ErrPeerClosed) {
		err = l.err() // the link's own cause (it wraps ErrPeerClosed)
	}
	if err != nil {
		return nil, fmt.Errorf("recv from %d tag %#x: %w", from, tag, err)
	}
	return msg, nil
}

// Forget implements collective.Transport: the last
// collective.ForgetHistory forgotten tags (at least) stay forgotten.
func (t *Transport) Forget(tag uint64) { t.boxes.Forget(tag) }

// Close fails every pending and later call with collective.ErrClosed,
// sends each peer the messages already queued for it and a Bye, waits up
// to Config.CloseTimeout for the peers to acknowledge, then cuts the
// streams, stops the server and waits for every goroutine of the
// transport. It is idempotent and returns nil.
func (t *Transport) Close() error {
	t.closeOnce.Do(t.shutdown)
	return nil
}

func (t *Transport) shutdown() {
	t.mu.Lock()
	t.closed = true
	links := slices.Clone(t.links)
	t.mu.Unlock()
	t.boxes.Close()
	close(t.done)
	for _, l := range links {
		if l != nil {
			l.stop()
		}
	}
	timer := time.NewTimer(t.cfg.CloseTimeout)
	defer timer.Stop()
wait:
	for _, l := range links {
		if l == nil {
			continue
		}
		select {
		case <-l.readDone:
		case <-timer.C:
			t.log.Warn("grpctransport: peers did not acknowledge close in time", "timeout", t.cfg.CloseTimeout)
			break wait
		}
	}
	t.cancel()
	t.server.Stop()
	t.wg.Wait()
}
