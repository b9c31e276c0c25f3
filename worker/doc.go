// Package worker is the node side of the coordinator/worker boundary: a
// worker hosts the shards of one node (one (tp, cp) rank each: a
// shard.Shard with its collective group member and, for replicated
// selection, its summary mirror) and runs the per-rank step program next
// to their data: score the rank's pages, propose local candidates, agree
// on the global top-K with the other CP ranks through package collective,
// attend over the selected and forced pages, and merge the partial states
// at CP rank 0 of every TP group.
//
// A coordinator drives workers only through the [Worker] interface, whose
// messages are plain data (ids, ints, float32 slices and plan types: what
// a network can carry): sequence operations (create with the sequence's
// plan.Layout, check, append of the tokens a rank owns, fork, rollback,
// release), one BeginStep per decode step carrying the step's plan once
// (sequences, lengths, budgets, options), one Layer call per layer with
// the ranks' query heads and the new tokens' keys and values, returning
// the merged partial states, and EndStep. Page placement is a pure
// function of the layout (plan.Place), so no page map crosses the
// boundary; a worker derives each layer's page plans from the policy it
// was configured with, the lengths and the budgets.
//
// [Local] is the in-process implementation; the collective exchange
// between ranks runs over whatever collective.Transport each rank is
// given (in-process by default), so ranks hosted by different workers
// talk to each other directly, never through the coordinator.
//
// # Persistence
//
// With Config.DataDir set, each hosted rank's page store persists in a
// subdirectory of its own ([RankDir]; pagestore.Config.DataDir: sealed
// pages when they seal, everything at a graceful Close) and the worker
// keeps its sequence table (each sequence's id, layout and store ids)
// in a bbolt file beside them. A NewLocal on the same directory
// recovers the sequences: every one whose store sequences came back on
// all hosted ranks is rolled back to the longest length those ranks
// agree on (a crash leaves each rank with its own sealed pages) and
// parked; [Local.Recovery] reports them (lengths per layer, tokens lost
// since the last append, damaged entries, orphans), [Local.Claim] makes
// one live again under a coordinator id, [Local.DropRecovered] frees
// it. Parked sequences are not reachable by messages, so a coordinator
// that does not know them yet can create sequences with the same ids.
// A worker whose grid spans other workers knows only its own ranks: the
// coordinator takes the smallest recovered lengths over them.
package worker
