package worker

import (
	"fmt"
	"time"

	"github.com/questrt/questrt/plan"
)

// The messages of the [Worker] interface are plain data: ids, ints,
// float32 slices and plan types, nothing a network could not carry. Token
// tensors are row-major float32: [tokens][heads][HeadDim].

// Rank names one shard of the CP x TP grid: its TP group and its CP rank
// inside the group.
type Rank struct{ TP, CP int }

// String returns "(tp T, cp C)".
func (r Rank) String() string { return fmt.Sprintf("(tp %d, cp %d)", r.TP, r.CP) }

// CreateRequest starts an empty sequence on every hosted rank.
type CreateRequest struct {
	// Seq is the coordinator's id of the sequence; it must be new to the
	// worker.
	Seq uint64
	// Layout places the sequence's pages over the CP ranks and its heads
	// over the TP ranks; its CP and TP must be the worker's.
	Layout plan.Layout
}

// ForkRequest makes Child share every page of Parent on every hosted rank
// (copy-on-write tails; the summary mirrors are copied).
type ForkRequest struct {
	Parent, Child uint64
}

// ReleaseRequest frees a sequence on every hosted rank.
type ReleaseRequest struct {
	Seq uint64
}

// CheckRequest asks, changing nothing, whether an append or a rollback of
// the whole sequence would succeed on every hosted rank: each rank checks
// its own share (the tokens of the range whose pages it owns) for range,
// lengths and capacity (new pages and copy-on-write copies). Exactly one
// of Append and Drop is positive. A coordinator checks every worker
// before it changes any, so that a multi-rank append or rollback is all
// or nothing.
type CheckRequest struct {
	Seq uint64
	// Layer is the layer of an append (ignored for a rollback).
	Layer int
	// Len is the sequence's length before the operation: in Layer for an
	// append, in every layer for a rollback.
	Len int
	// Append is the number of tokens an append adds at position Len.
	Append int
	// Drop is the number of tokens a rollback removes from every layer.
	Drop int
}

// AppendRequest appends tokens [Start, Start+Tokens) of one layer to one
// rank: the keys and values of the tokens whose pages the rank owns, for
// its TP group's KV heads, and, under replicated selection, the keys of
// every token of the range for the rank's summary mirror.
type AppendRequest struct {
	Seq  uint64
	Rank Rank
	// Layer is the layer appended to.
	Layer int
	// Start is the sequence's length in Layer before the append; Tokens
	// the number of tokens of the whole append (every rank's).
	Start, Tokens int
	// K and V are the tokens of the range the rank owns, in position
	// order: [n][KVHeads/TP][HeadDim] (n may be 0).
	K, V []float32
	// MirrorK holds the keys of all Tokens tokens,
	// [Tokens][KVHeads/TP][HeadDim], under replicated selection; nil
	// otherwise.
	MirrorK []float32
}

// RollbackRequest drops the last Drop tokens of every layer on one rank:
// its store drops those of its pages, its summary mirror (replicated
// selection) is truncated to the new length. When the new length cuts a
// page in the middle, the page's owner rescans its summaries; the other
// CP ranks' mirrors need the owner's records of that page, so a
// coordinator rolls back the owner first and hands its reply's Tail to
// the others.
//
// With Lens set (one global length per layer; Len, Drop and Tail zero),
// it is a per-layer rollback instead: every layer of the rank is cut to
// its share of its own length (pagestore.Store.Truncate), layers that
// hold no more than that unchanged, so that layers may be cut by
// different amounts or not at all. A coordinator reconciling a
// sequence recovered after a crash inside a step uses it. It is refused
// (ErrBadMessage) under replicated selection, whose mirrors are not
// persisted, and when a layer holds less than its share of Lens;
// refused, it changes nothing.
type RollbackRequest struct {
	Seq  uint64
	Rank Rank
	// Len is the sequence's length (every layer) before the rollback.
	Len int
	// Drop is the number of tokens to drop, 1..Len.
	Drop int
	// Tail holds, per layer, the owner's summary records of the cut page
	// ([KVHeads/TP][2][HeadDim]): required by a non-owner rank under
	// replicated selection when (Len-Drop) % PageSize != 0, nil otherwise.
	Tail [][]float32
	// Lens, when not nil, are the global lengths per layer of a
	// per-layer rollback (see above).
	Lens []int
}

// RollbackReply is the answer of the rank that owns the page a rollback
// cut, under replicated selection: Tail is that page's summary records
// per layer after the rescan, for the other ranks' mirrors. Empty
// otherwise.
type RollbackReply struct {
	Tail [][]float32
}

// BeginRequest opens a decode step and carries its plan once: which
// sequences, their lengths, budgets and the step's options. Each rank
// derives every layer's page plans from it (plan.Policy.Plan with the
// worker's policy) and the placement from each sequence's layout, so the
// Layer calls carry only the tensors.
type BeginRequest struct {
	// Step is the step's id; it must exceed the id of every step the
	// worker began before (the collective tags of a step derive from it).
	Step uint64
	// Layer is the first layer the step runs; its Layer calls come for
	// Layer and then higher layers, in increasing order, each at most
	// once.
	Layer int
	// Seqs are the step's sequences in batch order (no duplicates).
	Seqs []StepSeq
	// Phased keeps score, top-K and attention separate backend calls
	// (see shard.Program); Diagnostics implies it and makes Layer
	// return the selection and page scores; ForceDense attends every
	// page.
	Phased, Diagnostics, ForceDense bool
}

// StepSeq is one sequence of a step.
type StepSeq struct {
	Seq uint64
	// Len is the sequence's length in every layer the step runs, before
	// the step's new token.
	Len int
	// New says that every Layer call of the step brings one new token of
	// the sequence, appended at position Len before attention (so the
	// token attends to itself).
	New bool
	// Budget is the token budget (0: the policy's); else at least one
	// page.
	Budget int
	// DenseLayers makes the layers below it attend every page of this
	// sequence, besides the policy's dense layers (0: the policy alone
	// decides); at most the model's layers.
	DenseLayers int
}

// LayerRequest runs one layer of the open step on every hosted rank.
type LayerRequest struct {
	Step  uint64
	Layer int
	// Ranks has one entry per hosted rank, each exactly once.
	Ranks []RankInput
}

// RankInput is one rank's part of a layer.
type RankInput struct {
	Rank Rank
	// Q holds the rank's TP group's query heads of every sequence of the
	// step, in batch order: [seqs][QHeads/TP][HeadDim].
	Q []float32
	// K and V are the new tokens the rank stores: those of the step's New
	// sequences whose position Len falls on a page the rank owns, in
	// batch order, [n][KVHeads/TP][HeadDim].
	K, V []float32
	// MirrorK holds the keys of every New sequence's token, in batch
	// order, under replicated selection (the rank's mirror widens with
	// them); nil otherwise.
	MirrorK []float32
}

// LayerReply is a worker's answer to a LayerRequest, one entry per
// RankInput in request order. Layer fills the reply it is given, reusing
// its slices; they belong to the caller afterwards.
type LayerReply struct {
	Ranks []RankOutput
}

// RankOutput is one rank's answer.
type RankOutput struct {
	Rank Rank
	// Appended is the number of the new tokens routed to the rank (K, or
	// MirrorK under replicated selection) that it took, in batch order;
	// it is valid also when Layer returns an error, so a coordinator can
	// tell which sequences got their token.
	Appended int
	// O and LSE are the partial states of the step's sequences merged over
	// the TP group, [seqs][QHeads/TP][HeadDim] and [seqs][QHeads/TP]: set
	// at CP rank 0 only, and only on success.
	O, LSE []float32
	// Time is the wall time of the rank's phases.
	Time Times
	// Diag is set when the step asked for diagnostics.
	Diag RankDiag
}

// RankDiag is the plain data an engine's diagnostics need from one rank.
type RankDiag struct {
	// Rows is the number of selection rows per sequence (KV heads of the
	// rank for group_max, query heads for per_head).
	Rows int
	// Indptr and Pages list, per (sequence, row) in CSR form, the global
	// pages the rank's selection ranked (forced pages excluded): the
	// global top-K for exact and replicated selection, the rank's own
	// picks for union; a row's pages come in no particular order.
	Indptr, Pages []int32
	// Scores holds per sequence the selector's score of every page the
	// rank holds, [Rows][local pages] (local page l is global page
	// Layout.Place(cp).Global(l)); nil when the rank scored nothing.
	Scores [][]float32
}

// Times are the wall times of one rank's phases of a layer.
type Times struct {
	Score, TopK, Select, Attend, Merge time.Duration
	// Fused is the time of a local step fused into one backend call
	// (Score, TopK and Attend are then zero).
	Fused time.Duration
	// Reused counts the step's sequences whose selection the layer
	// reused (plan.Policy.ReuseSteps, ReuseLayers); RankSkipped says that none
	// ranked: the rank ran no score phase (but for diagnostics) and no
	// selection exchange.
	Reused      int
	RankSkipped bool
}

// EndRequest closes the open step. Failed says that the step failed
// somewhere (on this worker or another): the worker then forgets the
// collective tags of every layer it ran and of every layer in Layers, on
// its ranks' transports, so that messages nobody will receive (a peer's
// data or aborts, sent before it learned of the failure) do not pile up.
// A coordinator sends it once every Layer call of the step returned.
type EndRequest struct {
	Step   uint64
	Failed bool
	// Layers lists the layers the coordinator sent Layer calls for (to
	// any worker): a worker whose own call never came, or was refused
	// early, may still hold its peers' messages of those layers.
	Layers []int
}

// KeysRequest reads back the keys of local pages [From, From+Count) of a
// sequence on one rank, for diagnostics (recall and attention mass need
// every token's score): never on the decode path.
type KeysRequest struct {
	Seq  uint64
	Rank Rank
	// Layer is the layer read.
	Layer int
	// From and Count are the rank's local pages of the sequence (local
	// page l is global page Layout.Place(cp).Global(l)).
	From, Count int
}

// KeysReply holds the pages' keys, [Count][KVHeads/TP][PageSize][HeadDim]
// (slots past a page's valid length hold unspecified data). Keys fills
// the reply it is given, reusing its slice.
type KeysReply struct {
	K []float32
}
