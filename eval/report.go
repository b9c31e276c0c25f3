package eval

import (
	"cmp"
	"slices"

	"github.com/questrt/questrt/plan"
)

// Record is one JSON line of `questctl eval passkey`: one (length,
// selector, budget) over the prompts of that length (and task and
// in-page offset, for tasks other than the plain passkey). Budget 0 is
// the dense baseline.
type Record struct {
	Model  string `json:"model,omitempty"`
	Length int    `json:"length"`
	// Task and Offset are the prompts' Task and Offset (omitted for the
	// plain passkey task).
	Task     string `json:"task,omitempty"`
	Offset   string `json:"offset,omitempty"`
	Selector string `json:"selector"`
	Budget   int    `json:"budget"`
	// SummaryDType is the summaries' storage type of the run (bf16 or
	// fp8), set when the evaluation spans several (Config.SummaryDTypes)
	// or runs a type other than the default; omitted for dense.
	SummaryDType string `json:"summary_dtype,omitempty"`
	// Policy is set on runs under the policy's own per-layer budgets
	// (Config.Budgets' PolicyBudget): Config.PolicyName, and Budget is
	// then the mean token budget of its sparse layers.
	Policy string `json:"policy,omitempty"`
	N      int    `json:"n"`
	// Accuracy is the share of prompts whose free-running greedy answer
	// equals the expected one; DenseAccuracy the same for the dense
	// baseline on the same prompts.
	Accuracy      float64 `json:"accuracy"`
	Correct       int     `json:"correct"`
	DenseAccuracy float64 `json:"dense_accuracy"`
	// SparseOnlyFailures counts prompts the dense baseline answered and
	// this policy did not (failures of the selection, not the model).
	SparseOnlyFailures int `json:"sparse_only_failures"`
	// DistractorAnswers counts answers that were the prompts'
	// Distractor code (Reversal: A's instead of B's); omitted when none.
	DistractorAnswers int     `json:"distractor_answers,omitempty"`
	MeanTokens        float64 `json:"mean_tokens"`
	PageSize          int     `json:"page_size"`
	DenseLayers       int     `json:"dense_layers"`
	Sink              int     `json:"sink"`
	Local             int     `json:"local"`
	GQA               string  `json:"gqa"`
	DecodeQuestion    bool    `json:"decode_question"`
	// ReuseSteps is the policy's selection reuse (Policy.ReuseSteps;
	// omitted when 0).
	ReuseSteps int `json:"reuse_steps,omitempty"`
	// ReuseLayers is the policy's selection reuse across layers
	// (Policy.ReuseLayers; omitted when empty).
	ReuseLayers []int `json:"reuse_layers,omitempty"`
	// FreeRunning and TeacherForced summarize the decode steps.
	FreeRunning   *Phase `json:"free_running,omitempty"`
	TeacherForced *Phase `json:"teacher_forced,omitempty"`
}

// Phase summarizes the decode steps of one mode.
type Phase struct {
	Steps int `json:"steps"`
	// TokenAgreement is the share of answer positions where the policy's
	// argmax equals the dense answer's token (teacher-forced).
	TokenAgreement *float64 `json:"token_agreement,omitempty"`
	// KLMean is the mean KL(dense || policy) of the next-token
	// distributions over aligned steps; MaxLogitErr the largest absolute
	// logit difference (teacher-forced).
	KLMean      *float64 `json:"kl_mean,omitempty"`
	MaxLogitErr *float64 `json:"max_logit_err,omitempty"`
	// PagesRead / PagesTotal are (layer, KV head, page) reads over the
	// steps; Rho the bytes read (K/V plus scanned summaries) over dense
	// bytes, next to RhoFormula, the mean of 1/S + K/P (1 on dense
	// layers).
	PagesRead     int     `json:"pages_read"`
	PagesTotal    int     `json:"pages_total"`
	PagesFraction float64 `json:"pages_fraction"`
	Rho           float64 `json:"rho"`
	RhoFormula    float64 `json:"rho_formula"`
	// SparsePagesFraction, SparseRho and SparseRhoFormula are the same
	// over the layers at or past the policy's dense layers (0 when there
	// are none).
	SparsePagesFraction float64       `json:"sparse_pages_fraction"`
	SparseRho           float64       `json:"sparse_rho"`
	SparseRhoFormula    float64       `json:"sparse_rho_formula"`
	Layers              []LayerRecord `json:"layers"`
	// Hier is the hierarchical exact top-K's work (Policy.HierGroup),
	// omitted when no row was ranked by it.
	Hier *HierRecord `json:"hier,omitempty"`
	// Reuse counts the selection reuse across steps (Policy.ReuseSteps)
	// and layers (Policy.ReuseLayers), omitted when no step reused.
	Reuse *ReuseRecord `json:"reuse,omitempty"`
	// TopP is the top-p pruning's kept tokens (Policy.TopP), omitted
	// when no row was pruned.
	TopP *TopPRecord `json:"top_p,omitempty"`
	// LayerOverlap is the selection overlap of adjacent sparse layers
	// per KV head (overlap.go), omitted without diagnostics.
	LayerOverlap []OverlapRecord `json:"layer_overlap,omitempty"`
}

// TopPRecord summarizes the top-p pruning over the steps of a phase:
// (row, step) pairs pruned (a row: one KV head for group_max, one query
// head for per_head, of one sparse layer; counted once per TP group),
// their candidate tokens (the selected and forced pages' valid tokens),
// the tokens kept, and per (row, step) the mean candidates and the
// mean, p50, p95 and max of the kept tokens; KeptShare = kept /
// candidates.
type TopPRecord struct {
	Rows         int64   `json:"rows"`
	Tokens       int64   `json:"tokens"`
	Kept         int64   `json:"kept"`
	KeptShare    float64 `json:"kept_share"`
	TokensPerRow float64 `json:"tokens_per_row"`
	KeptPerRow   float64 `json:"kept_per_row"`
	KeptP50      int     `json:"kept_p50"`
	KeptP95      int     `json:"kept_p95"`
	KeptMax      int     `json:"kept_max"`
}

// ReuseRecord counts, over the steps of a phase, the (step, sparse
// layer) pairs that ranked pages and those that reused a selection (of
// an earlier step, Policy.ReuseSteps, or of the layer before,
// Policy.ReuseLayers) instead, each saving one score phase per shard
// and, with CP > 1 under exact selection, one selection collective;
// the savings per decoded token are the skipped pairs over the steps.
type ReuseRecord struct {
	Ranked                 int     `json:"ranked"`
	Skipped                int     `json:"skipped"`
	ScorePhasesSavedPerTok float64 `json:"score_phases_saved_per_token"`
	CollectivesSavedPerTok float64 `json:"collectives_saved_per_token"`
	RankedPerTok           float64 `json:"ranked_per_token"`
}

// HierRecord summarizes the hierarchical search over the steps of a
// phase, summed over shards: (row, step) pairs ranked (a row: one KV head
// for group_max, one query head for per_head, of one sparse layer on one
// shard), their candidate pages, the box and page summary records scored,
// RecordsShare = (boxes + pages) / candidates (flat scoring: 1), its p50
// and p95 over (row, step) pairs in percent, rows scored flat from the
// start, searches that fell back to flat scoring and rows scored flat
// because their search fell back recently.
type HierRecord struct {
	Rows         int64   `json:"rows"`
	Candidates   int64   `json:"candidates"`
	Boxes        int64   `json:"boxes"`
	Pages        int64   `json:"pages"`
	RecordsShare float64 `json:"records_share"`
	P50Pct       int     `json:"p50_pct"`
	P95Pct       int     `json:"p95_pct"`
	Flat         int64   `json:"flat"`
	Fallbacks    int64   `json:"fallbacks"`
	Skipped      int64   `json:"skipped"`
	// BoxesPerRow and PagesPerRow are Boxes and Pages per (row, step).
	BoxesPerRow float64 `json:"boxes_per_row"`
	PagesPerRow float64 `json:"pages_per_row"`
}

// LayerRecord is one layer's statistics averaged over decode steps.
type LayerRecord struct {
	Layer int `json:"layer"`
	// DenseShare is the share of steps whose plan was dense (dense
	// layers, budgets covering the context).
	DenseShare float64 `json:"dense_share"`
	PagesRead  int     `json:"pages_read"`
	PagesTotal int     `json:"pages_total"`
	RhoFormula float64 `json:"rho_formula"`
	// Recall of the dense top-R tokens and attention-mass recall 1 - eps
	// (mean over query heads, then steps; MinMassRecall: the worst head,
	// averaged; WorstMassRecall: the worst head of any step).
	Recall          *float64 `json:"recall,omitempty"`
	MassRecall      *float64 `json:"mass_recall,omitempty"`
	MinMassRecall   *float64 `json:"min_mass_recall,omitempty"`
	WorstMassRecall *float64 `json:"worst_mass_recall,omitempty"`
	// SlackP50 and SlackP90 are the median and 90th percentile of the page
	// slack g_p(q) = U_p(q) - max_r q.k_r over (query head, page) pairs
	// (logit units; mean over the sparse steps with diagnostics; at most
	// shard.SlackPages pages per sequence and step, evenly strided),
	// SlackMax the largest seen: how loose the Quest bound is.
	SlackP50 *float64 `json:"slack_p50,omitempty"`
	SlackP90 *float64 `json:"slack_p90,omitempty"`
	SlackMax *float64 `json:"slack_max,omitempty"`
	// Cosine is the output's cosine with dense attention, mean over
	// heads; HeadCosine and HeadRelL2 per query head.
	Cosine     *float64  `json:"cosine,omitempty"`
	HeadCosine []float64 `json:"head_cosine,omitempty"`
	HeadRelL2  []float64 `json:"head_rel_l2,omitempty"`
	// HeadRecall and HeadMassRecall are Recall and MassRecall per query
	// head (mean over steps).
	HeadRecall     []float64 `json:"head_recall,omitempty"`
	HeadMassRecall []float64 `json:"head_mass_recall,omitempty"`
}

// Key names one row of the results.
type Key struct {
	Length       int
	Task, Offset string
	Selector     plan.Selector
	Budget       int
	SummaryDType plan.SummaryDType
}

type acc struct {
	n, correct, denseCorrect, sparseOnly, tokens int
	distractor                                   int
	free, teacher                                Steps
}

// Aggregate gathers prompt results into records.
type Aggregate struct {
	cfg  Config
	by   map[Key]*acc
	keys []Key
}

// NewAggregate starts an empty aggregate for runs of cfg.
func NewAggregate(cfg Config) *Aggregate { return &Aggregate{cfg: cfg, by: map[Key]*acc{}} }

func (a *Aggregate) get(k Key) *acc {
	x, ok := a.by[k]
	if !ok {
		x = &acc{}
		a.by[k] = x
		a.keys = append(a.keys, k)
	}
	return x
}

// Add takes one prompt's results.
func (a *Aggregate) Add(r *PromptResult) {
	l := r.Prompt.Length
	add := func(k Key, run Run) {
		x := a.get(k)
		x.n++
		x.tokens += r.Tokens
		if run.Correct {
			x.correct++
		}
		if r.Dense.Correct {
			x.denseCorrect++
			if !run.Correct {
				x.sparseOnly++
			}
		}
		if r.Prompt.Distractor != "" && run.Output == r.Prompt.Distractor {
			x.distractor++
		}
		x.free.merge(run.Free)
		x.teacher.merge(run.Teacher)
	}
	add(Key{Length: l, Task: r.Prompt.Task, Offset: r.Prompt.Offset, Selector: plan.Dense}, r.Dense)
	for _, run := range r.Runs {
		add(Key{Length: l, Task: r.Prompt.Task, Offset: r.Prompt.Offset, Selector: run.Selector, Budget: run.Budget, SummaryDType: run.SummaryDType}, run)
	}
}

// Records returns the rows of one length (all lengths when length < 0)
// in the order they were first seen: the dense baseline, then each
// selector's budgets (per task and offset: prompts of another offset
// are other rows).
func (a *Aggregate) Records(length int) []Record {
	var out []Record
	for _, k := range a.keys {
		if length >= 0 && k.Length != length {
			continue
		}
		x := a.by[k]
		p := a.cfg.Policy
		rec := Record{Length: k.Length, Task: k.Task, Offset: k.Offset, Selector: k.Selector.String(), Budget: k.Budget, N: x.n, Correct: x.correct,
			Accuracy: frac(x.correct, x.n), DenseAccuracy: frac(x.denseCorrect, x.n), SparseOnlyFailures: x.sparseOnly, DistractorAnswers: x.distractor,
			MeanTokens: float64(x.tokens) / float64(max(x.n, 1)), PageSize: p.PageSize, DenseLayers: p.DenseLayers,
			Sink: p.SinkPages, Local: p.LocalPages, GQA: p.GQA.String(), DecodeQuestion: a.cfg.DecodeQuestion, ReuseSteps: p.ReuseSteps, ReuseLayers: p.ReuseLayers}
		if k.Selector == plan.Dense {
			rec.DenseLayers = 0
		} else if len(a.cfg.SummaryDTypes) > 0 || k.SummaryDType != plan.SummaryKV {
			rec.SummaryDType = k.SummaryDType.String()
		}
		if k.Budget == PolicyBudget {
			rec.Policy = cmp.Or(a.cfg.PolicyName, "policy")
			rec.Budget = meanBudget(p, len(x.free.Layers))
		}
		rec.FreeRunning = phase(x.free, p.PageSize, p.DenseLayers, false)
		if k.Selector != plan.Dense {
			rec.TeacherForced = phase(x.teacher, p.PageSize, p.DenseLayers, true)
		}
		out = append(out, rec)
	}
	return out
}

// meanBudget is the mean token budget of p's sparse layers among the
// first layers (BudgetTokens when every layer is dense).
func meanBudget(p plan.Policy, layers int) int {
	sum, n := 0, 0
	for l := range layers {
		if p.IsDenseLayer(l) {
			continue
		}
		b := p.BudgetTokens
		if lb, ok := p.LayerBudget[l]; ok {
			b = lb
		}
		sum += b
		n++
	}
	if n == 0 {
		return p.BudgetTokens
	}
	return (sum + n/2) / n
}

// Lengths returns the lengths seen, in order.
func (a *Aggregate) Lengths() []int {
	var ls []int
	for _, k := range a.keys {
		if !slices.Contains(ls, k.Length) {
			ls = append(ls, k.Length)
		}
	}
	return ls
}

func frac(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func ptr(x float64) *float64 { return &x }

func phase(s Steps, pageSize, denseLayers int, teacher bool) *Phase {
	if s.Steps == 0 {
		return nil
	}
	ph := &Phase{Steps: s.Steps}
	if teacher {
		ph.TokenAgreement = ptr(frac(s.Agree, s.Answer))
		ph.KLMean = ptr(s.KL / float64(max(s.KLSteps, 1)))
		ph.MaxLogitErr = ptr(s.MaxLogitErr)
	}
	var read, dense, rhoF float64
	var sRead, sDense, sRhoF float64
	var sPages, sTotal, nSparse int
	for i, l := range s.Layers {
		lr := LayerRecord{Layer: i, DenseShare: frac(l.Dense, l.Steps), PagesRead: l.PagesRead, PagesTotal: l.PagesTotal,
			RhoFormula: l.RhoFormula / float64(max(l.Steps, 1))}
		if l.DiagSteps > 0 {
			n := float64(l.DiagSteps)
			lr.Recall, lr.MassRecall, lr.MinMassRecall, lr.WorstMassRecall = ptr(l.Recall/n), ptr(l.Mass/n), ptr(l.MinMass/n), ptr(l.WorstMass)
			for h := range l.HeadMass {
				lr.HeadRecall = append(lr.HeadRecall, l.HeadRecall[h]/n)
				lr.HeadMassRecall = append(lr.HeadMassRecall, l.HeadMass[h]/n)
			}
		}
		if l.SlackSteps > 0 {
			n := float64(l.SlackSteps)
			lr.SlackP50, lr.SlackP90, lr.SlackMax = ptr(l.SlackP50/n), ptr(l.SlackP90/n), ptr(l.SlackMax)
		}
		if l.Cosine != nil {
			n := float64(l.Steps)
			var c float64
			for h := range l.Cosine {
				lr.HeadCosine = append(lr.HeadCosine, l.Cosine[h]/n)
				lr.HeadRelL2 = append(lr.HeadRelL2, l.RelL2[h]/n)
				c += l.Cosine[h] / n
			}
			lr.Cosine = ptr(c / float64(len(l.Cosine)))
		}
		ph.Layers = append(ph.Layers, lr)
		ph.PagesRead += l.PagesRead
		ph.PagesTotal += l.PagesTotal
		b := float64(l.PagesRead) + float64(l.SparseTotal)/float64(pageSize)
		read += b
		dense += float64(l.PagesTotal)
		rhoF += lr.RhoFormula
		if i >= denseLayers {
			sRead += b
			sDense += float64(l.PagesTotal)
			sRhoF += lr.RhoFormula
			sPages += l.PagesRead
			sTotal += l.PagesTotal
			nSparse++
		}
	}
	if nSparse > 0 && sDense > 0 {
		ph.SparsePagesFraction = frac(sPages, sTotal)
		ph.SparseRho = sRead / sDense
		ph.SparseRhoFormula = sRhoF / float64(nSparse)
	}
	if h := s.Hier; h.Rows > 0 {
		n := float64(h.Rows)
		ph.Hier = &HierRecord{Rows: h.Rows, Candidates: h.Candidates, Boxes: h.Boxes, Pages: h.Pages,
			RecordsShare: float64(h.Boxes+h.Pages) / float64(max(h.Candidates, 1)),
			P50Pct:       h.quantile(0.5), P95Pct: h.quantile(0.95), Flat: h.Flat, Fallbacks: h.Fallbacks, Skipped: h.Skipped,
			BoxesPerRow: float64(h.Boxes) / n, PagesPerRow: float64(h.Pages) / n}
	}
	if s.Skipped > 0 {
		n := float64(s.Steps)
		ph.Reuse = &ReuseRecord{Ranked: s.Ranked, Skipped: s.Skipped, ScorePhasesSavedPerTok: float64(s.Skipped) / n,
			CollectivesSavedPerTok: float64(s.Skipped) / n, RankedPerTok: float64(s.Ranked) / n}
	}
	if c := s.TopP; c.Rows > 0 {
		n := float64(c.Rows)
		ph.TopP = &TopPRecord{Rows: c.Rows, Tokens: c.Tokens, Kept: c.Kept, KeptShare: float64(c.Kept) / float64(max(c.Tokens, 1)),
			TokensPerRow: float64(c.Tokens) / n, KeptPerRow: float64(c.Kept) / n,
			KeptP50: c.quantile(0.5), KeptP95: c.quantile(0.95), KeptMax: c.quantile(1)}
	}
	ph.LayerOverlap = overlapRecords(s.Overlap)
	ph.PagesFraction = frac(ph.PagesRead, ph.PagesTotal)
	if dense > 0 {
		ph.Rho = read / dense
	}
	if len(s.Layers) > 0 {
		ph.RhoFormula = rhoF / float64(len(s.Layers))
	}
	return ph
}
