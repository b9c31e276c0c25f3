package remote

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/worker"
)

// Errors of this package; test with errors.Is. Errors that cross the wire
// also wrap the worker, pagestore and collective sentinels they wrapped on
// the node (see [ToStatus] and [FromStatus]).
var (
	// ErrUnavailable: the node could not be reached, or it answered
	// UNAVAILABLE (a closed worker, a lost or aborted collective peer). A
	// coordinator treats the node's ranks as gone.
	ErrUnavailable = errors.New("worker/remote: worker unavailable")
	// ErrUnknownGrid: the node holds no grid of that id (never opened,
	// closed, or freed because ConnectGrid did not come in time).
	ErrUnknownGrid = errors.New("worker/remote: unknown grid")
	// ErrUnknownBench: the node holds no opened bench rank of that id
	// (never opened, already run, or freed because RunBench did not come
	// in time).
	ErrUnknownBench = errors.New("worker/remote: unknown bench")
	// ErrWrongView: the call carries another membership view than the
	// one the grid was opened under.
	ErrWrongView = errors.New("worker/remote: wrong membership view")
	// ErrGridState: a grid call out of order (OpenGrid of an existing
	// grid, ConnectGrid twice, a worker call before ConnectGrid).
	ErrGridState = errors.New("worker/remote: grid not in the state the call needs")
	// ErrNodeFull: OpenGrid would exceed the node's page bound
	// (ServerConfig.MaxPages).
	ErrNodeFull = errors.New("worker/remote: node page capacity exceeded")
	// errBadReply: a node's reply does not decode.
	errBadReply = errors.New("worker/remote: malformed reply")
)

// errorDomain is the ErrorInfo domain of the reasons below.
const errorDomain = "questrt.worker"

// reasons maps sentinels to ErrorInfo reasons and gRPC codes. The first
// entry an error wraps (in this order) decides its code; every entry it
// wraps travels as a reason (an error that wraps none travels with the
// reason UNSPECIFIED). codes.Unknown: no code of its own.
var reasons = []struct {
	reason string
	err    error
	code   codes.Code
}{
	{"BAD_MESSAGE", worker.ErrBadMessage, codes.InvalidArgument},
	{"NOT_HOSTED", worker.ErrNotHosted, codes.InvalidArgument},
	{"UNKNOWN_SEQUENCE", worker.ErrUnknownSequence, codes.NotFound},
	{"UNKNOWN_GRID", ErrUnknownGrid, codes.NotFound},
	{"UNKNOWN_BENCH", ErrUnknownBench, codes.NotFound},
	{"STEP", worker.ErrStep, codes.FailedPrecondition},
	{"STEP_OPEN", worker.ErrStepOpen, codes.FailedPrecondition},
	{"WRONG_VIEW", ErrWrongView, codes.FailedPrecondition},
	{"GRID_STATE", ErrGridState, codes.FailedPrecondition},
	{"POOL_EXHAUSTED", pagestore.ErrPoolExhausted, codes.ResourceExhausted},
	{"NODE_FULL", ErrNodeFull, codes.ResourceExhausted},
	{"TOO_MANY_SEQUENCES", worker.ErrTooManySequences, codes.ResourceExhausted},
	{"MEMORY", memlimit.ErrTooLarge, codes.ResourceExhausted},
	{"PEER_CLOSED", collective.ErrPeerClosed, codes.Unavailable},
	{"ABORTED", collective.ErrAborted, codes.Unavailable},
	{"TRANSPORT_CLOSED", collective.ErrClosed, codes.Unavailable},
	{"CLOSED", worker.ErrClosed, codes.Unavailable},
	{"UNAVAILABLE", ErrUnavailable, codes.Unavailable},
	{"DEADLINE_EXCEEDED", context.DeadlineExceeded, codes.DeadlineExceeded},
	{"CANCELED", context.Canceled, codes.Canceled},
	// A sequence whose recovered page failed its check at first use
	// (pagestore.VerifyOnRead): released on the node.
	{"DAMAGED", pagestore.ErrDamaged, codes.DataLoss},
	// After every code a lost or closed peer decides (a node lost stays
	// lost when its error also says the disk is full).
	{"DISK_FULL", pagestore.ErrDiskFull, codes.ResourceExhausted},
	{"PERSIST_IO", pagestore.ErrIO, codes.Unknown},
	{"PERSIST", pagestore.ErrPersist, codes.Unknown},
	{"CHANGED", worker.ErrChanged, codes.Unknown},
}

// ToStatus is the gRPC status of a worker error: its code (INVALID_ARGUMENT
// for a bad message or a rank not hosted, NOT_FOUND for an unknown
// sequence or grid, FAILED_PRECONDITION for a step out of order, an open
// step, a wrong view or grid state, RESOURCE_EXHAUSTED for a full pool,
// node or memory and for too many sequences, UNAVAILABLE for lost or
// aborted collective peers and closed workers or transports,
// DEADLINE_EXCEEDED, CANCELED, DATA_LOSS for a sequence damaged at its
// first use (pagestore.ErrDamaged), else
// INTERNAL), its message, and one errdetails.ErrorInfo (domain
// "questrt.worker") per sentinel it wraps, so that [FromStatus] rebuilds
// an error that errors.Is every one of them (worker.ErrChanged together
// with pagestore.ErrPoolExhausted, say). A nil error is OK.
func ToStatus(err error) *status.Status {
	if err == nil {
		return status.New(codes.OK, "")
	}
	code := codes.Unknown
	var infos []*errdetails.ErrorInfo
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			if code == codes.Unknown {
				code = r.code
			}
			infos = append(infos, &errdetails.ErrorInfo{Reason: r.reason, Domain: errorDomain})
		}
	}
	if code == codes.Unknown {
		code = codes.Internal
		if st, ok := status.FromError(err); ok && st.Code() != codes.OK && st.Code() != codes.Unknown {
			code = st.Code() // a status from below (a transport's)
		}
	}
	if len(infos) == 0 {
		// Marks the status as the node's answer (see fromNode).
		infos = append(infos, &errdetails.ErrorInfo{Reason: "UNSPECIFIED", Domain: errorDomain})
	}
	st := status.New(code, err.Error())
	for _, info := range infos {
		if with, err := st.WithDetails(info); err == nil {
			st = with
		}
	}
	return st
}

// peerError marks an error of connecting a grid's or a bench's ranks to
// their peers: its message names the peers' addresses (the caller's
// membership view, and what this node's dials answered), which belong in
// the node's log, not in an answer (Server.redactPeers).
type peerError struct{ err error }

func (e *peerError) Error() string { return e.err.Error() }
func (e *peerError) Unwrap() error { return e.err }

// redacted is an error whose message is msg alone and that wraps err, so
// that errors.Is (and ToStatus's code and reasons) still see err's
// sentinels while its text is not told.
type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// redactPeers returns err unchanged unless it wraps a peerError; then it
// logs err whole under a new request id and returns an error saying
// what failed and that id, wrapping err's sentinels without its text:
// the remote caller learns the code and where to look, not the peers'
// addresses or the network's answers.
func (s *Server) redactPeers(what string, err error) error {
	var pe *peerError
	if !errors.As(err, &pe) {
		return err
	}
	id := requestID()
	s.log.Warn("worker server: "+what+": connecting to the peers failed", "request", id, "err", err)
	return &redacted{msg: fmt.Sprintf("%s: connecting the ranks to their peers failed (request %s; the node's log has the peers and the cause)", what, id), err: err}
}

// requestID is 16 random hex digits naming one failed call in the
// node's log and in its answer.
func requestID() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// statusErr is ToStatus(err).Err(), nil for nil.
func statusErr(err error) error {
	if err == nil {
		return nil
	}
	return ToStatus(err).Err()
}

// FromStatus rebuilds the error of a failed call from the status a node
// answered (or that gRPC made up: a connection failure, the caller's
// deadline): the error wraps every sentinel the status's ErrorInfo
// details name, ErrUnavailable for UNAVAILABLE, and context.DeadlineExceeded
// or context.Canceled for those codes; errors.Is sees them all. An error
// that is no status at all (from a custom connection) is a connection
// failure and wraps ErrUnavailable, unless it is the context's.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if st.Code() == codes.OK {
		return nil
	}
	e := &Error{st: st}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != errorDomain {
			continue
		}
		for _, r := range reasons {
			if r.reason == info.GetReason() {
				e.errs = append(e.errs, r.err)
			}
		}
	}
	var byCode error
	switch st.Code() {
	case codes.Unavailable:
		byCode = ErrUnavailable
	case codes.DeadlineExceeded:
		byCode = context.DeadlineExceeded
	case codes.Canceled:
		byCode = context.Canceled
	}
	if byCode != nil && !errors.Is(e, byCode) {
		e.errs = append(e.errs, byCode)
	}
	return e
}

// Error is an error a node answered, rebuilt by [FromStatus]: it wraps the
// sentinels the status named and keeps the status itself (status.FromError
// and status.Code see it).
type Error struct {
	st   *status.Status
	errs []error
}

// Error returns "remote worker: CODE: the node's message".
func (e *Error) Error() string {
	return fmt.Sprintf("remote worker: %v: %s", e.st.Code(), e.st.Message())
}

// Unwrap returns the sentinels the status carried.
func (e *Error) Unwrap() []error { return e.errs }

// GRPCStatus returns the status the node answered.
func (e *Error) GRPCStatus() *status.Status { return e.st }

// fromNode reports whether err is a status a node answered (it carries
// this package's ErrorInfo), not one gRPC made up on the client's side
// (a connection failure, the caller's deadline or cancellation), after
// which the call's outcome on the node is unknown.
func fromNode(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return true
		}
	}
	return false
}
