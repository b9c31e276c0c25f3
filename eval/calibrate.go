package eval

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// CalibrateConfig is one calibration of per-layer budgets (notes section
// 1: redraw the budget curve whenever a checkpoint is deployed).
type CalibrateConfig struct {
	// Policy gives the page size, sink and local pages and the GQA mode
	// whose Quest selection is calibrated; its budgets and dense layers
	// are what the calibration replaces.
	Policy plan.Policy
	// TargetMass is the attention-mass recall 1 - eps a layer's budget
	// must reach: the mean over prompts, decode steps and the query heads
	// of a KV head. Default 0.99.
	TargetMass float64
	// MaxRho is the byte-model limit of a sparse layer: a layer whose
	// needed budget gives 1/S + K/P >= MaxRho at the prompts' mean page
	// count is recommended dense. Default 1 (Quest reads no fewer bytes
	// than dense).
	MaxRho float64
	// DecodeQuestion feeds the question through decode steps, so its
	// tokens' queries are measured too (else only the answer's).
	DecodeQuestion bool
	// Workers is the goroutines of the prefill kernel (0: GOMAXPROCS).
	Workers int
	// MemoryLimit bounds the dense cache of a prompt (see eval.Config).
	MemoryLimit int64
}

// DefaultCalibrateConfig returns the default policy's page layout, a
// target of 0.99 and the question decoded.
func DefaultCalibrateConfig() CalibrateConfig {
	return CalibrateConfig{Policy: plan.DefaultPolicy(), TargetMass: 0.99, MaxRho: 1, DecodeQuestion: true}
}

// Validate reports the first unusable setting.
func (c CalibrateConfig) Validate() error {
	switch {
	case !(c.TargetMass > 0 && c.TargetMass <= 1):
		return fmt.Errorf("calibrate: target mass %v outside (0, 1]", c.TargetMass)
	case !(c.MaxRho > 0):
		return fmt.Errorf("calibrate: max rho %v is not positive", c.MaxRho)
	}
	p := c.Policy
	p.BudgetTokens = max(p.BudgetTokens, p.PageSize)
	return p.Validate()
}

// Calibrator measures, for every layer and KV head, the attention-mass
// recall of Quest selection as a function of the page budget K, from
// dense decodes of calibration prompts: at every decode step and layer
// it takes the step's queries and the dense cache's post-RoPE keys,
// builds each page's min/max summary, ranks the candidate pages by the
// Quest bound (group max or per head, ties to the lower page, the
// policy's sink and local pages forced, as plan.Policy.Plan and the
// kernels do) and adds up the dense softmax mass of the first K pages,
// for every K at once. It is a float64 reference independent of the
// engine. Not safe for concurrent use.
type Calibrator struct {
	m   *model.Model
	tok model.Tokenizer
	cfg CalibrateConfig
	g   model.Geometry

	prompts, steps int
	// curves[layer][kvHead] accumulates mass recall by page budget.
	curves [][]curve
	pages  float64 // sum of P over the (step, layer) samples
	nPages int
}

// curve sums, over samples, the mass recall at page budget K (index K;
// samples whose K reaches their page count count as 1 through full).
type curve struct {
	sum  []float64 // sum[K], K < the sample's pages
	full []int     // full[P]: samples of P pages (mass 1 from K = P on)
	n    int
}

func (c *curve) add(mass []float64) {
	p := len(mass) // mass[K] for K in 0..P-1
	if len(c.sum) < p {
		c.sum = append(c.sum, make([]float64, p-len(c.sum))...)
	}
	for k, m := range mass {
		c.sum[k] += m
	}
	if len(c.full) <= p {
		c.full = append(c.full, make([]int, p+1-len(c.full))...)
	}
	c.full[p]++
	c.n++
}

// at returns the mean mass recall at page budget k.
func (c *curve) at(k int) float64 {
	if c.n == 0 {
		return math.NaN()
	}
	s := 0.0
	if k < len(c.sum) {
		s = c.sum[k]
	}
	done := 0
	for p := 0; p < len(c.full) && p <= k; p++ {
		done += c.full[p]
	}
	return (s + float64(done)) / float64(c.n)
}

// NewCalibrator returns a calibrator for model m.
func NewCalibrator(m *model.Model, tok model.Tokenizer, cfg CalibrateConfig) (*Calibrator, error) {
	if cfg.TargetMass == 0 {
		cfg.TargetMass = 0.99
	}
	if cfg.MaxRho == 0 {
		cfg.MaxRho = 1
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := m.Geometry()
	c := &Calibrator{m: m, tok: tok, cfg: cfg, g: g, curves: make([][]curve, g.Layers)}
	for l := range c.curves {
		c.curves[l] = make([]curve, g.KVHeads)
	}
	return c, nil
}

// Add decodes prompt p densely (its answer greedily, the question through
// decode steps when DecodeQuestion) and adds every decode step's curves.
func (c *Calibrator) Add(ctx context.Context, p Prompt) error {
	prefill := model.PromptIDs(c.tok, p.Context)
	question := c.tok.Encode(p.Question)
	if !c.cfg.DecodeQuestion {
		prefill, question = append(prefill, question...), nil
	}
	answer := len(c.tok.Encode(p.Answer))
	n := len(prefill) + len(question) + answer
	if mp := c.m.Config.MaxPositions; mp > 0 && n > mp {
		return fmt.Errorf("calibrate: prompt of %d tokens with its answer exceeds the model's %d positions", n, mp)
	}
	kv := memlimit.Mul(int64(n), int64(c.g.Layers), int64(c.g.KVHeads), int64(c.g.HeadDim), 4, 2)
	if err := memlimit.Check(fmt.Sprintf("calibrate: the dense cache of %d tokens", n), kv, c.cfg.MemoryLimit); err != nil {
		return err
	}
	dense := model.NewDense(c.g, c.cfg.Workers)
	logits, err := c.m.Forward(ctx, dense, prefill, model.ForwardOptions{})
	if err != nil {
		return fmt.Errorf("calibrate: prefill: %w", err)
	}
	obs := &observer{Dense: dense, c: c}
	step := func(id int) error {
		l, err := c.m.Forward(ctx, obs, []int{id}, model.ForwardOptions{})
		if err != nil {
			return fmt.Errorf("calibrate: decode: %w", err)
		}
		logits = l
		c.steps++
		return nil
	}
	for _, id := range question {
		if err := step(id); err != nil {
			return err
		}
	}
	// The answer's tokens: the greedy ones (the last one is not fed).
	for j := range answer {
		id := model.Argmax(logits)
		if j == answer-1 {
			break
		}
		if err := step(id); err != nil {
			return err
		}
	}
	c.prompts++
	return nil
}

// observer is dense attention that measures every decode step.
type observer struct {
	*model.Dense
	c *Calibrator
}

// Decode attends densely, then adds the layer's curves for query q over
// the keys cached so far (the new token's included).
func (o *observer) Decode(ctx context.Context, layer int, q, k, v, out []float32) error {
	if err := o.Dense.Decode(ctx, layer, q, k, v, out); err != nil {
		return err
	}
	keys, _ := o.Dense.KV(layer)
	o.c.observe(layer, q, keys)
	return nil
}

// observe adds one (step, layer) sample: query q ([Heads][D]) over keys
// ([n][KVHeads][D]).
func (c *Calibrator) observe(layer int, q, keys []float32) {
	g, d, s := c.g, c.g.HeadDim, c.cfg.Policy.PageSize
	n := len(keys) / (g.KVHeads * d)
	np := (n + s - 1) / s
	grp := g.Heads / g.KVHeads
	scale := 1 / math.Sqrt(float64(d))
	c.pages += float64(np)
	c.nPages++
	pm := PageMass(q, keys, n, g.Heads, g.KVHeads, d, s, scale)
	bound := PageBounds(q, keys, n, g.Heads, g.KVHeads, d, s)
	pol := c.cfg.Policy
	sink := min(pol.SinkPages, np)
	local := min(pol.LocalPages, np-sink)
	for kvh := range g.KVHeads {
		avg := make([]float64, np)
		var order []int
		if pol.GQA == plan.GroupMax {
			score := make([]float64, np)
			for p := range np {
				score[p] = math.Inf(-1)
				for h := kvh * grp; h < (kvh+1)*grp; h++ {
					score[p] = max(score[p], bound[h][p])
				}
			}
			order = rankPages(score, sink, np-local)
		}
		for h := kvh * grp; h < (kvh+1)*grp; h++ {
			if pol.GQA == plan.PerHead {
				order = rankPages(bound[h], sink, np-local)
			}
			m := MassCurve(pm[h], order, sink, local)
			for k := range np {
				avg[k] += m[k] / float64(grp)
			}
		}
		c.curves[layer][kvh].add(avg)
	}
}

// PageMass returns, per query head, the dense softmax mass of each page
// (float64): q is [heads][d], keys [n][kvHeads][d], pages of s tokens,
// logits q.k * scale.
func PageMass(q, keys []float32, n, heads, kvHeads, d, s int, scale float64) [][]float64 {
	grp := heads / kvHeads
	np := (n + s - 1) / s
	out := make([][]float64, heads)
	logit := make([]float64, n)
	for h := range heads {
		kvh := h / grp
		qh := q[h*d : (h+1)*d]
		mx := math.Inf(-1)
		for t := range n {
			k := keys[(t*kvHeads+kvh)*d:][:d]
			var dot float64
			for j, x := range qh {
				dot += float64(x) * float64(k[j])
			}
			logit[t] = dot * scale
			mx = max(mx, logit[t])
		}
		var z float64
		for t := range n {
			logit[t] = math.Exp(logit[t] - mx)
			z += logit[t]
		}
		pm := make([]float64, np)
		for t := range n {
			pm[t/s] += logit[t] / z
		}
		out[h] = pm
	}
	return out
}

// PageBounds returns, per query head, the Quest bound of each page: the
// sum over dimensions of max(q_j min_j, q_j max_j) of the page's per-dim
// key extrema (unscaled, float64).
func PageBounds(q, keys []float32, n, heads, kvHeads, d, s int) [][]float64 {
	grp := heads / kvHeads
	np := (n + s - 1) / s
	out := make([][]float64, heads)
	for h := range heads {
		out[h] = make([]float64, np)
	}
	lo, hi := make([]float64, d), make([]float64, d)
	for kvh := range kvHeads {
		for p := range np {
			for j := range d {
				lo[j], hi[j] = math.Inf(1), math.Inf(-1)
			}
			for t := p * s; t < min((p+1)*s, n); t++ {
				k := keys[(t*kvHeads+kvh)*d:][:d]
				for j, x := range k {
					lo[j], hi[j] = min(lo[j], float64(x)), max(hi[j], float64(x))
				}
			}
			for h := kvh * grp; h < (kvh+1)*grp; h++ {
				var u float64
				for j, x := range q[h*d : (h+1)*d] {
					u += max(float64(x)*lo[j], float64(x)*hi[j])
				}
				out[h][p] = u
			}
		}
	}
	return out
}

// rankPages returns the candidate pages [lo, hi) by score, highest first,
// ties to the lower page.
func rankPages(score []float64, lo, hi int) []int {
	if hi <= lo {
		return nil
	}
	order := make([]int, 0, hi-lo)
	for p := lo; p < hi; p++ {
		order = append(order, p)
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(score[b], score[a]) })
	return order
}

// MassCurve returns m[K], K = 0..P-1 (P = len(pageMass)): the mass in the
// pages a plan of page budget K reads (sink pages, local pages, then the
// first K - sink - local pages of order); K >= P is dense (mass 1).
func MassCurve(pageMass []float64, order []int, sink, local int) []float64 {
	np := len(pageMass)
	var forced float64
	for p := range sink {
		forced += pageMass[p]
	}
	for p := np - local; p < np; p++ {
		forced += pageMass[p]
	}
	m := make([]float64, np)
	cum := forced
	for k := range np {
		r := k - sink - local
		if r > 0 && r <= len(order) {
			cum += pageMass[order[r-1]]
		}
		m[k] = min(cum, 1)
	}
	return m
}

// Calibration is a calibration's result.
type Calibration struct {
	// Prompts and Steps are the calibration prompts and their decode
	// steps; MeanPages is the mean page count of a step (the byte model's
	// P).
	Prompts, Steps int
	MeanPages      float64
	TargetMass     float64
	Layers         []LayerCalibration
	// Policy is the recommended policy: dense layers and per-layer
	// budgets, the rest from the configured policy.
	Policy plan.Policy
	// UniformBudget is the one budget for the configured policy's sparse
	// layers (its dense layers kept) that reads as many (KV head, page)
	// pairs as Policy at MeanPages: the uniform policy at the same bytes
	// (0 when even one page per sparse layer reads more).
	// UniformBudgetAll is the same with no dense layer.
	UniformBudget, UniformBudgetAll int
}

// LayerCalibration is one layer's calibration.
type LayerCalibration struct {
	Layer int `json:"layer"`
	// HeadBudgets are, per KV head, the smallest token budget (a multiple
	// of the page size) whose mean mass recall reaches the target; Budget
	// is their maximum (the policy budgets layers, not heads).
	HeadBudgets []int `json:"head_budgets"`
	Budget      int   `json:"budget"`
	// Rho is 1/S + K/P of Budget at MeanPages.
	Rho float64 `json:"rho"`
	// Dense: the layer is recommended dense (Rho >= MaxRho).
	Dense bool `json:"dense"`
	// Curve is the mean mass recall (over the layer's KV heads) at
	// budgets of 1, 2, 4, ... pages.
	Curve []CurvePoint `json:"curve"`
}

// CurvePoint is the mass recall at one budget.
type CurvePoint struct {
	Budget int     `json:"budget"`
	Mass   float64 `json:"mass_recall"`
	// HeadMass is the mass recall per KV head.
	HeadMass []float64 `json:"head_mass_recall"`
}

// ErrNoSamples is returned by Result before any decode step was added.
var ErrNoSamples = errors.New("calibrate: no decode steps measured")

// MassAt returns the mean mass recall of layer's KV head kvh at token
// budget b (NaN before any sample).
func (c *Calibrator) MassAt(layer, kvh, b int) float64 {
	return c.curves[layer][kvh].at(b / c.cfg.Policy.PageSize)
}

// Result returns the calibration of the prompts added so far.
func (c *Calibrator) Result() (Calibration, error) {
	if c.nPages == 0 {
		return Calibration{}, ErrNoSamples
	}
	s := c.cfg.Policy.PageSize
	meanP := c.pages / float64(c.nPages)
	res := Calibration{Prompts: c.prompts, Steps: c.steps, MeanPages: meanP, TargetMass: c.cfg.TargetMass}
	pol := c.cfg.Policy
	pol.DenseLayers = 0
	pol.LayerBudget = map[int]int{}
	maxK := 0
	for l := range c.curves {
		for h := range c.curves[l] {
			maxK = max(maxK, len(c.curves[l][h].full))
		}
	}
	denseLead := true
	var reads float64 // (KV head, page) pairs per step, summed over layers
	for l := range c.curves {
		lc := LayerCalibration{Layer: l}
		for h := range c.curves[l] {
			cv := &c.curves[l][h]
			k := 1
			for ; k < maxK && cv.at(k) < c.cfg.TargetMass; k++ {
			}
			lc.HeadBudgets = append(lc.HeadBudgets, k*s)
			lc.Budget = max(lc.Budget, k*s)
		}
		lc.Rho = 1/float64(s) + float64(lc.Budget/s)/meanP
		lc.Dense = lc.Rho >= c.cfg.MaxRho
		for k := 1; ; k *= 2 {
			pt := CurvePoint{Budget: k * s}
			for h := range c.curves[l] {
				m := c.curves[l][h].at(k)
				pt.HeadMass = append(pt.HeadMass, m)
				pt.Mass += m / float64(len(c.curves[l]))
			}
			lc.Curve = append(lc.Curve, pt)
			if k >= maxK {
				break
			}
		}
		switch {
		case lc.Dense && denseLead:
			pol.DenseLayers = l + 1
			reads += meanP
		case lc.Dense:
			pol.LayerBudget[l] = plan.DenseBudget
			reads += meanP
		default:
			denseLead = false
			pol.LayerBudget[l] = lc.Budget
			reads += min(float64(lc.Budget/s), meanP) + meanP/float64(s)
		}
		res.Layers = append(res.Layers, lc)
	}
	// The default budget serves layers past the calibrated ones: the
	// largest calibrated sparse budget.
	pol.BudgetTokens = s
	for _, b := range pol.LayerBudget {
		if b < plan.DenseBudget {
			pol.BudgetTokens = max(pol.BudgetTokens, b)
		}
	}
	res.Policy = pol
	// Uniform at the same reads: dense layers read P, the others K + P/S.
	layers := len(c.curves)
	uniform := func(dense int) int {
		sparse := layers - dense
		if sparse <= 0 {
			return 0
		}
		k := (reads - float64(dense)*meanP - float64(sparse)*meanP/float64(s)) / float64(sparse)
		if k < 1 {
			return 0
		}
		return int(math.Round(k)) * s
	}
	res.UniformBudget = uniform(min(c.cfg.Policy.DenseLayers, layers))
	res.UniformBudgetAll = uniform(0)
	return res, nil
}
