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
// A shard never talks to other shards; exchanges between CP ranks belong to
// package collective.
package shard
