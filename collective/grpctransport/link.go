package grpctransport

import (
	"errors"
	"fmt"
	"io"
	"sync"

	pb "github.com/questrt/questrt/api/collective/v1"
	"github.com/questrt/questrt/collective"
)

// frameStream is one side of a Collective.Stream: the client's and the
// server's typed streams both have these methods. Send is called only by
// the link's sender goroutine, Recv only by its reader, so each is used by
// one goroutine at a time, as gRPC requires.
type frameStream interface {
	Send(*pb.Frame) error
	Recv() (*pb.Frame, error)
}

// byeFrame is the Frame a closing member sends last on every stream.
var byeFrame = &pb.Frame{Kind: &pb.Frame_Bye{Bye: &pb.Bye{}}}

// link is this member's end of the stream it shares with one peer, after
// the handshake. It runs two goroutines: the sender (run), the only writer
// of the stream, and the reader (read), which files the peer's messages
// into the member's mailboxes. Whoever starts them (the dialer or the
// server's handler) waits for both before it ends the call.
type link struct {
	peer    int
	stream  frameStream
	maxSend int          // the largest payload Send passes: min(ours, the peer's)
	endSend func() error // after the Bye: the client's CloseSend; nil on the server side
	boxes   *collective.Mailboxes

	queue chan *pb.Frame // Send -> sender

	stopOnce sync.Once
	stopped  chan struct{} // closed by stop: the sender flushes, says Bye and ends
	sendDone chan struct{} // closed when the sender has ended

	goneOnce sync.Once
	goneErr  error         // why the peer is gone; written before gone is closed
	gone     chan struct{} // closed when the peer can send no more: it said Bye or the stream ended
	readDone chan struct{} // closed when the reader has seen the end of the stream
}

func newLink(peer int, stream frameStream, maxSend, queue int, endSend func() error, boxes *collective.Mailboxes) *link {
	return &link{
		peer: peer, stream: stream, maxSend: maxSend, endSend: endSend, boxes: boxes,
		queue:    make(chan *pb.Frame, queue),
		stopped:  make(chan struct{}),
		sendDone: make(chan struct{}),
		gone:     make(chan struct{}),
		readDone: make(chan struct{}),
	}
}

// stop makes the sender send what is queued (unless the peer is gone),
// then a Bye, and end. Idempotent.
func (l *link) stop() { l.stopOnce.Do(func() { close(l.stopped) }) }

// markGone records that the peer can send no more, with why (an error
// wrapping collective.ErrPeerClosed). Only the first call counts.
func (l *link) markGone(err error) {
	l.goneOnce.Do(func() {
		l.goneErr = err
		close(l.gone)
	})
}

// err returns why the peer is gone; call it only once gone is closed.
func (l *link) err() error { return l.goneErr }

// sendable reports why Send cannot pass a frame to the sender any more:
// the peer is gone or the sender has ended; nil when it can.
func (l *link) sendable() error {
	select {
	case <-l.gone:
		return l.goneErr
	case <-l.sendDone:
		return fmt.Errorf("%w: rank %d: stream closed for sending", collective.ErrPeerClosed, l.peer)
	default:
		return nil
	}
}

// run is the sender goroutine: it writes queued frames to the stream in
// order until stop, then flushes the queue, sends a Bye and half-closes.
// A write error ends it early (the reader sees the broken stream too).
func (l *link) run() {
	defer close(l.sendDone)
	for {
		select {
		case f := <-l.queue:
			if l.stream.Send(f) != nil {
				return
			}
		case <-l.stopped:
			l.flush()
			return
		}
	}
}

// flush sends the queued frames (dropped when the peer is gone: nobody
// would receive them), the Bye and, on the client side, the half-close.
func (l *link) flush() {
	for {
		select {
		case f := <-l.queue:
			if isDone(l.gone) {
				continue
			}
			if l.stream.Send(f) != nil {
				return
			}
		default:
			if l.stream.Send(byeFrame) != nil {
				return
			}
			if l.endSend != nil {
				_ = l.endSend()
			}
			return
		}
	}
}

// read is the reader: it files the peer's messages until the stream ends,
// marks the peer gone at its Bye or at the end of the stream, and stops the
// sender. Messages that come after a Bye, or that break the protocol, end
// the link.
func (l *link) read() {
	defer close(l.readDone)
	defer l.stop()
	for {
		f, err := l.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				l.markGone(fmt.Errorf("%w: rank %d ended the stream", collective.ErrPeerClosed, l.peer))
			} else {
				l.markGone(fmt.Errorf("%w: rank %d: stream lost: %v", collective.ErrPeerClosed, l.peer, err))
			}
			return
		}
		switch k := f.GetKind().(type) {
		case *pb.Frame_Message:
			if isDone(l.gone) {
				return // a message after the Bye
			}
			p := k.Message.GetPayload()
			if p == nil {
				p = []byte{}
			}
			_ = l.boxes.Put(l.peer, k.Message.GetTag(), p) // closed: the member is gone, drop
		case *pb.Frame_Bye:
			l.markGone(fmt.Errorf("%w: rank %d closed its transport", collective.ErrPeerClosed, l.peer))
			l.stop()
		default:
			l.markGone(fmt.Errorf("%w: rank %d: unexpected %T frame", collective.ErrPeerClosed, l.peer, k))
			return
		}
	}
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
