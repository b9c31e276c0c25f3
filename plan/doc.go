// Package plan is the pure core of a questrt decode step: the selection
// policy (budgets to page counts, forced pages, dense layers), the
// placement of a sequence's pages over CP ranks (a pure function of the
// layout: page -> rank and local index, no page maps), the global top-K
// rule that merges CP ranks' candidates, and the per-rank page plan that
// tells one shard which of its local pages are forced and which are
// candidates.
//
// It does no I/O and touches no device, socket or file: every function
// is deterministic in its arguments, so the planning of a step can be
// driven from a transcript and replayed exactly (testdata/, run with
// `go test ./plan/ -rewrite` to regenerate the expected output and review
// the diff). Every layer of the runtime may import it; it imports none of
// them.
package plan
