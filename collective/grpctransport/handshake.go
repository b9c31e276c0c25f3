package grpctransport

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/questrt/questrt/api/collective/v1"
	"github.com/questrt/questrt/collective"
)

// protocolVersion is the version of the stream protocol this package
// speaks (api/collective/v1) and of the messages a step's layer sends
// over it. 2: a layer whose plans are all dense exchanges no selection
// candidates (a version-1 member would wait for them), so members of the
// two versions refuse each other at the handshake.
const protocolVersion = 2

// hello is this member's opening frame.
func (t *Transport) hello() *pb.Frame {
	return &pb.Frame{Kind: &pb.Frame_Hello{Hello: &pb.Hello{
		Protocol:        protocolVersion,
		Group:           t.cfg.Group,
		Rank:            uint32(t.rank),
		Size:            uint32(t.size),
		MaxMessageBytes: uint64(t.cfg.MaxMessageBytes),
	}}}
}

// checkHello checks a peer's Hello against this member: protocol, group,
// size, a rank that rankOK accepts, a positive message limit.
func (t *Transport) checkHello(h *pb.Hello, rankOK func(r int) bool) error {
	switch {
	case h == nil:
		return errors.New("first frame is not a Hello")
	case h.GetProtocol() != protocolVersion:
		return fmt.Errorf("protocol %d, want %d", h.GetProtocol(), protocolVersion)
	case h.GetGroup() != t.cfg.Group:
		return fmt.Errorf("group %q, want %q", h.GetGroup(), t.cfg.Group)
	case h.GetSize() != uint32(t.size):
		return fmt.Errorf("group size %d, want %d", h.GetSize(), t.size)
	case h.GetRank() >= uint32(t.size) || !rankOK(int(h.GetRank())):
		return fmt.Errorf("unexpected rank %d", h.GetRank())
	case h.GetMaxMessageBytes() == 0:
		return errors.New("message limit 0")
	}
	return nil
}

// maxSend is the largest payload this member sends to a peer whose Hello
// is h: the smaller of the two limits.
func (t *Transport) maxSend(h *pb.Hello) int {
	if m := h.GetMaxMessageBytes(); m < uint64(t.cfg.MaxMessageBytes) {
		return int(m)
	}
	return t.cfg.MaxMessageBytes
}

// dial connects to the lower rank peer: one connection, one stream, a
// Hello each way, then the link's sender and reader goroutines. ctx bounds
// the connection and the handshake; the stream itself lives until Close.
func (t *Transport) dial(ctx context.Context, peer int) error {
	addr := t.cfg.Peers[peer]
	conn, err := grpc.NewClient(addr, t.cfg.dialOptions()...)
	if err != nil {
		return fmt.Errorf("dial rank %d at %s: %w", peer, addr, err)
	}
	sctx, cancel := context.WithCancel(t.base)
	stopCancel := context.AfterFunc(ctx, cancel)
	fail := func(err error) error {
		stopCancel()
		cancel()
		conn.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return fmt.Errorf("connect to rank %d at %s: %w", peer, addr, err)
	}
	stream, err := pb.NewCollectiveClient(conn).Stream(sctx, grpc.WaitForReady(true))
	if err != nil {
		return fail(err)
	}
	if err := stream.Send(t.hello()); err != nil {
		// A client stream's Send fails with io.EOF; Recv has the status.
		_, err = stream.Recv()
		return fail(err)
	}
	f, err := stream.Recv()
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			err = fmt.Errorf("%w: %s", ErrHandshake, status.Convert(err).Message())
		}
		return fail(err)
	}
	h := f.GetHello()
	if err := t.checkHello(h, func(r int) bool { return r == peer }); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrHandshake, err))
	}
	if !stopCancel() {
		return fail(errors.New("handshake finished after the deadline"))
	}
	l := newLink(peer, stream, t.maxSend(h), t.cfg.SendQueue, stream.CloseSend, t.boxes)
	if err := t.register(l, 2); err != nil {
		cancel()
		conn.Close()
		return fmt.Errorf("connect to rank %d at %s: %w", peer, addr, err)
	}
	go func() {
		defer t.wg.Done()
		l.run()
	}()
	go func() {
		defer t.wg.Done()
		l.read()
		t.logGone(l)
		<-l.sendDone
		cancel()
		conn.Close()
	}()
	return nil
}

// logGone logs why a peer's link ended, unless this member closed.
func (t *Transport) logGone(l *link) {
	if !isDone(t.done) {
		t.log.Info("grpctransport: peer gone", "peer", l.peer, "err", l.err())
	}
}

// service answers the streams dialed by the higher ranks.
type service struct {
	pb.UnimplementedCollectiveServer
	t *Transport
}

// Stream is the server side of a higher rank's stream: it checks the
// Hello, answers with this member's, and runs the link's reader itself
// (and its sender on another goroutine) until the stream ends.
func (s *service) Stream(stream grpc.BidiStreamingServer[pb.Frame, pb.Frame]) error {
	t := s.t
	f, err := stream.Recv()
	if err != nil {
		return err
	}
	h := f.GetHello()
	if err := t.checkHello(h, func(r int) bool { return r > t.rank }); err != nil {
		t.log.Warn("grpctransport: refused a stream", "err", err)
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	l := newLink(int(h.GetRank()), stream, t.maxSend(h), t.cfg.SendQueue, nil, t.boxes)
	l.queue <- t.hello() // the answer: the first frame the sender writes
	if err := t.register(l, 2); err != nil {
		if errors.Is(err, collective.ErrClosed) {
			return status.Error(codes.Unavailable, "grpctransport: member closed")
		}
		t.log.Warn("grpctransport: refused a stream", "err", err)
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	defer t.wg.Done()
	go func() {
		defer t.wg.Done()
		l.run()
	}()
	l.read()
	t.logGone(l)
	<-l.sendDone
	return nil
}
