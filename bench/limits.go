package bench

import (
	"fmt"

	"github.com/questrt/questrt/internal/memlimit"
)

// Ranges of the benchmarks' numeric settings. Validate methods refuse
// anything outside them with the flag's name, before anything is
// allocated; sizes inside them can still be refused by the memory
// preflight.
const (
	MaxContext  = 1 << 30   // tokens of one sequence
	MaxBatch    = 4096      // sequences per step
	MaxPageSize = 4096      // tokens per page S
	MaxHeads    = 1024      // query or KV heads
	MaxHeadDim  = 4096      // head dimension D
	MaxIters    = 1_000_000 // timed steps per configuration
	MaxCP       = 1024      // CP degree
	maxPages    = 1<<31 - 1 // physical pages of one pool (int32 page ids)
)

// inRange returns an error naming flag when v is outside [lo, hi].
func inRange(flag string, v, lo, hi int, unit string) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s %d: want %d..%d%s", flag, v, lo, hi, unit)
	}
	return nil
}

// checkLimit validates a memory limit setting (--max-memory).
func checkLimit(limit int64) error {
	if limit < memlimit.NoLimit {
		return fmt.Errorf("--max-memory %d: want a byte count, 0 (the memory available now) or -1 (no check)", limit)
	}
	return nil
}

// checkShape validates the head geometry shared by both benchmarks.
func checkShape(pageSize, qHeads, kvHeads, headDim int) error {
	for _, f := range []struct {
		flag    string
		v, hi   int
		unitDoc string
	}{
		{"--page-size", pageSize, MaxPageSize, " tokens"},
		{"--q-heads", qHeads, MaxHeads, ""},
		{"--kv-heads", kvHeads, MaxHeads, ""},
		{"--head-dim", headDim, MaxHeadDim, ""},
	} {
		if err := inRange(f.flag, f.v, 1, f.hi, f.unitDoc); err != nil {
			return err
		}
	}
	if qHeads%kvHeads != 0 {
		return fmt.Errorf("--q-heads %d is not a multiple of --kv-heads %d", qHeads, kvHeads)
	}
	return nil
}

// checkBudget validates a token budget against the page size: at least one
// page, at most MaxContext (a budget above the context is allowed).
func checkBudget(budget, pageSize int) error {
	if budget < pageSize || budget > MaxContext {
		return fmt.Errorf("--budget %d: want --page-size (%d)..%d tokens", budget, pageSize, MaxContext)
	}
	return nil
}

// pagesOf is ceil(tokens / pageSize).
func pagesOf(tokens, pageSize int) int { return (tokens + pageSize - 1) / pageSize }
