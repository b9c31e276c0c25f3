package eval

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// Config is one passkey evaluation: every prompt is prefilled densely
// once, then its answer is decoded with dense attention (the baseline)
// and with every (selector, budget), free-running (greedy on the
// policy's own tokens: the accuracy) and teacher-forced on the dense
// answer (diagnostics per step aligned with the dense run).
type Config struct {
	// Policy is the base policy (page size, sink, local, dense layers,
	// GQA); Selector and BudgetTokens are set per run.
	Policy plan.Policy
	// Selectors and Budgets span the sparse runs.
	Selectors []plan.Selector
	Budgets   []int
	// SummaryDTypes, when set, spans the sparse runs over summary
	// storage types too (each (selector, type) on an engine of its own,
	// the same prompts and prefill): runs and records carry the type.
	// Empty: the Policy's SummaryDType only, and records name no type.
	SummaryDTypes []plan.SummaryDType
	// DecodeQuestion feeds the question's tokens through decode steps
	// (with the policy's selection) instead of prefilling them, so that
	// the selector follows the query as it forms (notes 2.2, LongBench
	// style).
	DecodeQuestion bool
	// Diagnostics measures every sparse decode step against dense
	// attention on the same pages: recall of the dense top-R tokens,
	// attention-mass recall, per-head output cosine and relative L2.
	Diagnostics bool
	// TopR is R of the recall diagnostic (10).
	TopR int
	// StopRule, with Diagnostics, replays the stop rules of notes 3.2
	// on every sparse step (decode.Options.StopRule): the runs' Steps
	// carry the rows (Steps.Stop) for a StopReport. Off by default.
	StopRule bool
	// KVDType is the storage type of the engines' K/V pages:
	// plan.Float32 (the zero value) or plan.FP8 (e4m3 records with a
	// scale per page, layer and KV head; summaries over the dequantized
	// keys). The prompt's dense prefill attends over float32 K/V and
	// stores them in this type; every decode (the dense baseline too)
	// reads the stored pages.
	KVDType plan.DType
	// CP, TP and Selection lay the engines out.
	CP, TP    int
	Selection plan.SelectMode
	// Workers is the goroutines of the prefill kernel (0: GOMAXPROCS).
	Workers int
	// MemoryLimit bounds each engine's page pools (RunnerConfig) and the
	// dense cache of a prompt's prefill: bytes, 0 (the memory
	// available now) or -1 (no check).
	MemoryLimit int64
	// PolicyName names the policy in the records of PolicyBudget runs
	// (e.g. the policy file's name).
	PolicyName string
	// NewRunner builds the harness's runners (one per selector and
	// summary type): the caller's in-process engines.
	NewRunner NewRunnerFunc
}

// PolicyBudget in Config.Budgets runs each selector under the policy's
// own budgets (BudgetTokens and the per-layer LayerBudget, as a policy
// file gives them) instead of one budget for every layer.
const PolicyBudget = -1

// DefaultConfig returns Quest at budgets 64..512 with the default policy
// and diagnostics on.
func DefaultConfig() Config {
	return Config{Policy: plan.DefaultPolicy(), Selectors: []plan.Selector{plan.Quest}, Budgets: []int{64, 128, 256, 512},
		Diagnostics: true, TopR: 10, CP: 1, TP: 1}
}

// Validate reports the first unusable setting.
func (c Config) Validate() error {
	if len(c.Selectors) == 0 || len(c.Budgets) == 0 {
		return errors.New("eval: want at least one selector and one budget")
	}
	for _, s := range c.Selectors {
		if s == plan.Dense {
			return errors.New("eval: the dense baseline always runs; list only sparse selectors")
		}
	}
	for _, d := range c.SummaryDTypes {
		if !d.Known() {
			return fmt.Errorf("eval: unknown summary dtype %v", d)
		}
	}
	for _, b := range c.Budgets {
		if b == PolicyBudget {
			continue
		}
		if b < c.Policy.PageSize {
			return fmt.Errorf("eval: budget %d is below one page (%d tokens)", b, c.Policy.PageSize)
		}
	}
	p := c.Policy
	p.BudgetTokens = max(p.BudgetTokens, p.PageSize)
	return p.Validate()
}

// Harness evaluates prompts on one model; it holds one engine per
// selector, sized for the longest prompt.
type Harness struct {
	m       *model.Model
	tok     model.Tokenizer
	cfg     Config
	engines []Runner // per selector and summary type
	maxTok  int
}

// NewHarness builds the engines for prompts of up to maxTokens tokens
// (the prompt with its BOS, plus the answer).
func NewHarness(m *model.Model, tok model.Tokenizer, cfg Config, maxTokens int) (*Harness, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.NewRunner == nil {
		return nil, errors.New("eval: no NewRunner to build the runners")
	}
	if cfg.TopR <= 0 {
		cfg.TopR = 10
	}
	h := &Harness{m: m, tok: tok, cfg: cfg, maxTok: maxTokens}
	s := cfg.Policy.PageSize
	pages := (maxTokens+s-1)/s + 1
	// The prefilled sequence and one fork at a time.
	capacity := 2 * ((pages+cfg.CP-1)/cfg.CP + 2)
	for _, sel := range cfg.Selectors {
		for _, sd := range cfg.summaryDTypes() {
			p := cfg.Policy
			p.Selector = sel
			p.SummaryDType = sd
			p.BudgetTokens = max(p.BudgetTokens, s)
			e, err := cfg.NewRunner(RunnerConfig{Geometry: m.Geometry(), Policy: p, CapacityPages: capacity,
				CP: max(cfg.CP, 1), TP: max(cfg.TP, 1), Selection: cfg.Selection, MemoryLimit: cfg.MemoryLimit, KVDType: cfg.KVDType})
			if err != nil {
				h.Close()
				return nil, fmt.Errorf("eval: engine for %v (%v summaries): %w", sel, sd, err)
			}
			h.engines = append(h.engines, e)
		}
	}
	return h, nil
}

// summaryDTypes is SummaryDTypes, or the policy's type alone.
func (c Config) summaryDTypes() []plan.SummaryDType {
	if len(c.SummaryDTypes) == 0 {
		return []plan.SummaryDType{c.Policy.SummaryDType}
	}
	return c.SummaryDTypes
}

// Close releases the engines.
func (h *Harness) Close() error {
	for _, e := range h.engines {
		e.Close()
	}
	h.engines = nil
	return nil
}

// Run is what one (selector, budget) did on one prompt.
type Run struct {
	Selector plan.Selector
	Budget   int // 0: dense
	// SummaryDType is the summaries' storage type of the run.
	SummaryDType plan.SummaryDType
	// Output is the free-running answer; Correct compares it with the
	// prompt's answer.
	Output  string
	Correct bool
	// Free and Teacher are the per-step statistics of the free-running
	// and the teacher-forced decode.
	Free, Teacher Steps
}

// Steps accumulates decode steps of one run.
type Steps struct {
	// Steps is the number of decode steps.
	Steps int
	// Agree counts the answer positions whose argmax equals the dense
	// answer's token (teacher-forced: the same inputs as dense); Answer
	// counts the positions.
	Agree, Answer int
	// KL sums KL(dense || policy) of the next-token distributions over
	// KLSteps decode steps aligned with the dense run, and MaxLogitErr is
	// the largest absolute logit difference there (teacher-forced only).
	KL, MaxLogitErr float64
	KLSteps         int
	// Ranked counts the (step, sparse layer) pairs that ranked pages;
	// Skipped those that reused their selections (Policy.ReuseSteps)
	// and ran no score phase and no selection collective.
	Ranked, Skipped int
	// Layers are per-layer sums over the steps.
	Layers []LayerSums
	// Hier is the hierarchical search's work over the steps
	// (Policy.HierGroup; zero when off or when diagnostics ran, which
	// score every page flat).
	Hier HierCounts
	// TopP is the top-p pruning's kept tokens over the steps
	// (Policy.TopP; zero when off).
	TopP TopPCounts
	// Stop holds the stop-rule rows of the steps (Config.StopRule).
	Stop []StopSample
	// Overlap sums the adjacent sparse layers' selection overlap over
	// the steps with diagnostics (overlap.go).
	Overlap []OverlapSums
}

// StopSample is one stop-rule row of one (step, sparse layer, query
// head) with the step's plan.
type StopSample struct {
	Layer int
	// Rank is the pages the step's plan ranked into its selection
	// (plan.Plan.Rank): fixed-K Quest's ranked reads.
	Rank int
	decode.StopRow
}

// TopPCounts counts the top-p pruning, summed over the engine's TP
// groups: pruned (row, step) pairs (a row: one KV head for group_max,
// one query head for per_head, of one sparse layer), their candidate
// tokens (those of the selected and forced pages), the tokens kept, and
// Hist[n] the pairs that kept n tokens.
type TopPCounts struct {
	Rows, Tokens, Kept int64
	Hist               []int64
}

func (c *TopPCounts) add(o TopPCounts) {
	c.Rows += o.Rows
	c.Tokens += o.Tokens
	c.Kept += o.Kept
	if len(c.Hist) < len(o.Hist) {
		c.Hist = append(c.Hist, make([]int64, len(o.Hist)-len(c.Hist))...)
	}
	for i, x := range o.Hist {
		c.Hist[i] += x
	}
}

// quantile returns the q-quantile (0..1) of the kept tokens per row.
func (c TopPCounts) quantile(q float64) int {
	var n int64
	for _, x := range c.Hist {
		n += x
	}
	want, acc := max(int64(q*float64(n)+0.5), 1), int64(0)
	for k, x := range c.Hist {
		acc += x
		if acc >= want {
			return k
		}
	}
	return len(c.Hist) - 1
}

// since returns c minus the earlier snapshot old.
func (c TopPCounts) since(old TopPCounts) TopPCounts {
	d := TopPCounts{Rows: c.Rows - old.Rows, Tokens: c.Tokens - old.Tokens, Kept: c.Kept - old.Kept, Hist: slices.Clone(c.Hist)}
	for i, x := range old.Hist {
		d.Hist[i] -= x
	}
	return d
}

// HierCounts counts the hierarchical exact top-K's work, summed over the
// engine's shards: ranked (row, step) pairs, their candidate pages (the
// records a flat score reads), the box and page records scored, the rows
// scored flat from the start, the searches that fell back to flat
// scoring and the rows scored flat because their search fell back
// recently (kernels.HierConfig.MaxSkip), and Hist[p] the (row, step) pairs that read p percent of
// their candidates (rounded up; the last bucket holds all above).
type HierCounts struct {
	Rows, Candidates, Boxes, Pages, Flat, Fallbacks, Skipped int64
	Hist                                                     []int64
}

func (c *HierCounts) add(o HierCounts) {
	c.Rows += o.Rows
	c.Candidates += o.Candidates
	c.Boxes += o.Boxes
	c.Pages += o.Pages
	c.Flat += o.Flat
	c.Fallbacks += o.Fallbacks
	c.Skipped += o.Skipped
	if len(c.Hist) < len(o.Hist) {
		c.Hist = append(c.Hist, make([]int64, len(o.Hist)-len(c.Hist))...)
	}
	for i, x := range o.Hist {
		c.Hist[i] += x
	}
}

// quantile returns the q-quantile (0..1) of Hist, in percent.
func (c HierCounts) quantile(q float64) int {
	var n int64
	for _, x := range c.Hist {
		n += x
	}
	want, acc := max(int64(q*float64(n)+0.5), 1), int64(0)
	for p, x := range c.Hist {
		acc += x
		if acc >= want {
			return p
		}
	}
	return len(c.Hist) - 1
}

// since returns c minus the earlier snapshot old.
func (c HierCounts) since(old HierCounts) HierCounts {
	d := HierCounts{Rows: c.Rows - old.Rows, Candidates: c.Candidates - old.Candidates, Boxes: c.Boxes - old.Boxes,
		Pages: c.Pages - old.Pages, Flat: c.Flat - old.Flat, Fallbacks: c.Fallbacks - old.Fallbacks, Skipped: c.Skipped - old.Skipped, Hist: slices.Clone(c.Hist)}
	for i, x := range old.Hist {
		d.Hist[i] -= x
	}
	return d
}

// LayerSums sums one layer's statistics over decode steps.
type LayerSums struct {
	Steps, DiagSteps      int
	Dense                 int // steps whose plan was dense
	PagesRead, PagesTotal int
	// SparseTotal is PagesTotal over the sparse steps (whose summaries
	// were scanned).
	SparseTotal int
	// RhoFormula sums 1/S + K/P (sparse steps) or 1 (dense ones).
	RhoFormula            float64
	Recall, Mass, MinMass float64
	// WorstMass is the lowest per-step MinMassRecall.
	WorstMass float64
	// SlackSteps counts the steps with a page-slack summary; SlackP50 and
	// SlackP90 sum its quantiles, SlackMax is the largest.
	SlackSteps         int
	SlackP50, SlackP90 float64
	SlackMax           float64
	// Cosine and RelL2 sum, per query head, the output's cosine and
	// relative L2 error against dense attention.
	Cosine, RelL2 []float64
	// HeadRecall and HeadMass sum, per query head, the recall and the
	// attention-mass recall over the DiagSteps steps that report them.
	HeadRecall, HeadMass []float64
}

func (s *Steps) add(steps []model.StepInfo, pageSize, kvHeads int) {
	s.Steps++
	s.Overlap = overlapStep(s.Overlap, steps, kvHeads)
	if s.Layers == nil {
		s.Layers = make([]LayerSums, len(steps))
		for i := range s.Layers {
			s.Layers[i].WorstMass = 1
		}
	}
	inv := 1 / float64(pageSize)
	for i, st := range steps {
		switch {
		case st.Time.RankSkipped:
			s.Skipped++
		case !st.Plan.Dense && st.Plan.Rank > 0:
			s.Ranked++
		}
		for _, row := range st.Stop {
			s.Stop = append(s.Stop, StopSample{Layer: i, Rank: st.Plan.Rank, StopRow: row})
		}
		l := &s.Layers[i]
		l.Steps++
		l.PagesRead += st.PagesRead
		l.PagesTotal += st.PagesTotal
		if st.Plan.Dense {
			l.Dense++
			l.RhoFormula++
		} else if st.Plan.Pages > 0 {
			l.RhoFormula += inv + float64(st.Plan.K)/float64(st.Plan.Pages)
			l.SparseTotal += st.PagesTotal
		}
		if st.Diag {
			l.DiagSteps++
			l.Recall += st.Recall
			l.Mass += st.MassRecall
			l.MinMass += st.MinMassRecall
			l.WorstMass = min(l.WorstMass, st.MinMassRecall)
			l.HeadRecall = addHeads(l.HeadRecall, st.HeadRecall)
			l.HeadMass = addHeads(l.HeadMass, st.HeadMassRecall)
			if !math.IsNaN(st.SlackP50) && !st.Plan.Dense {
				l.SlackSteps++
				l.SlackP50 += st.SlackP50
				l.SlackP90 += st.SlackP90
				l.SlackMax = max(l.SlackMax, st.SlackMax)
			}
		}
		if st.Cosine != nil {
			if l.Cosine == nil {
				l.Cosine = make([]float64, len(st.Cosine))
				l.RelL2 = make([]float64, len(st.RelL2))
			}
			for h := range st.Cosine {
				l.Cosine[h] += st.Cosine[h]
				l.RelL2[h] += st.RelL2[h]
			}
		}
	}
}

// merge adds o into s.
func (s *Steps) merge(o Steps) {
	s.Steps += o.Steps
	s.Ranked += o.Ranked
	s.Skipped += o.Skipped
	s.Hier.add(o.Hier)
	s.TopP.add(o.TopP) // Stop rows are not merged: see StopRules
	s.Overlap = mergeOverlap(s.Overlap, o.Overlap)
	s.Agree += o.Agree
	s.Answer += o.Answer
	s.KL += o.KL
	s.KLSteps += o.KLSteps
	s.MaxLogitErr = max(s.MaxLogitErr, o.MaxLogitErr)
	if o.Layers == nil {
		return
	}
	if s.Layers == nil {
		s.Layers = make([]LayerSums, len(o.Layers))
		for i := range s.Layers {
			s.Layers[i].WorstMass = 1
		}
	}
	for i, b := range o.Layers {
		a := &s.Layers[i]
		a.Steps += b.Steps
		a.DiagSteps += b.DiagSteps
		a.Dense += b.Dense
		a.PagesRead += b.PagesRead
		a.PagesTotal += b.PagesTotal
		a.SparseTotal += b.SparseTotal
		a.RhoFormula += b.RhoFormula
		a.Recall += b.Recall
		a.Mass += b.Mass
		a.MinMass += b.MinMass
		a.WorstMass = min(a.WorstMass, b.WorstMass)
		a.SlackSteps += b.SlackSteps
		a.SlackP50 += b.SlackP50
		a.SlackP90 += b.SlackP90
		a.SlackMax = max(a.SlackMax, b.SlackMax)
		a.HeadRecall = addHeads(a.HeadRecall, b.HeadRecall)
		a.HeadMass = addHeads(a.HeadMass, b.HeadMass)
		if b.Cosine != nil {
			if a.Cosine == nil {
				a.Cosine = make([]float64, len(b.Cosine))
				a.RelL2 = make([]float64, len(b.RelL2))
			}
			for h := range b.Cosine {
				a.Cosine[h] += b.Cosine[h]
				a.RelL2[h] += b.RelL2[h]
			}
		}
	}
}

// addHeads adds x into sum element by element (allocating sum on the
// first call; nil x adds nothing).
func addHeads(sum, x []float64) []float64 {
	if len(x) == 0 {
		return sum
	}
	if sum == nil {
		sum = make([]float64, len(x))
	}
	for h, v := range x {
		sum[h] += v
	}
	return sum
}

// PromptResult is everything one prompt produced.
type PromptResult struct {
	Prompt Prompt
	Tokens int // prefilled tokens (BOS included)
	// Dense is the baseline; Runs are per selector, then per budget.
	Dense          Run
	Runs           []Run
	PrefillSeconds float64
	DecodeSeconds  float64
}

// Evaluate runs one prompt: a dense prefill recorded once, loaded into
// every selector's engine, then the dense baseline and every (selector,
// budget) on forks of the prefilled sequence.
func (h *Harness) Evaluate(ctx context.Context, p Prompt) (*PromptResult, error) {
	c := h.cfg
	prefill := model.PromptIDs(h.tok, p.Context)
	question := h.tok.Encode(p.Question)
	if !c.DecodeQuestion {
		prefill, question = append(prefill, question...), nil
	}
	answer := h.tok.Encode(p.Answer)
	if n := len(prefill) + len(question) + len(answer); n > h.maxTok {
		return nil, fmt.Errorf("eval: prompt of %d tokens with its answer exceeds the harness's %d", n, h.maxTok)
	}
	res := &PromptResult{Prompt: p, Tokens: len(prefill)}
	g := h.m.Geometry()
	kv := memlimit.Mul(int64(len(prefill)), int64(g.Layers), int64(g.KVHeads), int64(g.HeadDim), 4, 2)
	if err := memlimit.Check(fmt.Sprintf("eval: the dense prefill cache of %d tokens", len(prefill)), kv, c.MemoryLimit); err != nil {
		return nil, err
	}
	t0 := time.Now()
	rec := model.NewDense(g, c.Workers)
	logits, err := h.m.Forward(ctx, rec, prefill, model.ForwardOptions{})
	if err != nil {
		return nil, fmt.Errorf("eval: prefill: %w", err)
	}
	res.PrefillSeconds = time.Since(t0).Seconds()
	t1 := time.Now()
	bases := make([]*model.EngineAttention, len(h.engines))
	defer func() {
		for _, b := range bases {
			if b != nil {
				b.Release()
			}
		}
	}()
	for i, e := range h.engines {
		if bases[i], err = e.NewAttention(h.m.Geometry()); err != nil {
			return nil, err
		}
		if err := bases[i].Load(rec); err != nil {
			return nil, err
		}
	}
	rec = nil
	// Dense baseline: free-running, recording its logits per step.
	dense, err := bases[0].Fork()
	if err != nil {
		return nil, err
	}
	dense.Options.ForceDense = true
	var denseLogits [][]float32
	res.Dense, err = h.decode(ctx, dense, logits, question, len(answer), nil, nil, &denseLogits)
	dense.Release()
	if err != nil {
		return nil, err
	}
	res.Dense.Selector, res.Dense.Budget = plan.Dense, 0
	res.Dense.Correct = res.Dense.Output == p.Answer
	denseAnswer := h.tok.Encode(res.Dense.Output)
	sds := c.summaryDTypes()
	for ei := range h.engines {
		sel, sd := c.Selectors[ei/len(sds)], sds[ei%len(sds)]
		for _, b := range c.Budgets {
			run := Run{Selector: sel, Budget: b, SummaryDType: sd}
			for _, teacher := range []bool{false, true} {
				a, err := bases[ei].Fork()
				if err != nil {
					return nil, err
				}
				a.Budget = max(b, 0) // PolicyBudget: the policy's
				a.Options = decode.Options{Diagnostics: c.Diagnostics, TopR: c.TopR, StopRule: c.StopRule && c.Diagnostics}
				a.Compare = c.Diagnostics
				a.Workers = c.Workers
				var forced []int
				var ref [][]float32
				if teacher {
					forced, ref = denseAnswer, denseLogits
				}
				before, beforeP := h.engines[ei].HierCounts(), h.engines[ei].TopPCounts()
				r, err := h.decode(ctx, a, logits, question, len(answer), forced, ref, nil)
				r.Free.Hier = h.engines[ei].HierCounts().since(before)
				r.Free.TopP = h.engines[ei].TopPCounts().since(beforeP)
				a.Release()
				if err != nil {
					return nil, fmt.Errorf("eval: %v budget %d (%v summaries): %w", sel, b, sd, err)
				}
				if teacher {
					run.Teacher = r.Free
				} else {
					run.Output, run.Free = r.Output, r.Free
					run.Correct = r.Output == p.Answer
				}
			}
			res.Runs = append(res.Runs, run)
		}
	}
	res.DecodeSeconds = time.Since(t1).Seconds()
	return res, nil
}

// decode feeds the question tokens through decode steps, then produces
// n answer tokens: greedy, or forced to the given tokens (teacher
// forcing; the argmax is still compared). With ref, each step's logits
// are compared with the dense run's; with record, they are kept.
func (h *Harness) decode(ctx context.Context, a *model.EngineAttention, logits []float32, question []int, n int, forced []int, ref [][]float32, record *[][]float32) (Run, error) {
	var r Run
	step := 0
	observe := func(l []float32) {
		if record != nil {
			*record = append(*record, l)
		}
		// Step 0 is the shared prefill's logits: identical, not counted.
		if ref != nil && step > 0 && step < len(ref) {
			kl, e := klDiv(ref[step], l)
			r.Free.KL += kl
			r.Free.KLSteps++
			r.Free.MaxLogitErr = max(r.Free.MaxLogitErr, e)
		}
		step++
	}
	forward := func(id int) ([]float32, error) {
		l, err := h.m.Forward(ctx, a, []int{id}, model.ForwardOptions{})
		if err != nil {
			return nil, err
		}
		r.Free.add(a.Steps(), h.cfg.Policy.PageSize, h.m.Geometry().KVHeads)
		return l, nil
	}
	observe(logits)
	var err error
	for _, q := range question {
		if logits, err = forward(q); err != nil {
			return r, err
		}
		observe(logits)
	}
	var out []int
	for j := range n {
		id := model.Argmax(logits)
		out = append(out, id)
		if forced != nil {
			r.Free.Answer++
			if j < len(forced) && id == forced[j] {
				r.Free.Agree++
			}
			if j < len(forced) {
				id = forced[j]
			}
		}
		if j == n-1 {
			break
		}
		if logits, err = forward(id); err != nil {
			return r, err
		}
		observe(logits)
	}
	r.Output = h.tok.Decode(out)
	return r, nil
}

// klDiv returns KL(p || q) of the softmax distributions of logits p and
// q, and their largest absolute difference.
func klDiv(p, q []float32) (kl, maxErr float64) {
	lp, lq := logSumExp(p), logSumExp(q)
	for i := range p {
		a := float64(p[i]) - lp
		b := float64(q[i]) - lq
		kl += math.Exp(a) * (a - b)
		maxErr = max(maxErr, math.Abs(float64(p[i])-float64(q[i])))
	}
	return max(kl, 0), maxErr
}

func logSumExp(x []float32) float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = max(m, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}
