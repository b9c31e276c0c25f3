package shard

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/questrt/questrt/kernels"
)

// Top-p pruning after the page selection (plan.Policy.TopP). A step that
// prunes runs, between the selection and attend:
//
//	toppLocal    this shard's candidate tokens' logits, as a message
//	(exchange)   the CP ranks of the TP group all-gather their messages
//	toppCut      every rank derives the same cuts from all messages
//
// and attend then reads only the kept tokens. The message carries, for
// each sequence with a sparse plan and each of the shard's query heads,
// the (logit, global position) pairs of the tokens the rank would read,
// so every CP rank sees the same candidate set as a single shard would
// and the kept set does not depend on the layout.

// toppState is a LocalStep's top-p data.
type toppState struct {
	ready  bool // toppCut ran: attend reads the kept tokens
	off    []int
	stats  TopPStats // this step's counts, added to the shard's at the end
	logits []float32
	global []int32 // per list entry: its global page
	msg    []byte
	toks   [][]kernels.TopPToken // per query head: all ranks' tokens, in rank order
	sorted []kernels.TopPToken
	cuts   []kernels.TopPCut
	keep   kernels.TopPKeep
}

// TopPStats counts the top-p pruning of a shard's steps (counted on CP
// rank 0 of a TP group only: every rank derives the same counts). A row
// is one (sequence, selection row, sparse layer, step): a KV head with
// group_max, a query head with per_head.
type TopPStats struct {
	Rows   int64
	Tokens int64 // candidate tokens of the rows (forced and selected pages)
	Kept   int64 // tokens kept and read
	// Hist[n] counts the rows that kept n tokens (the last bucket: n or
	// more).
	Hist []int64
}

// maxTopPHist bounds TopPStats.Hist.
const maxTopPHist = 1 << 16

// Add adds o's counts to s.
func (s *TopPStats) Add(o TopPStats) {
	s.Rows += o.Rows
	s.Tokens += o.Tokens
	s.Kept += o.Kept
	if len(o.Hist) > len(s.Hist) {
		s.Hist = append(s.Hist, make([]int64, len(o.Hist)-len(s.Hist))...)
	}
	for i, c := range o.Hist {
		s.Hist[i] += c
	}
}

// TopPStats returns a copy of the shard's top-p counters.
func (s *Shard) TopPStats() TopPStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.toppStats
	st.Hist = append([]int64(nil), st.Hist...)
	return st
}

// checkTopP reports whether the shard can prune by top-p: the CPU
// backend reading host pools.
func (s *Shard) checkTopP() (*kernels.CPU, error) {
	c, ok := s.be.(*kernels.CPU)
	if !ok || s.dev != nil || s.off != nil || s.cfg.DeviceResident {
		return nil, fmt.Errorf("shard: %w (backend %s, device resident %v, offload %v)", kernels.ErrTopPUnsupported, s.be.Name(), s.cfg.DeviceResident, s.off != nil)
	}
	return c, nil
}

// anySparse reports whether a part of the step has a sparse plan.
func (ls *LocalStep) anySparse() bool { return !ls.allDense() }

// toppLocal computes the logits of the tokens this shard would read for
// the selection sel (forced and selected pages of the sparse parts) and
// returns the step's top-p message for the exchange (valid until the
// next toppLocal on ls). It changes no shard state.
func (s *Shard) toppLocal(ctx context.Context, ls *LocalStep, sel *Chosen) ([]byte, error) {
	c, err := s.checkTopP()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	tp := &ls.topp
	tp.ready = false
	if err := ls.buildLists(sel); err != nil {
		return nil, err
	}
	sh := s.shape
	heads := sh.Group()
	if ls.mode == kernels.PerHead {
		heads = 1
	}
	tp.msg = tp.msg[:0]
	if ls.lists.All {
		return tp.msg, nil // nothing to prune
	}
	sz := sh.PageSize
	tp.logits = resize(tp.logits, len(ls.lists.Pages)*heads*sz)
	if err := c.TopPLogits(ctx, sh, ls.kl, &ls.batch, ls.q, &ls.lists, tp.logits); err != nil {
		return nil, fmt.Errorf("top-p layer %d: %w", ls.layer, err)
	}
	tp.global = tp.global[:0]
	for i := range ls.parts {
		for r := range ls.rows {
			k := i*ls.rows + r
			for _, lp := range ls.lists.Pages[ls.lists.Indptr[k]:ls.lists.Indptr[k+1]] {
				tp.global = append(tp.global, ls.global(i, int(lp)))
			}
		}
	}
	// Message: per sparse part, per query head: count, then the pairs.
	for i, p := range ls.parts {
		if p.Plan.Dense {
			continue
		}
		for h := range sh.QHeads {
			r, hh := h/heads, h%heads
			k := i*ls.rows + r
			at := len(tp.msg)
			tp.msg = binary.LittleEndian.AppendUint32(tp.msg, 0)
			n := uint32(0)
			for e := ls.lists.Indptr[k]; e < ls.lists.Indptr[k+1]; e++ {
				lg := tp.logits[(int(e)*heads+hh)*sz:][:sz]
				for j, x := range lg {
					if math.IsInf(float64(x), -1) {
						continue // a padding slot
					}
					tp.msg = binary.LittleEndian.AppendUint32(tp.msg, math.Float32bits(x))
					tp.msg = binary.LittleEndian.AppendUint32(tp.msg, uint32(tp.global[e]*int32(sz)+int32(j)))
					n++
				}
			}
			binary.LittleEndian.PutUint32(tp.msg[at:], n)
		}
	}
	ls.Time.TopP += time.Since(t0)
	return tp.msg, nil
}

// errTopPMessage marks a malformed top-p message.
var errTopPMessage = errors.New("top-p message malformed")

// toppCut derives the step's cuts from the messages of every CP rank of
// the TP group (msgs, in rank order; one for a single shard) with mass
// p, after which attend reads only the kept tokens; count adds the
// step's rows to the shard's TopPStats (true on one rank per TP group).
func (s *Shard) toppCut(ls *LocalStep, msgs [][]byte, p float64, count bool) error {
	t0 := time.Now()
	tp := &ls.topp
	sh := s.shape
	heads := sh.Group()
	if ls.mode == kernels.PerHead {
		heads = 1
	}
	tp.cuts = tp.cuts[:0]
	for range len(ls.parts) * sh.QHeads {
		tp.cuts = append(tp.cuts, kernels.TopPKeepAll)
	}
	if len(tp.toks) < sh.QHeads {
		tp.toks = make([][]kernels.TopPToken, sh.QHeads)
	}
	tp.off = append(tp.off[:0], make([]int, len(msgs))...)
	off := tp.off
	st := &tp.stats
	st.Rows, st.Tokens, st.Kept = 0, 0, 0
	clear(st.Hist)
	for i, part := range ls.parts {
		if part.Plan.Dense {
			continue
		}
		for h := range sh.QHeads {
			toks := tp.toks[h][:0]
			for m, b := range msgs {
				if len(b)-off[m] < 4 {
					return fmt.Errorf("top-p cut: rank %d: %w (part %d head %d: no count)", m, errTopPMessage, i, h)
				}
				n := int(binary.LittleEndian.Uint32(b[off[m]:]))
				off[m] += 4
				if n < 0 || len(b)-off[m] < 8*n {
					return fmt.Errorf("top-p cut: rank %d: %w (part %d head %d: %d pairs in %d bytes)", m, errTopPMessage, i, h, n, len(b)-off[m])
				}
				for range n {
					toks = append(toks, kernels.TopPToken{
						Logit: math.Float32frombits(binary.LittleEndian.Uint32(b[off[m]:])),
						Pos:   int32(binary.LittleEndian.Uint32(b[off[m]+4:])),
					})
					off[m] += 8
				}
			}
			tp.toks[h] = toks
			tp.sorted = append(tp.sorted[:0], toks...)
			tp.cuts[i*sh.QHeads+h], _ = kernels.TopPSelect(tp.sorted, p)
		}
		if !count {
			continue
		}
		// A row reads the tokens any of its heads keeps; its heads list
		// the same tokens in the same order.
		for r := range ls.rows {
			h0 := r * heads
			kept := 0
			for j, t := range tp.toks[h0] {
				for hh := range heads {
					if tp.cuts[i*sh.QHeads+h0+hh].Keeps(tp.toks[h0+hh][j].Logit, t.Pos) {
						kept++
						break
					}
				}
			}
			st.Rows++
			st.Tokens += int64(len(tp.toks[h0]))
			st.Kept += int64(kept)
			b := min(kept, maxTopPHist-1)
			if len(st.Hist) <= b {
				st.Hist = append(st.Hist, make([]int64, b+1-len(st.Hist))...)
			}
			st.Hist[b]++
		}
	}
	for m, b := range msgs {
		if off[m] != len(b) {
			return fmt.Errorf("top-p cut: rank %d: %w (%d trailing bytes)", m, errTopPMessage, len(b)-off[m])
		}
	}
	if count {
		s.toppStats.Add(*st)
	}
	tp.ready = true
	ls.Time.TopP += time.Since(t0)
	return nil
}

// attendTopP is attend over the kept tokens (s.mu held; toppCut ran).
func (s *Shard) attendTopP(ctx context.Context, ls *LocalStep) error {
	c, err := s.checkTopP()
	if err != nil {
		return err
	}
	tp := &ls.topp
	if len(tp.global) != len(ls.lists.Pages) {
		return fmt.Errorf("top-p attend: the lists changed since TopPLocal (%d pages, %d then)", len(ls.lists.Pages), len(tp.global))
	}
	tp.keep = kernels.TopPKeep{Global: tp.global, Cuts: tp.cuts}
	return c.AttendTopP(ctx, s.shape, ls.kl, &ls.batch, ls.q, &ls.lists, &tp.keep, ls.O, ls.LSE)
}
