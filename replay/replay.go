// Package replay defines the saved-request format that tools and tests use
// to run one decode step of one layer outside a model: a JSON case with the
// keys, values and query of one sequence, and a JSON result with the
// selected pages, the output, the scores and quality measured against dense
// attention. `questctl replay` is its command-line front end.
package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// Case is one saved request: one sequence, one layer, one query.
type Case struct {
	PageSize     int    `json:"page_size"`
	BudgetTokens int    `json:"budget_tokens"`
	GQA          string `json:"gqa"`         // "group_max" (default) or "per_head"
	SinkPages    int    `json:"sink_pages"`  // default 0 in this format
	LocalPages   int    `json:"local_pages"` // default 0 in this format
	QHeads       int    `json:"q_heads"`
	KVHeads      int    `json:"kv_heads"`
	HeadDim      int    `json:"head_dim"`
	// Keys and Values are [kv_heads][tokens][head_dim].
	Keys   [][][]float32 `json:"keys"`
	Values [][][]float32 `json:"values"`
	// Query is [q_heads][head_dim].
	Query [][]float32 `json:"query"`
}

// Result is the outcome of running a Case.
type Result struct {
	Selector string `json:"selector"`
	// SelectedPages lists, per query head, the attended logical pages in
	// ascending order.
	SelectedPages [][]int32 `json:"selected_pages"`
	// Output is [q_heads][head_dim]; LSE is [q_heads] (natural log of the
	// softmax denominator over scaled logits).
	Output [][]float32 `json:"output"`
	LSE    []float32   `json:"lse"`
	// Scores is [q_heads][pages]: the selector's page scores (for
	// group_max, the group's max). Absent for recent and dense.
	Scores [][]float32 `json:"scores,omitempty"`
	// Recall, MassRecall, RelL2 and AbsL2 compare with dense attention on
	// the same data (see shard.Diagnostics). RelL2 is nil (JSON null) when
	// it is undefined: the dense output is zero and this one is not; AbsL2,
	// ||o - o_dense||, is always defined.
	Recall     float64  `json:"recall"`
	MassRecall float64  `json:"mass_recall"`
	RelL2      *float64 `json:"rel_l2"`
	AbsL2      float64  `json:"abs_l2"`
	Pages      int      `json:"pages"`
	PagesRead  int      `json:"pages_read"`
}

// Options choose how a case runs.
type Options struct {
	Selector plan.Selector
	// Backend runs the kernels; nil means a CPU backend made for the run.
	Backend kernels.Backend
	// CP and TP lay the case out over CP x TP in-process shards (0 or 1:
	// one shard). Selection and Placement apply when CP > 1 or TP > 1.
	CP, TP    int
	Selection engine.Selection
	Placement plan.Placement
	// DeviceResident keeps the pages and page tables in the backend's
	// device memory (shard.Config.DeviceResident; the backend must be a
	// kernels.DeviceStore, e.g. CUDA).
	DeviceResident bool
	// MemoryLimit bounds the bytes the run may allocate (see
	// [Case.Check]): a byte count, 0 (memlimit.Auto: the memory available
	// when Run starts) or -1 (memlimit.NoLimit: no check). Device memory of
	// a DeviceResident run is the backend's to refuse.
	MemoryLimit int64
}

// Pages is the number of pages the case's tokens fill (0 without tokens).
func (c *Case) Pages() int {
	n := c.Tokens()
	if n == 0 || c.PageSize < 1 {
		return 0
	}
	return (n-1)/c.PageSize + 1
}

// Encode writes c as JSON that [Decode] reads back exactly: the scalar
// fields one per line, then keys and values one token row per line and the
// query one head per line (numbers as encoding/json writes float32s). The
// output is a pure function of c.
func (c *Case) Encode(w io.Writer) error {
	bw := bufio.NewWriter(w)
	var buf []byte
	// rows writes "[", one row per line indented by indent+2, and
	// indent+"]" followed by end.
	rows := func(rs [][]float32, indent, end string) {
		bw.WriteString("[\n")
		for i, r := range rs {
			buf = append(append(buf[:0], indent...), "  ["...)
			for j, x := range r {
				if j > 0 {
					buf = append(buf, ',')
				}
				buf = appendFloat32(buf, x)
			}
			buf = append(buf, ']')
			if i < len(rs)-1 {
				buf = append(buf, ',')
			}
			bw.Write(append(buf, '\n'))
		}
		bw.WriteString(indent + "]" + end)
	}
	bw.WriteString("{\n")
	for _, f := range []struct {
		name string
		v    any
	}{
		{"page_size", c.PageSize}, {"budget_tokens", c.BudgetTokens}, {"gqa", c.GQA},
		{"sink_pages", c.SinkPages}, {"local_pages", c.LocalPages},
		{"q_heads", c.QHeads}, {"kv_heads", c.KVHeads}, {"head_dim", c.HeadDim},
	} {
		b, _ := json.Marshal(f.v) // an int or a string
		fmt.Fprintf(bw, "  %q: %s,\n", f.name, b)
	}
	for _, f := range []struct {
		name string
		a    [][][]float32
	}{{"keys", c.Keys}, {"values", c.Values}} {
		fmt.Fprintf(bw, "  %q: [\n", f.name)
		for h, toks := range f.a {
			bw.WriteString("    ")
			end := ",\n"
			if h == len(f.a)-1 {
				end = "\n"
			}
			rows(toks, "    ", end)
		}
		bw.WriteString("  ],\n")
	}
	bw.WriteString(`  "query": `)
	rows(c.Query, "  ", "\n}\n")
	return bw.Flush()
}

// appendFloat32 appends x as encoding/json writes a float32 (shortest
// representation that reads back exactly; exponent form below 1e-6 and
// from 1e21). x is finite.
func appendFloat32(b []byte, x float32) []byte {
	abs := math.Abs(float64(x))
	format := byte('f')
	if abs != 0 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, float64(x), format, -1, 32)
	if format == 'e' {
		// e-09 becomes e-9, as encoding/json writes it.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// Tokens is the number of tokens in the case.
func (c *Case) Tokens() int {
	if len(c.Keys) == 0 {
		return 0
	}
	return len(c.Keys[0])
}

// Validate checks every size and value of the case, and that its scores,
// logits and value sums stay inside float32 (see [ValueLimit]). The memory
// a run needs depends on its options: see [Case.Check].
func (c *Case) Validate() error {
	switch {
	case c.PageSize < 1:
		return fmt.Errorf("replay case: page_size %d < 1", c.PageSize)
	case c.BudgetTokens < c.PageSize:
		return fmt.Errorf("replay case: budget_tokens %d is below one page (%d tokens)", c.BudgetTokens, c.PageSize)
	case c.SinkPages < 0 || c.LocalPages < 0:
		return fmt.Errorf("replay case: sink_pages %d and local_pages %d must not be negative", c.SinkPages, c.LocalPages)
	case c.QHeads < 1 || c.KVHeads < 1 || c.HeadDim < 1:
		return fmt.Errorf("replay case: q_heads %d, kv_heads %d and head_dim %d must be positive", c.QHeads, c.KVHeads, c.HeadDim)
	case c.QHeads%c.KVHeads != 0:
		return fmt.Errorf("replay case: q_heads %d is not a multiple of kv_heads %d", c.QHeads, c.KVHeads)
	}
	// The forced pages are part of the K = B/S pages read (and their sum
	// cannot overflow: each is at most K).
	if k := c.BudgetTokens / c.PageSize; c.SinkPages > k || c.LocalPages > k-c.SinkPages {
		return fmt.Errorf("replay case: sink_pages %d + local_pages %d forced pages exceed K = %d pages (budget_tokens %d / page_size %d, forced pages included)",
			c.SinkPages, c.LocalPages, k, c.BudgetTokens, c.PageSize)
	}
	if _, err := plan.ParseGQAMode(c.GQA); err != nil {
		return fmt.Errorf("replay case: %w", err)
	}
	n := c.Tokens()
	if n < 1 {
		return errors.New("replay case: keys hold no tokens")
	}
	// Keys before values, so that the first error is always the same.
	for _, f := range []struct {
		name string
		a    [][][]float32
	}{{"keys", c.Keys}, {"values", c.Values}} {
		if len(f.a) != c.KVHeads {
			return fmt.Errorf("replay case: %s has %d heads, want kv_heads %d", f.name, len(f.a), c.KVHeads)
		}
		for h, toks := range f.a {
			if len(toks) != n {
				return fmt.Errorf("replay case: %s head %d has %d tokens, keys head 0 has %d (every head of keys and values holds the same tokens)",
					f.name, h, len(toks), n)
			}
			for t, row := range toks {
				if err := checkRow(row, c.HeadDim); err != nil {
					return fmt.Errorf("replay case: %s[%d][%d]: %w", f.name, h, t, err)
				}
			}
		}
	}
	if len(c.Query) != c.QHeads {
		return fmt.Errorf("replay case: query has %d heads, want q_heads %d", len(c.Query), c.QHeads)
	}
	for h, row := range c.Query {
		if err := checkRow(row, c.HeadDim); err != nil {
			return fmt.Errorf("replay case: query[%d]: %w", h, err)
		}
	}
	return c.checkRange()
}

func checkRow(row []float32, d int) error {
	if len(row) != d {
		return fmt.Errorf("%d values, want head_dim %d", len(row), d)
	}
	for _, x := range row {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return errors.New("non-finite value")
		}
	}
	return nil
}

// PlanGeometry is the case's attention geometry (float32 storage), from
// which every config of a run is built.
func (c *Case) PlanGeometry() plan.Geometry {
	return plan.Geometry{QHeads: c.QHeads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize, DType: plan.Float32}
}

// Policy is the selection policy the case asks for (one layer, dense-layer
// rule off).
func (c *Case) Policy(sel plan.Selector) plan.Policy {
	mode, _ := plan.ParseGQAMode(c.GQA)
	return plan.Policy{
		PageSize:     c.PageSize,
		BudgetTokens: c.BudgetTokens,
		SinkPages:    c.SinkPages,
		LocalPages:   c.LocalPages,
		DenseLayers:  0,
		GQA:          mode,
		Selector:     sel,
	}
}

// TokenMajor returns a [kv_heads][tokens][D] array as [tokens][kv_heads][D].
func TokenMajor(a [][][]float32, d int) []float32 {
	if len(a) == 0 {
		return nil
	}
	n := len(a[0])
	out := make([]float32, 0, n*len(a)*d)
	for t := range n {
		for h := range a {
			out = append(out, a[h][t]...)
		}
	}
	return out
}

// Run runs a validated case on a single shard, or on an in-process CP x TP
// engine when opt.CP or opt.TP is above 1. It validates the case and checks
// the options and the memory the run needs ([Case.Check]) before it
// allocates anything.
func Run(ctx context.Context, c *Case, opt Options) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := c.Check(opt); err != nil {
		return nil, err
	}
	be := opt.Backend
	if be == nil {
		cpu := kernels.NewCPU(kernels.CPUConfig{})
		defer cpu.Close()
		be = cpu
	}
	if opt.CP > 1 || opt.TP > 1 {
		return runSharded(ctx, c, opt, be)
	}
	pages := c.Pages()
	sh, err := shard.New(shard.Config{
		Store: pagestore.Config{
			Layers:      1,
			Geometry:    c.PlanGeometry(),
			Capacity:    pages,
			MemoryLimit: opt.MemoryLimit,
		},
		Policy:         c.Policy(opt.Selector),
		DeviceResident: opt.DeviceResident,
	}, be)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer sh.Close()
	id := sh.Store().Create()
	if err := sh.Append(id, 0, TokenMajor(c.Keys, c.HeadDim), TokenMajor(c.Values, c.HeadDim)); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	var res shard.StepResult
	if err := sh.Step(ctx, 0, []shard.SeqStep{{Seq: id, Q: flatten(c.Query)}}, shard.StepOptions{Diagnostics: true}, &res); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return NewResult(opt.Selector, c.QHeads, c.HeadDim, pages, res.O, res.LSE, res.Diag[0]), nil
}

// runSharded runs the case on an in-process CP x TP engine. Each CP rank's
// pool holds its share of the pages (the case appends nothing after its
// tokens).
func runSharded(ctx context.Context, c *Case, opt Options, be kernels.Backend) (*Result, error) {
	pages := c.Pages()
	cfg := engine.DefaultConfig()
	cfg.Layers, cfg.Geometry = 1, c.PlanGeometry()
	cfg.CP, cfg.TP = max(opt.CP, 1), max(opt.TP, 1)
	cfg.CapacityPages = rankCapacity(pages, cfg.CP, opt.Placement, cfg.BlockPages)
	cfg.MemoryLimit = opt.MemoryLimit
	cfg.Policy = c.Policy(opt.Selector)
	cfg.Selection = opt.Selection
	cfg.Backend = be
	cfg.DeviceResident = opt.DeviceResident
	e, err := engine.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer e.Close()
	id, err := e.Create(opt.Placement)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := e.Append(id, 0, TokenMajor(c.Keys, c.HeadDim), TokenMajor(c.Values, c.HeadDim)); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	var res engine.Result
	if err := e.Step(ctx, 0, []engine.Request{{Seq: id, Q: flatten(c.Query)}}, engine.StepOptions{Diagnostics: true}, &res); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return NewResult(opt.Selector, c.QHeads, c.HeadDim, pages, res.O, res.LSE, res.Diag[0]), nil
}

func flatten(rows [][]float32) []float32 {
	n := 0
	for _, r := range rows {
		n += len(r)
	}
	out := make([]float32, 0, n)
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

// NewResult assembles a Result from one sequence's step outputs.
func NewResult(sel plan.Selector, qHeads, d, pages int, o, lse []float32, dg shard.Diagnostics) *Result {
	r := &Result{
		Selector:      sel.String(),
		SelectedPages: dg.Selected,
		Output:        make([][]float32, qHeads),
		LSE:           append([]float32(nil), lse[:qHeads]...),
		Scores:        dg.Scores,
		Recall:        dg.Recall,
		MassRecall:    dg.MassRecall,
		AbsL2:         dg.AbsL2,
		Pages:         pages,
		PagesRead:     dg.PagesRead,
	}
	if !math.IsNaN(dg.RelL2) {
		rel := dg.RelL2
		r.RelL2 = &rel
	}
	for h := range qHeads {
		r.Output[h] = append([]float32(nil), o[h*d:(h+1)*d]...)
	}
	return r
}

// Encode writes r as indented JSON, or nothing and an error. A result of
// a valid case is finite: every case has tokens (no -Inf lse), its values
// keep every score and sum inside float32 ([ValueLimit]), and an undefined
// rel_l2 is null.
func (r *Result) Encode(w io.Writer) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("replay result: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}
