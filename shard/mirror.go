package shard

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Mirror holds replicas of the page summaries of whole sequences (all CP
// ranks' pages) for the replicated selection mode: a CP rank that mirrors
// every summary computes the global top-K alone, with no selection
// exchange, at N times the scoring work. Summaries are updated from the
// appended keys exactly like the store's (same min/max), so scores are
// bit-identical to the owner's. Layout per sequence and layer:
// [pages][KVHeads][2][HeadDim], identity page table.
//
// Methods are safe for concurrent use (one mutex).
type Mirror struct {
	layers, kvHeads, headDim, pageSize int

	mu   sync.Mutex
	seqs map[uint64]*mirrorSeq
}

type mirrorSeq struct {
	sum  [][]float32 // per layer
	lens []int       // tokens per layer
}

// NewMirror makes an empty mirror for the given geometry.
func NewMirror(layers, kvHeads, headDim, pageSize int) *Mirror {
	return &Mirror{layers: layers, kvHeads: kvHeads, headDim: headDim, pageSize: pageSize, seqs: map[uint64]*mirrorSeq{}}
}

func (m *Mirror) rec() int { return 2 * m.headDim }

func (m *Mirror) page() int { return m.kvHeads * m.rec() }

// Create starts an empty sequence.
func (m *Mirror) Create(id uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seqs[id] = &mirrorSeq{sum: make([][]float32, m.layers), lens: make([]int, m.layers)}
}

// Drop forgets a sequence.
func (m *Mirror) Drop(id uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.seqs, id)
}

// Clone copies sequence parent to a new sequence child (fork).
func (m *Mirror) Clone(parent, child uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.seqs[parent]
	if !ok {
		return fmt.Errorf("mirror: unknown sequence %d", parent)
	}
	c := &mirrorSeq{sum: make([][]float32, m.layers), lens: slices.Clone(p.lens)}
	for l := range p.sum {
		c.sum[l] = slices.Clone(p.sum[l])
	}
	m.seqs[child] = c
	return nil
}

// Append widens the summaries with keys k ([n][KVHeads][HeadDim]) appended
// to layer of sequence id.
func (m *Mirror) Append(id uint64, layer int, k []float32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	sq, ok := m.seqs[id]
	if !ok {
		return fmt.Errorf("mirror: unknown sequence %d", id)
	}
	d, tok := m.headDim, m.kvHeads*m.headDim
	if len(k)%tok != 0 {
		return fmt.Errorf("mirror: %d key floats are not whole tokens of %d", len(k), tok)
	}
	for t := range len(k) / tok {
		pos := sq.lens[layer]
		p := pos / m.pageSize
		if pos%m.pageSize == 0 {
			fresh := make([]float32, m.page())
			for h := range m.kvHeads {
				r := fresh[h*m.rec():]
				for j := range d {
					r[j], r[d+j] = float32(math.Inf(1)), float32(math.Inf(-1))
				}
			}
			sq.sum[layer] = append(sq.sum[layer][:p*m.page()], fresh...)
		}
		for h := range m.kvHeads {
			r := sq.sum[layer][p*m.page()+h*m.rec():][:m.rec()]
			key := k[t*tok+h*d:][:d]
			for j, x := range key {
				r[j], r[d+j] = min(r[j], x), max(r[d+j], x)
			}
		}
		sq.lens[layer]++
	}
	return nil
}

// Truncate drops tokens past n in every layer; the summary of a page cut in
// the middle must then be refreshed with SetPage from its owner, who still
// has the keys.
func (m *Mirror) Truncate(id uint64, n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	sq, ok := m.seqs[id]
	if !ok {
		return fmt.Errorf("mirror: unknown sequence %d", id)
	}
	pages := (n + m.pageSize - 1) / m.pageSize
	for l := range sq.sum {
		sq.lens[l] = min(sq.lens[l], n)
		sq.sum[l] = sq.sum[l][:min(len(sq.sum[l]), pages*m.page())]
	}
	return nil
}

// SetPage overwrites the summary records of one page of one layer
// ([KVHeads][2][HeadDim]).
func (m *Mirror) SetPage(id uint64, layer, page int, recs []float32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	sq, ok := m.seqs[id]
	if !ok {
		return fmt.Errorf("mirror: unknown sequence %d", id)
	}
	if len(recs) != m.page() || (page+1)*m.page() > len(sq.sum[layer]) {
		return fmt.Errorf("mirror: page %d of layer %d: bad record size or page", page, layer)
	}
	copy(sq.sum[layer][page*m.page():], recs)
	return nil
}

// Summary returns the mirrored summaries of one layer of a sequence and its
// token count (read-only; valid until the next write to the sequence).
func (m *Mirror) Summary(id uint64, layer int) ([]float32, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sq, ok := m.seqs[id]
	if !ok {
		return nil, 0, fmt.Errorf("mirror: unknown sequence %d", id)
	}
	return sq.sum[layer], sq.lens[layer], nil
}

// replicatedSelect computes, from the mirror alone, the global selection of
// every (sequence, row) for the given plans and queries (ids[i], plans[i],
// q [seqs][QHeads][D]): the same top-K as a single shard holding every
// page. It uses the shard's backend and policy.
func (s *Shard) replicatedSelect(ctx context.Context, m *Mirror, layer int, ids []uint64, plans []plan.Plan, q []float32, sel *Chosen) error {
	sh := s.shape
	mode := s.cfg.Policy.GQA
	rows := sh.Rows(mode)
	sel.Reset()
	var batch kernels.Batch
	var scores []float32
	var tk kernels.TopKPlan
	var out []int32
	for i, id := range ids {
		pl := plans[i]
		if pl.Dense || pl.Rank == 0 {
			for range rows {
				sel.Indptr = append(sel.Indptr, int32(len(sel.Pages)))
			}
			continue
		}
		sum, n, err := m.Summary(id, layer)
		if err != nil {
			return err
		}
		np := (n + sh.PageSize - 1) / sh.PageSize
		if np != pl.Pages {
			return fmt.Errorf("replicated select: mirror of sequence %d holds %d pages, plan %d", id, np, pl.Pages)
		}
		batch.Indptr = append(batch.Indptr[:0], 0, int32(np))
		batch.Pages = batch.Pages[:0]
		for p := range np {
			batch.Pages = append(batch.Pages, int32(p))
		}
		batch.LastLen = append(batch.LastLen[:0], int32(n-(np-1)*sh.PageSize))
		scores = slices.Grow(scores[:0], np*rows)[:np*rows]
		if s.cfg.Policy.Selector != plan.Quest {
			return fmt.Errorf("replicated select: selector %v needs the keys; only quest is supported", s.cfg.Policy.Selector)
		}
		qi := q[i*sh.QHeads*sh.HeadDim:][:sh.QHeads*sh.HeadDim]
		if err := s.be.Score(ctx, sh, kernels.Layer{Summary: sum[:np*sh.KVHeads*2*sh.HeadDim]}, &batch, qi, mode, scores); err != nil {
			return fmt.Errorf("replicated select: %w", err)
		}
		tk.Reset()
		for r := range rows {
			tk.Add(r*np+pl.Lo(), pl.Hi()-pl.Lo(), pl.Lo(), pl.Rank, r*pl.Rank)
		}
		out = slices.Grow(out[:0], rows*pl.Rank)[:rows*pl.Rank]
		if err := s.be.TopK(ctx, scores, &tk, out); err != nil {
			return fmt.Errorf("replicated select: %w", err)
		}
		for r := range rows {
			sel.Pages = append(sel.Pages, out[r*pl.Rank:(r+1)*pl.Rank]...)
			sel.Indptr = append(sel.Indptr, int32(len(sel.Pages)))
		}
	}
	return nil
}
