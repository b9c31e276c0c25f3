package worker

import "context"

// Worker is the coordinator's view of one node: the shards it hosts and
// the per-rank step program it runs next to them. Every message is plain
// data (see the message types); nothing in a request or reply points into
// a shard, so an implementation may sit across a network.
//
// Threading contract:
//   - All methods are safe for concurrent use. A worker serializes its
//     calls (Local holds one mutex for each whole call, a Layer call
//     included), so a call waits for the one in progress.
//   - A worker does not retain the slices of a request after the call
//     returns. A reply belongs to the caller; Layer fills the one it is
//     given, reusing its buffers.
//   - One coordinator drives a sequence and sends its operations in
//     order. Multi-rank changes are all or nothing only with the
//     coordinator's help: it sends Check to every worker before it sends
//     any Append or Rollback, and treats a sequence as broken when one
//     rank changed and another failed, or when an error wraps ErrChanged.
//   - A step is BeginStep, Layer calls for increasing layers, then
//     EndStep. Between BeginStep and EndStep the step's sequences refuse
//     changes (ErrStepOpen); EndStep is sent even after a failure.
//   - The ranks of a CP group exchange candidates and partial states with
//     each other through their collective transports during Layer, ranks
//     on other workers included. The coordinator therefore calls Layer on
//     every worker of a step concurrently, with the same (Step, Layer);
//     each call returns when its ranks have finished, or one of them
//     failed (it tells its peers through the transports, which fail
//     promptly), or ctx ends (the only way a blocked peer is noticed). A
//     Layer call that fails, or is refused after its Step and Layer were
//     accepted, fails the step: the coordinator ends it with Failed and
//     begins a new one.
//   - Every method honours ctx; Layer is the only one that waits on other
//     workers.
//   - Errors wrap the package's sentinels: a refused message (ErrBadMessage,
//     ErrUnknownSequence, ErrNotHosted, ErrStep, ErrStepOpen) changed
//     nothing; store errors such as pagestore.ErrPoolExhausted come
//     through wrapped.
type Worker interface {
	// Create starts an empty sequence on every hosted rank.
	Create(ctx context.Context, m CreateRequest) error
	// Fork makes a child sequence sharing the parent's pages on every
	// hosted rank; on failure the worker undoes its own forks.
	Fork(ctx context.Context, m ForkRequest) error
	// Release frees a sequence on every hosted rank; the worker forgets
	// it even when a rank reports an error.
	Release(ctx context.Context, m ReleaseRequest) error
	// Check reports, changing nothing, whether an append or a rollback
	// would succeed on every hosted rank.
	Check(ctx context.Context, m CheckRequest) error
	// Append appends one rank's share of a layer's tokens.
	Append(ctx context.Context, m AppendRequest) error
	// Rollback drops the last tokens of a sequence on one rank (see
	// RollbackRequest for the mirrors of replicated selection).
	Rollback(ctx context.Context, m RollbackRequest) (RollbackReply, error)
	// BeginStep opens a decode step: it validates the sequences, their
	// lengths and budgets on every hosted rank and checks the capacity
	// the step's new tokens need (pagestore.ErrPoolExhausted), changing
	// nothing.
	BeginStep(ctx context.Context, m BeginRequest) error
	// Layer runs one layer of the open step on every hosted rank:
	// appends the new tokens, then scores, selects, attends and merges.
	// The merged partial states come back at CP rank 0 of each TP group.
	Layer(ctx context.Context, m LayerRequest, rep *LayerReply) error
	// EndStep closes the open step (see EndRequest).
	EndStep(ctx context.Context, m EndRequest) error
	// Keys reads back keys of a sequence's pages on one rank (see
	// KeysRequest); refused while a step is open.
	Keys(ctx context.Context, m KeysRequest, rep *KeysReply) error
}

// AheadWorker is a Worker across a network whose BeginStep can go out
// ahead of the step's first Layer without a round trip in between: the
// coordinator sends both and learns BeginStep's answer with the layer's
// (one round trip per step less). Its calls are answered in the order
// they were made, so a Layer that follows a refused BeginStep finds no
// step open and is refused too, changing nothing.
type AheadWorker interface {
	Worker
	// BeginsAhead reports whether BeginStepAhead returns before the
	// answer (false for a worker in process, whose calls are direct);
	// it does not change over the worker's life.
	BeginsAhead() bool
	// BeginStepAhead sends m as BeginStep does and returns at once; wait
	// returns BeginStep's error once its answer came (a failure to send
	// too). The worker's next calls (the step's first Layer, or EndStep)
	// may be made before wait; wait must be called before the step's
	// EndStep returns or after it, never skipped while ctx lives, and
	// ctx bounds the call until then.
	BeginStepAhead(ctx context.Context, m BeginRequest) (wait func(context.Context) error)
}
