// Package shard owns one shard of a decode runtime: one device's slice of
// the KV cache (a TP rank's KV heads x a CP rank's pages), its page store,
// and the local steps of a decode step: scoring its pages, choosing pages
// with the selection policy, and attending over them to produce partial
// states (o, lse).
//
// The selection policy (Policy, Plan) is the one place where token budgets
// become page counts: page budget K = B / S, forced sink and local pages
// (the tail page is local and never ranked), dense layers, per-layer budget
// overrides, the GQA mode and the selector (quest, oracle, recent, dense).
// When K >= P a step is exactly dense.
//
// Offload (Config.Store.DeviceBudget > 0, CPU pools only): the shard's
// store keeps at most that many pages' K/V in its pool arrays and the rest
// in a tier, with every summary resident. A step scores and selects as
// always, then its attention brings the selected and forced pages in
// (hits stay; misses evict unpinned pages the step does not need),
// readdresses the batch by device slot and attends over the unchanged
// lists: the outputs are bit-identical to a shard holding every page. A
// step whose pages do not fit attends in passes merged by their partial
// states. See [OffloadStats].
//
// Prefetch (Config.PrefetchPages > 0, with offload): after its recall a
// single-pass step ranks the PrefetchPages pages below each row's
// selection (or, with PrefetchCrossLayer, the pages layer l+1 would
// select for this step's queries), reserves device slots for those not
// resident (free slots, or clean unpinned pages that no step of this or
// the previous token attended) and hands them to the shard's prefetcher
// goroutine, which reads them from the tier while the step attends; the
// next step finds them resident. Prefetch changes residency only, never
// what a step selects or computes.
//
// One step program (Program, run by Run after Begin) drives a layer's
// phases on a shard: fused step, ranking, selection, top-p, attention
// with its recall, merge. Step runs it for a shard alone; the worker runs
// it for each rank of a CP x TP grid with the rank's Group.
//
// A shard never talks to other shards; exchanges between CP ranks belong to
// package collective, which the program reaches only through the Group its
// caller passes.
package shard
