// Package collective owns the group operations among the CP ranks of one TP
// group: the exchange that turns each rank's local page candidates into one
// global top-K, identical on every rank, and the merge of the ranks' partial
// attention states (o, lse) at the coordinator or on every rank. It knows
// nothing of pages beyond (score, global page index) pairs and partial
// states; merging uses kernels.MergeStates.
//
// # Transports
//
// Operations run over a Transport, a small interface that moves byte
// messages between the ranks of a group, matched by (sender, tag) and
// buffered at the receiver until asked for. NewInprocGroup is the
// in-process implementation (every test, single-process deployments); a
// planned gRPC implementation with one long-lived bidirectional stream per
// peer would fit the same interface. Faulty wraps any transport to inject failures,
// delays and hangs in tests. Payloads are raw little-endian bytes (see
// wire.go), never JSON or gob.
//
// # Selection modes
//
// Selection across CP ranks has three modes (docs/architecture.md
// section 6):
//
//   - exact (default): each rank proposes its local top-K candidates per
//     row; Group.SelectExact all-gathers them and every rank derives the
//     same global top-K (score descending, ties to the lower page index),
//     each row's pages ascending; Group.SelectExactUnordered derives the
//     same sets without ordering them (the worker's, whose attention takes
//     a row as a set). Candidates handed over best first (the CPU
//     backend's top-K with kernels.TopKPlan.BestFirst) are not sorted again.
//   - union (opt-in, approximate): each rank keeps its local top
//     plan.UnionQuota(K, N) = ceil(K/N) pages with no exchange at all; lower
//     latency, but a page of the true top-K is missed whenever one rank
//     holds more than its quota of them.
//   - replicated: every rank holds all summaries and computes the global
//     top-K alone; no selection collective is needed (N times the scoring
//     work).
//
// # Deadlines and failures
//
// Every operation takes a context and is bounded by it. An operation
// returns an error and never a partial result. A member that fails (a
// transport error, bad input, a malformed message from a peer, its own ctx
// ending) sends an abort under the operation's tag to the peers that may
// still wait for it, so they fail promptly with ErrAborted rather than at
// their deadline; a closed peer is seen as ErrPeerClosed at once; a hung
// peer is seen at the deadline. Errors that concern one peer are
// *RankError values naming it. Tags (MakeTag) give every operation of
// every layer and step its own mailbox, so rounds may overlap across
// ranks; a tag is never reused after a failure.
package collective
