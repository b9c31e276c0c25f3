package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"slices"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// SelectionConfig sizes the comparison of the CP selection modes.
type SelectionConfig struct {
	CP       []int              // CP degrees, 1..MaxCP (2, 4, 8)
	Modes    []engine.Selection // modes (exact, union, replicated)
	Context  int                // tokens of the sequence, 1..MaxContext (32768)
	Budget   int                // token budget, PageSize..MaxContext (2048)
	PageSize int                // S, 1..MaxPageSize (16)
	QHeads   int                // 1..MaxHeads, a multiple of KVHeads (32)
	KVHeads  int                // 1..MaxHeads (8)
	HeadDim  int                // 1..MaxHeadDim (128)
	Steps    int                // timed steps per configuration, median reported, 1..MaxIters (20)
	// MemoryLimit bounds the host memory of the run (the shared K/V and
	// queries, one engine's pools, diagnostics): a byte count,
	// memlimit.Auto (0, the default: the memory available now) or
	// memlimit.NoLimit (-1). A run over it is refused before anything is
	// allocated.
	MemoryLimit int64
	Progress    io.Writer // setup progress lines, optional
}

// DefaultSelectionConfig returns the defaults noted on the fields.
func DefaultSelectionConfig() SelectionConfig {
	return SelectionConfig{CP: []int{2, 4, 8}, Modes: []engine.Selection{engine.Exact, engine.Union, engine.Replicated},
		Context: 32768, Budget: 2048, PageSize: 16, QHeads: 32, KVHeads: 8, HeadDim: 128, Steps: 20}
}

// Validate reports the first setting outside its range, in one line that
// names the questctl flag and the allowed range.
func (c SelectionConfig) Validate() error {
	if len(c.CP) == 0 {
		return errors.New("--cp: no CP degrees given")
	}
	if len(c.Modes) == 0 {
		return errors.New("--selection: no modes given")
	}
	for _, cp := range c.CP {
		if err := inRange("--cp", cp, 1, MaxCP, ""); err != nil {
			return err
		}
	}
	for _, m := range c.Modes {
		if m < engine.Exact || m > engine.Replicated {
			return fmt.Errorf("--selection: unknown mode %v (want exact, union or replicated)", m)
		}
	}
	if err := inRange("--context", c.Context, 1, MaxContext, " tokens"); err != nil {
		return err
	}
	if err := checkShape(c.PageSize, c.QHeads, c.KVHeads, c.HeadDim); err != nil {
		return err
	}
	if err := checkBudget(c.Budget, c.PageSize); err != nil {
		return err
	}
	if err := inRange("--steps", c.Steps, 1, MaxIters, ""); err != nil {
		return err
	}
	pages := (c.Context + c.PageSize - 1) / c.PageSize
	for _, cp := range c.CP {
		if cp > pages {
			return fmt.Errorf("--cp %d: more CP ranks than the context's %d pages", cp, pages)
		}
	}
	return checkLimit(c.MemoryLimit)
}

// geometry is the attention geometry of every engine of the run
// (float32 pages).
func (c SelectionConfig) geometry() plan.Geometry {
	return plan.Geometry{QHeads: c.QHeads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize, DType: plan.Float32}
}

// MemoryBytes returns the host bytes of a run at CP degree cp: the K/V
// given to every engine and the queries, the exact selections kept for
// comparison, one engine's page pools (with the summary mirrors of
// replicated selection when that mode runs) and the diagnostics' copy of
// the sequence's pages. It is -1 when the size overflows. c must be valid.
func (c SelectionConfig) MemoryBytes(cp int) int64 {
	pages := int64(pagesOf(c.Context, c.PageSize))
	kvh, qh, d := int64(c.KVHeads), int64(c.QHeads), int64(c.HeadDim)
	capacity := (pages+int64(cp)-1)/int64(cp) + 2
	st := pagestore.Config{Layers: 1, Geometry: c.geometry(), Capacity: int(capacity)}
	shardBytes, err := st.HostBytes()
	if err != nil {
		return -1
	}
	pools := memlimit.Mul(shardBytes, int64(cp))
	if slices.Contains(c.Modes, engine.Replicated) {
		// Every rank mirrors the summaries of all cp ranks' pages; the
		// mirrors grow by append, so count twice their final size (a
		// growing slice holds up to double its length, and the old array
		// lives until the copy is done; measured: RSS 2.03 GiB where the
		// single count estimated 1.8 GiB at --cp 8, 64K tokens).
		pools = memlimit.Add(pools, memlimit.Mul(2, kvh, 2, d, 4, capacity, int64(cp), int64(cp)))
	}
	k := min(int64(c.Budget/c.PageSize), pages)
	return memlimit.Add(
		memlimit.Mul(2, int64(c.Context), kvh, d, 4), // the shared K and V
		memlimit.Mul(int64(c.Steps), qh, d, 4),       // queries
		memlimit.Mul(int64(c.Steps), qh, k+6, 4),     // exact selection's pages per step and head
		pools,
		// Diagnostics copy every page (K, V, summaries) and list scores
		// and pages per query head; steps keep scores, candidates and
		// lists per (KV head, page).
		memlimit.Mul(pages, kvh, int64(c.PageSize)*2+2, d, 4),
		memlimit.Mul(pages, qh, 4, 4),
		memlimit.Mul(pages, kvh, 4, 8),
	)
}

// Preflight checks, before anything is allocated, that the run at every
// CP degree fits c.MemoryLimit. The errors wrap memlimit.ErrTooLarge.
func (c SelectionConfig) Preflight() error {
	for _, cp := range c.CP {
		what := fmt.Sprintf("bench selection: --context %d at --cp %d (K/V of %d KV heads, D %d, the engine's pools and diagnostics)", c.Context, cp, c.KVHeads, c.HeadDim)
		if err := memlimit.Check(what, c.MemoryBytes(cp), c.MemoryLimit); err != nil {
			return err
		}
	}
	return nil
}

// SelectionResult is one JSON line of `questctl bench selection`.
type SelectionResult struct {
	CP        int     `json:"cp"`
	Mode      string  `json:"selection"`
	Context   int     `json:"context"`
	Budget    int     `json:"budget"`
	StepUS    float64 `json:"step_us"`    // whole sparse layer-step, median
	ScoreUS   float64 `json:"score_us"`   // rank 0
	SelectUS  float64 `json:"select_us"`  // selection exchange, rank 0 (0 for union and replicated)
	MergeUS   float64 `json:"merge_us"`   // merge of partial states, rank 0
	PagesRead float64 `json:"pages_read"` // (KV head, page) pairs attended per step, mean
	// SamePages is the fraction of (step, query head) whose attended pages
	// equal exact selection's on the same data and query (-1 when exact
	// was not run before this mode); MassRecall is the mean
	// attention-mass recall against dense.
	SamePages float64 `json:"same_pages_as_exact"`
	// ExactRecall is the fraction of exact selection's attended pages this
	// mode attended too (-1 like SamePages).
	ExactRecall float64 `json:"exact_pages_recalled"`
	MassRecall  float64 `json:"mass_recall"`
	Steps       int     `json:"steps"`
}

// Selection runs one sparse layer of the in-process engine for each CP
// degree and selection mode on the same data and queries, and reports the
// step latency with its collective phases, the pages read, and how far each
// mode's selection is from exact selection.
func Selection(ctx context.Context, cfg SelectionConfig, emit func(SelectionResult) error) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("bench selection: %w", err)
	}
	debug.FreeOSMemory() // what an earlier run left is garbage: let Auto see it
	if err := cfg.Preflight(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bench selection: %w", err)
	}
	be := kernels.NewCPU(kernels.CPUConfig{})
	defer be.Close()
	tok := cfg.KVHeads * cfg.HeadDim
	// The same data for every engine.
	k := make([]float32, cfg.Context*tok)
	v := make([]float32, cfg.Context*tok)
	seed := fillUniform(k, 7)
	fillUniform(v, seed)
	queries := make([][]float32, cfg.Steps)
	for i := range queries {
		queries[i] = make([]float32, cfg.QHeads*cfg.HeadDim)
		fillUniform(queries[i], uint32(100+i))
	}
	pages := pagesOf(cfg.Context, cfg.PageSize)
	for _, cp := range cfg.CP {
		var exactSel [][][]int32 // [step][head] pages, from the exact mode
		for _, mode := range cfg.Modes {
			ec := engine.DefaultConfig()
			ec.Layers, ec.Geometry = 1, cfg.geometry()
			ec.CP, ec.CapacityPages, ec.Selection, ec.Backend = cp, (pages+cp-1)/cp+2, mode, be
			ec.Policy = plan.DefaultPolicy()
			ec.Policy.PageSize, ec.Policy.BudgetTokens, ec.Policy.DenseLayers = cfg.PageSize, cfg.Budget, 0
			// The previous engine's pools are garbage now: give them
			// back, so the engine's own check sees what it can have.
			debug.FreeOSMemory()
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("bench selection: %w", err)
			}
			ec.MemoryLimit = cfg.MemoryLimit
			e, err := engine.New(ec)
			if err != nil {
				return fmt.Errorf("bench selection: %w", err)
			}
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "bench selection: cp %d %v: filling %d tokens\n", cp, mode, cfg.Context)
			}
			id, err := e.Create(plan.Striped)
			if err == nil {
				err = e.Append(id, 0, k, v)
			}
			if err != nil {
				e.Close()
				return fmt.Errorf("bench selection: %w", err)
			}
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "bench selection: cp %d %v: timing %d steps\n", cp, mode, cfg.Steps)
			}
			var steps, scores, sels, merges, read, same, mass, recalled []float64
			var res engine.Result
			for i, q := range queries {
				req := []engine.Request{{Seq: id, Q: q}}
				if err := e.Step(ctx, 0, req, engine.StepOptions{}, &res); err != nil {
					e.Close()
					return fmt.Errorf("bench selection: %w", err)
				}
				tm := res.Time
				steps, scores = append(steps, us(tm.Total)), append(scores, us(tm.Score))
				sels, merges = append(sels, us(tm.Select)), append(merges, us(tm.Merge))
				// Quality and pages on the same query (untimed).
				if err := e.Step(ctx, 0, req, engine.StepOptions{Diagnostics: true}, &res); err != nil {
					e.Close()
					return fmt.Errorf("bench selection: %w", err)
				}
				dg := res.Diag[0]
				read = append(read, float64(dg.PagesRead))
				mass = append(mass, dg.MassRecall)
				if mode == engine.Exact {
					exactSel = append(exactSel, dg.Selected)
				}
				if len(exactSel) > i {
					n, hit, total := 0, 0, 0
					for h := range dg.Selected {
						if slices.Equal(dg.Selected[h], exactSel[i][h]) {
							n++
						}
						for _, p := range exactSel[i][h] {
							if _, ok := slices.BinarySearch(dg.Selected[h], p); ok {
								hit++
							}
						}
						total += len(exactSel[i][h])
					}
					same = append(same, float64(n)/float64(len(dg.Selected)))
					recalled = append(recalled, float64(hit)/float64(total))
				}
			}
			e.Close()
			r := SelectionResult{CP: cp, Mode: mode.String(), Context: cfg.Context, Budget: cfg.Budget,
				StepUS: median(steps), ScoreUS: median(scores), SelectUS: median(sels), MergeUS: median(merges),
				PagesRead: mean(read), MassRecall: mean(mass), SamePages: -1, ExactRecall: -1, Steps: cfg.Steps}
			if len(same) > 0 {
				r.SamePages, r.ExactRecall = mean(same), mean(recalled)
			}
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	return nil
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
