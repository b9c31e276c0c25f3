// Package demo runs `questctl demo`: a synthetic long context with a
// relevance reversal (many steps ask about entity A, then the query turns
// to entity B, whose few "needle" keys sit early in the context), decoded
// with Quest and with dense attention on the same data, printing per step
// the pages and bytes read against rho = 1/S + K/P, recall, attention-mass
// recall and the time of each phase.
package demo

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
)

// Summary is what the demo measured over all steps (sparse layers only).
// A mean over nothing (a phase without steps) is NaN.
type Summary struct {
	Steps          int
	StepsA, StepsB int // steps asking about A / about B
	SparseLayers   int // layers measured in every step (Layers - DenseLayers)
	// SpeedupMean is the mean over steps of dense step time / Quest step
	// time (sparse layers, same data).
	SpeedupMean      float64
	RecallA, RecallB float64 // mean top-10 recall while asking about A / B
	MassA, MassB     float64 // mean attention-mass recall
	NeedleHitRate    float64 // fraction of B-phase (step, sparse layer, KV head) with every needle page read
	RhoMeasured      float64 // bytes read / dense bytes
	RhoFormula       float64 // 1/S + min(K, P)/P at the last step
	// RelL2 is the mean over (step, sparse layer) of the output's relative
	// L2 error against dense attention, leaving out the RelL2Undefined
	// pairs whose dense output was zero (relative error NaN, see
	// shard.RelL2); AbsL2 is the mean absolute L2 error over every pair.
	RelL2          float64
	RelL2Undefined int
	AbsL2          float64
	// DensePlans counts the (step, sparse layer) pairs whose plan read
	// every page anyway (the dense selector).
	DensePlans      int
	CollectiveShare float64 // selection exchange + merge time / Quest step time
}

// mean averages the values it is given, leaving NaN ones out (and
// counting them); the mean of nothing is NaN.
type mean struct {
	sum        float64
	n, skipped int
}

func (m *mean) add(x float64) {
	if math.IsNaN(x) {
		m.skipped++
		return
	}
	m.sum += x
	m.n++
}

func (m *mean) value() float64 {
	if m.n == 0 {
		return math.NaN()
	}
	return m.sum / float64(m.n)
}

// Run validates cfg (memory included, before anything is allocated),
// builds the context, decodes, prints a table to w and returns the
// summary.
func Run(ctx context.Context, cfg Config, w io.Writer) (Summary, error) {
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	mem, err := cfg.Memory()
	if err != nil {
		return Summary{}, err
	}
	be := cfg.Backend
	if be == nil && cfg.Cluster == nil {
		cpu := kernels.NewCPU(kernels.CPUConfig{Workers: cfg.Workers})
		defer cpu.Close()
		be = cpu
	}
	ec := cfg.engineConfig(be)
	ec.StepTimeout = time.Minute
	var dec decoder
	where, layout, beName := "host memory", "in-process shards", "cpu"
	if be != nil {
		beName = be.Name()
	}
	if cfg.Cluster != nil {
		cd, err := newClusterDecoder(ctx, cfg.Cluster, cfg)
		if err != nil {
			return Summary{}, err
		}
		dec = cd
		layout = fmt.Sprintf("shards on questd nodes %v", cd.nodes)
	} else {
		ed, err := newEngineDecoder(ec)
		if err != nil {
			return Summary{}, err
		}
		dec = ed
	}
	defer dec.close()
	kvBytes, sumBytes, _ := ec.WorkerConfig().Store().PoolBytes()
	shards := cfg.CP * cfg.TP
	fmt.Fprintf(w, "questrt demo: %d-token context, %d layers (%d dense), %d query / %d KV heads, D=%d, S=%d, budget %d tokens (K=%d pages), selector %s, %s\n",
		cfg.Context, cfg.Layers, cfg.DenseLayers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize, cfg.Budget, cfg.Budget/cfg.PageSize, ec.Policy.Selector, ec.Policy.GQA)
	if cfg.DeviceResident {
		where = "device memory only"
	}
	fmt.Fprintf(w, "layout: cp %d x tp %d %s, %s selection, %s backend, pages in %s; pools: %d x %.1f MiB K/V, %.1f MiB summaries (1/S of K+V, float32 sizes)\n",
		cfg.CP, cfg.TP, layout, ec.Selection, beName, where, shards, float64(kvBytes)/(1<<20), float64(sumBytes)/(1<<20))
	fmt.Fprintf(w, "host memory: %s (%s), %s\n", memlimit.Bytes(mem.Total()), mem, limitText(cfg.MemoryLimit))

	g := newGenerator(cfg)
	t0 := time.Now()
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	if err := g.prefill(ctx, dec, progress); err != nil {
		return Summary{}, err
	}
	fmt.Fprintf(w, "prefill: %d tokens x %d layers in %.1fs; A at %d tokens; needles of B at tokens %v (page offsets %v)\n",
		cfg.Context, cfg.Layers, time.Since(t0).Seconds(), g.mentions, g.needles, g.needleOffsets())

	fmt.Fprintf(w, "\n%4s %3s %13s %7s %7s %6s %7s %7s %8s %7s %7s %7s %8s %9s %8s\n",
		"step", "ask", "pages read", "rho", "formula", "recall", "mass", "relL2", "score_ms", "topk_ms", "attn_ms", "coll_ms", "quest_ms", "dense_ms", "speedup")
	sum := Summary{Steps: cfg.Steps, SparseLayers: cfg.Layers - cfg.DenseLayers}
	var recallA, recallB, massA, massB, speedup, relAll, absAll mean
	var hits, trials int
	var rhoNum, rhoDen float64
	var res, dres, qres engine.Result
	var collT, totalT time.Duration
	for step := range cfg.Steps {
		askB := step >= cfg.Steps/2
		var read, total int
		var stepNum float64
		var recall, mass, rel mean
		sparse := 0
		var questT, denseT time.Duration
		var score, topk, attn, coll time.Duration
		formula := math.NaN()
		for layer := range cfg.Layers {
			if err := ctx.Err(); err != nil {
				return sum, err
			}
			q := g.query(layer, askB)
			k, v := g.token()
			isSparse := layer >= cfg.DenseLayers
			if err := dec.step(ctx, layer, q, k, v, engine.StepOptions{Diagnostics: isSparse}, &res); err != nil {
				return sum, fmt.Errorf("demo step %d layer %d: %w", step, layer, err)
			}
			if !isSparse {
				continue
			}
			if err := dec.step(ctx, layer, q, nil, nil, engine.StepOptions{ForceDense: true}, &dres); err != nil {
				return sum, fmt.Errorf("demo dense step %d layer %d: %w", step, layer, err)
			}
			// The timed Quest step: the same query without diagnostics,
			// as a server runs it (fused at CP 1, ranked at CP > 1).
			if err := dec.step(ctx, layer, q, nil, nil, engine.StepOptions{}, &qres); err != nil {
				return sum, fmt.Errorf("demo quest step %d layer %d: %w", step, layer, err)
			}
			sparse++
			dg := res.Diag[0]
			pl := res.Plans[0]
			read += dg.PagesRead
			total += dg.PagesTotal
			recall.add(dg.Recall)
			mass.add(dg.MassRecall)
			rel.add(dg.RelL2)
			relAll.add(dg.RelL2)
			absAll.add(dg.AbsL2)
			score += res.Time.Score
			topk += res.Time.TopK
			attn += res.Time.Attend
			coll += qres.Time.Collective()
			questT += qres.Time.Total
			denseT += dres.Time.Total
			collT += qres.Time.Collective()
			totalT += qres.Time.Total
			summaryRead := 0
			if pl.Dense {
				sum.DensePlans++
			} else {
				summaryRead = pl.Pages * cfg.KVHeads
			}
			w := cfg.SummaryWeight
			if w == 0 {
				w = 1 / float64(cfg.PageSize)
			}
			stepNum += float64(dg.PagesRead) + float64(summaryRead)*w
			rhoNum += float64(dg.PagesRead) + float64(summaryRead)*w
			rhoDen += float64(dg.PagesTotal)
			formula = rhoFormula(cfg.PageSize, pl.K, pl.Pages)
			if askB {
				for kvh := range cfg.KVHeads {
					trials++
					if g.needlesRead(dg.Selected[kvh*(cfg.QHeads/cfg.KVHeads)]) {
						hits++
					}
				}
			}
		}
		if sparse == 0 { // Validate keeps a sparse layer; defensive
			fmt.Fprintf(w, "%4d %3s (every layer is dense: nothing to measure)\n", step, ask(askB))
			continue
		}
		rho := math.NaN()
		if total > 0 {
			rho = stepNum / float64(total)
		}
		sp := math.NaN()
		if questT > 0 {
			sp = float64(denseT) / float64(questT)
		}
		speedup.add(sp)
		relText := "n/a"
		if v := rel.value(); !math.IsNaN(v) {
			relText = fmt.Sprintf("%.4f", v)
		}
		fmt.Fprintf(w, "%4d %3s %6d/%-6d %7.4f %7.4f %6s %7s %7s %8.2f %7.2f %7.2f %7.2f %8.2f %9.2f %7sx\n",
			step, ask(askB), read, total, rho, formula, num(recall.value(), 3), num(mass.value(), 4), relText,
			ms(score), ms(topk), ms(attn), ms(coll), ms(questT), ms(denseT), stepSpeedup(sp))
		if askB {
			recallB.add(recall.value())
			massB.add(mass.value())
			sum.StepsB++
		} else {
			recallA.add(recall.value())
			massA.add(mass.value())
			sum.StepsA++
		}
		sum.RhoFormula = formula
	}
	sum.RecallA, sum.MassA = recallA.value(), massA.value()
	sum.RecallB, sum.MassB = recallB.value(), massB.value()
	sum.SpeedupMean = speedup.value()
	sum.RelL2, sum.RelL2Undefined, sum.AbsL2 = relAll.value(), relAll.skipped, absAll.value()
	sum.NeedleHitRate, sum.RhoMeasured, sum.CollectiveShare = math.NaN(), math.NaN(), math.NaN()
	if trials > 0 {
		sum.NeedleHitRate = float64(hits) / float64(trials)
	}
	if rhoDen > 0 {
		sum.RhoMeasured = rhoNum / rhoDen
	}
	if totalT > 0 {
		sum.CollectiveShare = float64(collT) / float64(totalT)
	}
	writeSummary(w, cfg, sum)
	return sum, nil
}

// rhoFormula is the notes' bytes ratio 1/S + K/P, with the page budget K
// capped at the P pages there are (a budget covering the sequence reads
// every page once: 1 + 1/S at most).
func rhoFormula(s, k, p int) float64 {
	if p <= 0 {
		return math.NaN()
	}
	return 1/float64(s) + float64(min(k, p))/float64(p)
}

func writeSummary(w io.Writer, cfg Config, sum Summary) {
	pairs := sum.SparseLayers * (sum.StepsA + sum.StepsB)
	if pairs == 0 {
		fmt.Fprintf(w, "\nsummary: no sparse layer ran (%d steps, %d of %d layers dense): nothing was measured\n", cfg.Steps, cfg.DenseLayers, cfg.Layers)
		return
	}
	fmt.Fprintf(w, "\nsummary over %d sparse layers x %d steps: speedup %s (dense step time / Quest step time, same data), bytes rho %.4f (formula 1/S + K/P = %.4f); collectives %.1f%% of the Quest step time\n",
		sum.SparseLayers, sum.StepsA+sum.StepsB, ratio(sum.SpeedupMean), sum.RhoMeasured, sum.RhoFormula, 100*sum.CollectiveShare)
	if sum.DensePlans == pairs {
		fmt.Fprintf(w, "(selector %s: every layer read every page, so Quest and dense did the same work)\n", cfg.Selector)
	}
	needles := "no B-phase selections to check the needles in"
	if !math.IsNaN(sum.NeedleHitRate) {
		needles = fmt.Sprintf("every needle page read in %.0f%% of B-phase (layer, KV head) selections", 100*sum.NeedleHitRate)
	}
	fmt.Fprintf(w, "asking A: %s; asking B: %s; %s\n",
		phase(sum.StepsA, sum.RecallA, sum.MassA, cfg.Steps), phase(sum.StepsB, sum.RecallB, sum.MassB, cfg.Steps), needles)
	relText := "n/a"
	if !math.IsNaN(sum.RelL2) {
		relText = fmt.Sprintf("%.4f", sum.RelL2)
	}
	fmt.Fprintf(w, "output vs dense: rel L2 %s, abs L2 %.4f (means over (step, sparse layer))", relText, sum.AbsL2)
	if sum.RelL2Undefined > 0 {
		fmt.Fprintf(w, "; rel L2 leaves out %d of %d pairs whose dense output was zero (relative error undefined)", sum.RelL2Undefined, pairs)
	}
	fmt.Fprintln(w)
	weight := "at 1/S of a page"
	if cfg.SummaryWeight != 0 {
		weight = fmt.Sprintf("at %.4g of a page (fp8 records; the formula's 1/S assumes records of the K/V type)", cfg.SummaryWeight)
	}
	fmt.Fprintf(w, "(rho counts K/V pages read plus summaries %s; pages read are (KV head, page) pairs; the tail page is always read;\n score/topk/attn_ms come from the step with diagnostics, run phase by phase; quest_ms and coll_ms from the same step without them, as served)\n", weight)
}

// phase describes one phase's recall, or that it had no steps.
func phase(n int, recall, mass float64, steps int) string {
	if n == 0 {
		return fmt.Sprintf("no steps (--steps %d: the query turns to B at step %d)", steps, steps/2)
	}
	return fmt.Sprintf("recall %.3f, mass recall %.4f over %d steps", recall, mass, n)
}

// num formats x with prec decimals, "n/a" for NaN.
func num(x float64, prec int) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

// stepSpeedup formats a speedup: one decimal from 1 up, two
// significant digits below (a step stalled by the host, such as a cold
// first step on a loaded machine, shows 0.014 rather than 0.0).
func stepSpeedup(x float64) string {
	if x >= 1 {
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strconv.FormatFloat(x, 'g', 2, 64)
}

func ratio(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return stepSpeedup(x) + "x"
}

// limitText says what the memory was checked against.
func limitText(limit int64) string {
	switch limit {
	case memlimit.Auto:
		return "checked against the memory available"
	case memlimit.NoLimit:
		return "not checked (--max-memory -1)"
	}
	return "within --max-memory " + memlimit.Bytes(limit)
}

func ask(b bool) string {
	if b {
		return "B"
	}
	return "A"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
