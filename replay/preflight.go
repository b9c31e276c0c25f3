package replay

import (
	"fmt"
	"math"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// ValueLimit bounds the magnitudes a case may build from its data, so that
// every score, logit and value sum of a run stays finite in float32 (whose
// largest value is about 3.4e38). [Case.Validate] refuses a case where, for
// some query head h and its KV head g,
//
//	sum_j |query[h][j]| * max_t |keys[g][t][j]|  > ValueLimit
//
// (a bound of every dot product q.k, of every partial sum of one, and of
// the Quest page scores), or where, for some KV head g and dimension j,
//
//	sum_t |values[g][t][j]|  > ValueLimit
//
// (a bound of the attention's value accumulators). Real activations are
// tens of orders of magnitude below it.
const ValueLimit = 1e38

// checkRange refuses a case whose dot products or value sums could leave
// the float32 range (see [ValueLimit]). The case's shapes are valid.
func (c *Case) checkRange() error {
	g := c.QHeads / c.KVHeads
	kmax := make([]float64, c.HeadDim)
	vsum := make([]float64, c.HeadDim)
	for kvh := range c.KVHeads {
		clear(kmax)
		clear(vsum)
		for t, row := range c.Keys[kvh] {
			for j, x := range row {
				kmax[j] = max(kmax[j], math.Abs(float64(x)))
				vsum[j] += math.Abs(float64(c.Values[kvh][t][j]))
			}
		}
		for j, s := range vsum {
			if s > ValueLimit {
				return fmt.Errorf("replay case: values of kv head %d, dim %d sum to %.3g in magnitude over %d tokens, beyond the float32-safe limit %g (scale the values down)",
					kvh, j, s, c.Tokens(), float64(ValueLimit))
			}
		}
		for h := kvh * g; h < (kvh+1)*g; h++ {
			var dot float64
			for j, q := range c.Query[h] {
				dot += math.Abs(float64(q)) * kmax[j]
			}
			if dot > ValueLimit {
				return fmt.Errorf("replay case: query[%d] . keys of kv head %d can reach %.3g (sum over head_dim of |q_j| x max |k_j|), beyond the float32-safe limit %g (scale the query or the keys down)",
					h, kvh, dot, float64(ValueLimit))
			}
		}
	}
	return nil
}

// Check validates opt against a valid case and refuses, before anything is
// allocated, a run that would not fit opt.MemoryLimit: it adds up the page
// pools of every CP x TP shard (each CP rank sized to its share of the
// pages), the copies the diagnostics make, the dense reference, the kernel
// and collective buffers and the result with its JSON. The error is one
// line, names the case field or option that drives the largest part and
// wraps [memlimit.ErrTooLarge] when the run is too large. [Run] calls it;
// it does not read the case's values (see [Case.Validate]).
func (c *Case) Check(opt Options) error {
	if err := c.geometry().check(opt); err != nil {
		return fmt.Errorf("replay case: %w", err)
	}
	return nil
}

// geometry is the shape of a case: all that its memory depends on.
type geometry struct {
	tokens, pageSize, budget int
	qHeads, kvHeads, headDim int
}

func (c *Case) geometry() geometry {
	return geometry{c.Tokens(), c.PageSize, c.BudgetTokens, c.QHeads, c.KVHeads, c.HeadDim}
}

func (gm geometry) valid() bool {
	return gm.tokens >= 1 && gm.pageSize >= 1 && gm.budget >= gm.pageSize && gm.qHeads >= 1 && gm.kvHeads >= 1 &&
		gm.headDim >= 1 && gm.qHeads%gm.kvHeads == 0
}

func (gm geometry) pages() int { return (gm.tokens-1)/gm.pageSize + 1 }

// check is [Case.Check] for a valid geometry.
func (gm geometry) check(opt Options) error {
	if !gm.valid() {
		return fmt.Errorf("invalid geometry (%d tokens, page_size %d, budget_tokens %d, q_heads %d, kv_heads %d, head_dim %d): validate the case first",
			gm.tokens, gm.pageSize, gm.budget, gm.qHeads, gm.kvHeads, gm.headDim)
	}
	p := gm.pages()
	switch {
	case opt.CP < 0 || opt.TP < 0:
		return fmt.Errorf("cp %d and tp %d must not be negative", opt.CP, opt.TP)
	case opt.CP > p:
		return fmt.Errorf("%d CP ranks for %d pages: at most %d (every CP rank holds at least one page)", opt.CP, p, p)
	case gm.kvHeads%max(opt.TP, 1) != 0:
		return fmt.Errorf("tp %d does not divide kv_heads %d", opt.TP, gm.kvHeads)
	case opt.MemoryLimit < memlimit.NoLimit:
		return fmt.Errorf("memory limit %d: want bytes, 0 (available memory) or -1 (no check)", opt.MemoryLimit)
	case opt.Selector < plan.Quest || opt.Selector > plan.Dense:
		return fmt.Errorf("unknown selector %d", opt.Selector)
	case opt.Selection < engine.Exact || opt.Selection > engine.Replicated:
		return fmt.Errorf("unknown selection %d", opt.Selection)
	case opt.Placement != plan.Striped && opt.Placement != plan.Contiguous:
		return fmt.Errorf("unknown placement %d", opt.Placement)
	case opt.Selection == engine.Replicated && opt.Selector != plan.Quest && opt.Selector != plan.Dense:
		// At any CP, as demo and the engine refuse it (a single-shard run
		// would otherwise accept what the same options refuse sharded).
		return fmt.Errorf("replicated selection needs the quest or dense selector, not %v", opt.Selector)
	}
	parts := gm.footprint(opt)
	total, big := int64(0), parts[0]
	for _, pt := range parts {
		total = memlimit.Add(total, pt.bytes)
		if pt.cause != "" && (pt.bytes < 0 || (big.bytes >= 0 && pt.bytes > big.bytes)) {
			big = pt
		}
	}
	if err := memlimit.Check(big.what+" and the rest of the run", total, opt.MemoryLimit); err != nil {
		return fmt.Errorf("%s: %w", big.cause, err)
	}
	return nil
}

// Footprint returns the bytes [Run] may allocate for c under opt (see
// [Case.Check]), or -1 when the size overflows int64. c must be valid.
func (c *Case) Footprint(opt Options) int64 {
	gm := c.geometry()
	if !gm.valid() {
		return -1
	}
	total := int64(0)
	for _, pt := range gm.footprint(opt) {
		total = memlimit.Add(total, pt.bytes)
	}
	return total
}

// part is one share of a run's memory and what drives it.
type part struct {
	what  string // "page pools"
	cause string // the case field or option behind it; "" for fixed costs
	bytes int64  // -1: overflows
}

// runSlack covers a run's fixed allocations: the backend, engine, shard and
// store structures.
const runSlack = 1 << 20

// shardSlack covers one shard's fixed allocations and its goroutine.
const shardSlack = 64 << 10

// pairSlack covers one message between two CP ranks (the in-process
// mailbox, its map entry, the group's per-peer state).
const pairSlack = 512

// jsonPerValue bounds the bytes one number costs while the result is
// encoded: the compact and the indented text and their buffers' growth.
const jsonPerValue = 160

// footprint splits the memory of running a case of this geometry under
// opt into parts. Every size is an upper bound; -1 means it overflows.
func (gm geometry) footprint(opt Options) []part {
	mul, add := memlimit.Mul, memlimit.Add
	n, s, d := int64(gm.tokens), int64(gm.pageSize), int64(gm.headDim)
	q, kv := int64(gm.qHeads), int64(gm.kvHeads)
	g := q / kv
	p := int64(gm.pages())
	k := min(int64(gm.budget)/s, p) // pages read per row, at most all
	cp, tp := int64(max(opt.CP, 1)), int64(max(opt.TP, 1))
	sharded := cp > 1 || tp > 1
	kvT, qT := kv/tp, q/tp
	shards := cp * tp
	capacity := p // pages in each shard's pool
	if sharded {
		capacity = int64(rankCapacity(int(p), int(cp), opt.Placement, engine.DefaultConfig().BlockPages))
	}
	// Pages a rank scores and ranks: its own, or every page when it holds
	// a replica of all summaries.
	scored := capacity
	if sharded && opt.Selection == engine.Replicated {
		scored = p
	}
	slots := int64(kernels.DefaultCPUConfig().Workers + 1)
	chunk := int64(kernels.DefaultCPUConfig().AttendChunk)
	page := add(mul(2, s, d, 4), mul(2, d, 4)) // K, V and summary of one KV head

	poolCause := fmt.Sprintf("%d tokens x kv_heads %d x head_dim %d", n, kv, d)
	if s > n || capacity*shards > 2*p {
		poolCause = fmt.Sprintf("page_size %d for %d tokens", s, n)
	}
	perPool := add(mul(capacity, kvT, page), mul(capacity, 8))
	if opt.DeviceResident {
		perPool = mul(capacity, 8) // host metadata; the pages live on the device
	}
	pools := mul(shards, perPool)
	if sharded && opt.Selection == engine.Replicated {
		// Each rank mirrors the summaries of its TP group's pages (grown
		// by append: up to 3x).
		pools = add(pools, mul(3, shards, p, kvT, 2, d, 4))
	}
	// The diagnostics copy the pages they read in place elsewhere.
	copies := int64(0)
	if sharded || opt.DeviceResident {
		copies = mul(p, kv, page)
	}
	parts := []part{
		{"page pools", poolCause, add(pools, copies)},
		// Token-major copies of K and V, and the engine's routing buffers.
		{"key and value staging", fmt.Sprintf("%d tokens x kv_heads %d x head_dim %d", n, kv, d), mul(4, n, kv, d, 4)},
		// Per backend: attention logits of one page for a KV head's query
		// heads, accumulators, query weights, top-K indices; and the
		// partial states of the page chunks.
		{"kernel buffers", fmt.Sprintf("page_size %d (attention logits of %d query heads per page slot)", s, g), add(
			mul(slots, add(mul(g, s, 4), mul(g, d, 4), mul(g, 16), mul(q, 2, d, 4), mul(scored, 4))),
			mul(2, 2, qT, d+1, 4, scored/chunk+2))},
		// Per shard: scores, candidates, selections and lists of every row
		// (twice: the sparse and the dense pass), query, outputs.
		{"step buffers", fmt.Sprintf("q_heads %d x %d pages", q, p), add(
			mul(shards, add(mul(qT, scored, 4*4+8*2), mul(qT, k, 4*4), mul(qT, d+1, 4*6), scored*8, shardSlack)),
			mul(q, p, 4*5), mul(q, d+1, 4*8))},
		{"result", fmt.Sprintf("q_heads %d x %d pages", q, p), mul(add(mul(2, q, p), mul(q, d+1), 64), jsonPerValue)},
		{"fixed structures", "", runSlack},
	}
	if cp > 1 {
		// Every rank sends its candidates to every other (copied), and
		// each receiver decodes all of them; non-roots send their partial
		// states to the root, for the sparse and the dense pass.
		var sel int64
		if opt.Selection == engine.Exact {
			rows := qT
			frame := add(64, mul(rows, 4), mul(rows, min(k, scored), 8))
			sel = add(mul(cp, cp, add(pairSlack, frame)), mul(cp, cp, rows, min(k, scored)+2, 8*2))
		}
		state := add(pairSlack, mul(qT, d+1, 4*2))
		parts = append(parts, part{"collective buffers", fmt.Sprintf("cp %d", cp), mul(tp, add(sel, mul(2, cp, state), mul(cp, cp, pairSlack)))})
	}
	return parts
}

// rankCapacity is the pool, in pages, that every one of cp ranks needs
// for p pages under the placement: striped, ceil(p/cp); contiguous, the
// largest share of blocks of block pages dealt round-robin. It is at least
// one page.
func rankCapacity(p, cp int, place plan.Placement, block int) int {
	// Rank 0 holds the most pages under either placement.
	lay := plan.Layout{CP: max(cp, 1), TP: 1, Placement: place, BlockPages: block}
	return max(lay.Place(0).Count(p), 1)
}
