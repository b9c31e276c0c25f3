package collective

import (
	"context"
	"errors"
	"fmt"
)

// Transport moves byte messages between the ranks of one group (the CP ranks
// of one TP group). Ranks are 0..Size()-1; Rank() is this member's.
//
// Messages are matched by (sender, tag): Recv(ctx, from, tag) returns the
// oldest message that rank from sent to this member with that tag. Messages
// with the same sender and tag arrive in the order they were sent; messages
// with different tags are independent, so a fast rank may already send the
// round of tag t+1 while a slow one still receives round t. A message whose
// tag nobody has asked for yet is buffered until a Recv for it comes (or the
// transport closes), never dropped. A member may send to itself.
//
// Threading contract:
//   - All methods are safe for concurrent use by multiple goroutines.
//     Concurrent Recvs for the same (from, tag) each take a different
//     message, in no particular order among themselves.
//   - Send does not retain msg after it returns; the caller may reuse it.
//     Recv returns a buffer the caller owns.
//   - Send never waits for the receiver to call Recv: the receiving side
//     buffers. It may block for a bounded time (flow control of a network
//     transport) but must make progress while the peer is blocked in an
//     unrelated Recv, so every rank can send all of a round's messages
//     before receiving any of them.
//   - Every blocking call honours ctx: when ctx is cancelled or its
//     deadline passes, the call returns ctx.Err() (possibly wrapped)
//     promptly.
//   - Once the peer has closed (or its connection is lost), Recv from it
//     returns, after the messages it sent before closing have been
//     delivered, an error wrapping ErrPeerClosed; Send to it returns such an
//     error as well. Pending calls fail promptly, they do not wait for ctx.
//   - After Close, every call on this member returns an error wrapping
//     ErrClosed, pending calls included. Close is idempotent.
//
// Tags are opaque to the transport. Operations of this package use exactly
// one tag each; see MakeTag for the convention the runtime follows.
//
// A gRPC implementation keeps one long-lived bidirectional stream per peer
// and a reader goroutine per stream that files incoming (tag, bytes) frames
// into per-(sender, tag) mailboxes; the in-process implementation is
// NewInprocGroup.
type Transport interface {
	// Rank returns this member's rank in [0, Size()).
	Rank() int
	// Size returns the number of members of the group.
	Size() int
	// Send delivers msg to rank to under tag.
	Send(ctx context.Context, to int, tag uint64, msg []byte) error
	// Recv returns the next message rank from sent under tag, waiting
	// until one arrives, ctx ends, the peer closes or this member closes.
	Recv(ctx context.Context, from int, tag uint64) ([]byte, error)
	// Close releases this member; peers see ErrPeerClosed.
	Close() error
	// Forget drops every message buffered for this member under tag and
	// any that arrive for it later, as long as the tag is among the last
	// ForgetHistory forgotten (the memory of forgotten tags is bounded;
	// a message that arrives later than that is buffered). Callers forget the tags of an
	// operation that failed, once every local call under it returned, so
	// that messages nobody will receive (a peer's data sent before it
	// learned of the failure, an abort) do not pile up.
	Forget(tag uint64)
}

// Errors a Transport or an operation wraps; test with errors.Is.
var (
	// ErrClosed: this member's transport was closed.
	ErrClosed = errors.New("collective: transport closed")
	// ErrPeerClosed: the peer closed its transport or its connection was
	// lost.
	ErrPeerClosed = errors.New("collective: peer closed")
	// ErrAborted: a peer failed the operation and told the others (Abort).
	ErrAborted = errors.New("collective: operation aborted by a peer")
	// ErrBadMessage: a received message is malformed or does not match
	// the operation (shape, op, budgets).
	ErrBadMessage = errors.New("collective: bad message")
	// ErrBadRank: a rank outside [0, Size()).
	ErrBadRank = errors.New("collective: rank out of range")
	// ErrInjected is the default error of Faulty's injected failures.
	ErrInjected = errors.New("collective: injected fault")
)

// RankError is the error of an operation that failed while talking to (or
// because of) peer Rank. Callers that map failures to nodes use errors.As.
type RankError struct {
	Rank int
	Err  error
}

func (e *RankError) Error() string { return fmt.Sprintf("rank %d: %v", e.Rank, e.Err) }

// Unwrap returns the underlying error.
func (e *RankError) Unwrap() error { return e.Err }

// Op names an operation in a tag and in message headers.
type Op uint8

// Operations of a Group.
const (
	OpGather    Op = 1 // AllGather
	OpSelect    Op = 2 // SelectExact
	OpReduce    Op = 3 // Reduce
	OpAllReduce Op = 4 // AllReduce
	// OpTopP tags the all-gather of a step's top-p candidate logits
	// (plan.Policy.TopP); the operation is AllGather.
	OpTopP Op = 5
)

func (o Op) String() string {
	switch o {
	case OpGather:
		return "gather"
	case OpSelect:
		return "select"
	case OpReduce:
		return "reduce"
	case OpAllReduce:
		return "allreduce"
	case OpTopP:
		return "topp"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// MakeTag is the tag convention of the runtime: step in the high 40 bits,
// layer in the next 16, op in the low 8, so every operation of every layer
// of every step of a group has its own tag. Tags must not be reused within
// the lifetime of a group: a failed operation can leave messages buffered
// under its tag. step must be < 2^40 and layer < 2^16 (higher bits are
// dropped).
func MakeTag(step uint64, layer int, op Op) uint64 {
	return step<<24 | uint64(uint16(layer))<<8 | uint64(op)
}

func checkRank(r, n int) error {
	if r < 0 || r >= n {
		return fmt.Errorf("%w: %d not in [0, %d)", ErrBadRank, r, n)
	}
	return nil
}
