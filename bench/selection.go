package bench

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/shard"
)

// SelectionConfig sizes the comparison of the CP selection modes.
type SelectionConfig struct {
	CP       []int              // CP degrees (2, 4, 8)
	Modes    []engine.Selection // modes (exact, union, replicated)
	Context  int                // tokens of the sequence (32768)
	Budget   int                // token budget (2048)
	PageSize int                // S (16)
	QHeads   int                // 32
	KVHeads  int                // 8
	HeadDim  int                // 128
	Steps    int                // timed steps per configuration, median reported (20)
	Progress io.Writer          // setup progress lines, optional
}

// DefaultSelectionConfig returns the defaults noted on the fields.
func DefaultSelectionConfig() SelectionConfig {
	return SelectionConfig{CP: []int{2, 4, 8}, Modes: []engine.Selection{engine.Exact, engine.Union, engine.Replicated},
		Context: 32768, Budget: 2048, PageSize: 16, QHeads: 32, KVHeads: 8, HeadDim: 128, Steps: 20}
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
	if cfg.Context < 1 || cfg.Steps < 1 || len(cfg.CP) == 0 || len(cfg.Modes) == 0 {
		return fmt.Errorf("bench selection: context, steps, cp and modes must be set: %+v", cfg)
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
	pages := (cfg.Context + cfg.PageSize - 1) / cfg.PageSize
	for _, cp := range cfg.CP {
		var exactSel [][][]int32 // [step][head] pages, from the exact mode
		for _, mode := range cfg.Modes {
			ec := engine.DefaultConfig()
			ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = 1, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize
			ec.CP, ec.CapacityPages, ec.Selection, ec.Backend = cp, (pages+cp-1)/cp+2, mode, be
			ec.Policy = shard.DefaultPolicy()
			ec.Policy.PageSize, ec.Policy.BudgetTokens, ec.Policy.DenseLayers = cfg.PageSize, cfg.Budget, 0
			e, err := engine.New(ec)
			if err != nil {
				return fmt.Errorf("bench selection: %w", err)
			}
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "bench selection: cp %d %v: filling %d tokens\n", cp, mode, cfg.Context)
			}
			id, err := e.Create(engine.Striped)
			if err == nil {
				err = e.Append(id, 0, k, v)
			}
			if err != nil {
				e.Close()
				return fmt.Errorf("bench selection: %w", err)
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
