// Package remote is the gRPC side of the worker API (api/worker/v1): a
// node's [Server], which hosts the ranks of any number of grids, and the
// coordinator's [Client], a worker.Worker for the ranks one node hosts of
// one grid, so that an engine opened with engine.Open drives remote nodes
// exactly as it drives in-process workers.
//
// # Grids
//
// A grid is one CP x TP layout of ranks under one membership view, spread
// over nodes. [OpenGrid] opens it in two phases: OpenGrid on every node
// (the node checks the config against its page and memory bounds and
// listens on one ephemeral port of ServerConfig.Host per hosted rank),
// then ConnectGrid on every node at once with every rank's address (each
// node connects its ranks' grpctransport members to the other ranks of
// their TP group, all its ranks concurrently, then builds a worker.Local
// over them). Every later call names the grid and its view: an unknown
// grid answers NOT_FOUND, another view FAILED_PRECONDITION. A grid that
// got no ConnectGrid within ServerConfig.ConnectTimeout is freed by the
// next call that notices; [CloseGrid] frees a grid (closing a grid a node
// does not hold is OK).
//
// # Persistence
//
// With ServerConfig.DataDir set, every grid's worker persists in a
// directory derived from the grid's coordinator name and shape (not
// from its id, which changes with every coordinator process), so the
// grid the same coordinator opens after a restart, of this node or of
// the coordinator, recovers the sequences: ConnectGrid logs the
// recovery, answers the parked sequences (ConnectGridReply.recovered;
// [Client.Recovered]) and counts them in [Stats]; the coordinator makes
// each live again with Claim ([Client.Claim]) or frees it with
// DropRecovered. A server holds its directory's lock (ErrDataDirInUse
// for a second one, in any process).
//
// # Messages
//
// Package worker's messages map field by field onto workerv1's. Tensors
// travel as little-endian bytes with dtype and shape: token tensors as
// [tokens][heads][HeadDim], query heads as [seqs][heads][HeadDim]. The
// node decodes every request against the grid's geometry before its
// worker sees it, and refuses with INVALID_ARGUMENT, naming the field,
// a wrong dtype, a shape that does not hold its data or does not fit
// the geometry ("layer request: ranks[1].q: shape [2 4 32], want [2 4
// 64]"); the worker then checks the rest (counts, lengths, finite
// values) as in process. A nil slice stays nil across the wire and an
// empty one empty, where the worker tells them apart (the mirror keys);
// a RollbackRequest's Tail, nil or empty, arrives nil.
//
// # Errors
//
// [ToStatus] maps a worker error to a gRPC status (INVALID_ARGUMENT,
// NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, UNAVAILABLE,
// DEADLINE_EXCEEDED, CANCELED, INTERNAL) with one errdetails.ErrorInfo
// per sentinel the error wraps (domain "questrt.worker"); [FromStatus]
// rebuilds an error that errors.Is the same sentinels (worker.ErrChanged
// above all: the engine treats a sequence as broken on it), plus
// [ErrUnavailable] for UNAVAILABLE and connection failures. A Layer call
// that fails after the node's worker accepted it answers OK with the
// ranks' outputs (their Appended counts) and error_code and error_message
// set; the status with its details travels in the trailer
// "questrt-layer-status-bin", from which the client rebuilds the error.
//
// # Who may call
//
// Over TLS, a caller whose certificate names a node (questrt://node/NAME)
// may call the grid methods only on grids whose id starts with NAME, the
// ids its own coordinator gives (Kubernetes' node authorizer): other
// calls, OpenGrid in another coordinator's name included, are refused
// PERMISSION_DENIED naming the method only. Calls in process (LocalConn),
// over plaintext or with a certificate without a role are not checked
// here (authz.go); the node's interceptors decide which roles reach the
// server at all. The collective benchmark's methods (OpenBench, RunBench,
// CloseBench) are checked the same way by the bench's id, which starts
// with the name of the coordinator that runs it ([BenchID]): a node may
// open, run and close only its own benches, a client certificate none
// (a client runs the benchmark through a coordinator, the client API's
// BenchCollective).
//
// # Sizes
//
// A request's counts are checked against the grid before its entries are
// decoded, so that a huge but well-formed request is refused without the
// node allocating for it: a BeginStep batch larger than the grid's live
// sequences on the node (worker.Local.CheckBatch: NOT_FOUND for an
// unknown sequence, else INVALID_ARGUMENT), a Layer request with other
// than one input per hosted rank, a Rollback with more tail records or
// lengths than layers (INVALID_ARGUMENT); tensor shapes are checked
// against their data and the grid's geometry before they are copied.
// Before that, what decoding the message itself allocates is bounded by
// its count of repeated elements (MaxRequestElements: 2 per page of
// ServerConfig.MaxPages, at least 65,536; wire.CheckCounts walks the
// encoding without decoding it): a Call of a Calls stream past it is
// answered RESOURCE_EXHAUSTED, and node's gRPC server refuses a
// request of its own so with a codec of its own. A grid holds at most
// worker.Config.MaxSequences sequences (CP x Capacity, at least 1024);
// a Create or Fork past it is answered RESOURCE_EXHAUSTED.
//
// A Layer request carries a step's query heads and new tokens for every
// rank a node hosts: set grpc.MaxRecvMsgSize on the node's grpc.Server
// and grpc.MaxCallRecvMsgSize/MaxCallSendMsgSize on the coordinator's
// connections when a batch exceeds gRPC's 4 MiB default.
package remote
