// Package demo runs `questctl demo`: a synthetic long context with a
// relevance reversal (many steps ask about entity A, then the query turns
// to entity B, whose few "needle" keys sit early in the context), decoded
// with Quest and with dense attention on the same data, printing per step
// the pages and bytes read against rho = 1/S + K/P, recall, attention-mass
// recall and the time of each phase.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/shard"
)

// Config sizes the demo. DefaultConfig documents the defaults.
type Config struct {
	Context     int    // tokens of prefilled context (65536)
	Steps       int    // decode steps (24); the query turns from A to B halfway
	Layers      int    // layers (4)
	DenseLayers int    // leading dense layers (2)
	QHeads      int    // query heads (32)
	KVHeads     int    // KV heads (8)
	HeadDim     int    // D (128)
	PageSize    int    // S (16)
	Budget      int    // token budget B per head (2048)
	Needles     int    // needle keys of entity B (4)
	Mentions    int    // keys of entity A (64)
	GQA         string // group_max or per_head
	Selector    string // quest, oracle, recent or dense
	Seed        uint64 // data seed (1)
	Workers     int    // CPU kernel workers besides the caller (0: GOMAXPROCS-1)
	CP          int    // context-parallel shards (1)
	TP          int    // tensor-parallel shards (1); divides KVHeads
	Selection   string // CP selection: exact, union or replicated
	// Backend runs the kernels (nil: a CPU backend with Workers workers;
	// the caller keeps and closes a backend it gives).
	Backend kernels.Backend
	// DeviceResident keeps the pages and page tables in the backend's
	// device memory (engine.Config.DeviceResident).
	DeviceResident bool
}

// DefaultConfig returns the defaults listed on Config.
func DefaultConfig() Config {
	return Config{Context: 65536, Steps: 24, Layers: 4, DenseLayers: 2, QHeads: 32, KVHeads: 8, HeadDim: 128,
		PageSize: 16, Budget: 2048, Needles: 4, Mentions: 64, GQA: "group_max", Selector: "quest", Seed: 1,
		CP: 1, TP: 1, Selection: "exact"}
}

// Validate reports whether the demo can run.
func (c Config) Validate() error {
	switch {
	case c.Context < 1 || c.Steps < 1 || c.Layers < 1 || c.QHeads < 1 || c.KVHeads < 1 || c.HeadDim < 1 || c.PageSize < 1:
		return errors.New("demo: context, steps, layers, heads, head dim and page size must be positive")
	case c.DenseLayers < 0 || c.Needles < 0 || c.Mentions < 0:
		return errors.New("demo: dense layers, needles and mentions must not be negative")
	case c.Needles+c.Mentions > c.Context/2:
		return fmt.Errorf("demo: %d needles + %d mentions do not fit in a %d-token context", c.Needles, c.Mentions, c.Context)
	case c.CP < 1 || c.TP < 1 || c.KVHeads%c.TP != 0:
		return fmt.Errorf("demo: cp %d and tp %d must be positive and tp must divide %d KV heads", c.CP, c.TP, c.KVHeads)
	case c.QHeads%c.KVHeads != 0:
		return fmt.Errorf("demo: %d query heads are not a multiple of %d KV heads", c.QHeads, c.KVHeads)
	case c.Budget < c.PageSize:
		return fmt.Errorf("demo: budget %d tokens is below one page of %d", c.Budget, c.PageSize)
	}
	if _, err := kernels.ParseGQAMode(c.GQA); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if _, err := shard.ParseSelector(c.Selector); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if _, err := engine.ParseSelection(c.Selection); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	return nil
}

// Summary is what the demo measured over all steps (sparse layers only).
type Summary struct {
	Steps            int
	SpeedupMean      float64 // dense attention time / Quest step time
	RecallA, RecallB float64 // mean top-10 recall while asking about A / B
	MassA, MassB     float64 // mean attention-mass recall
	NeedleHitRate    float64 // fraction of B-phase (step, sparse layer, KV head) with every needle page read
	RhoMeasured      float64 // bytes read / dense bytes
	RhoFormula       float64 // 1/S + K/P
	CollectiveShare  float64 // selection exchange + merge time / Quest step time
}

// Run builds the context, decodes, prints a table to w and returns the
// summary.
func Run(ctx context.Context, cfg Config, w io.Writer) (Summary, error) {
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	mode, err := kernels.ParseGQAMode(cfg.GQA)
	if err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	sel, err := shard.ParseSelector(cfg.Selector)
	if err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	selection, err := engine.ParseSelection(cfg.Selection)
	if err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	be := cfg.Backend
	if be == nil {
		cpu := kernels.NewCPU(kernels.CPUConfig{Workers: cfg.Workers})
		defer cpu.Close()
		be = cpu
	}
	pages := (cfg.Context+cfg.Steps+cfg.PageSize-1)/cfg.PageSize + 1
	ec := engine.DefaultConfig()
	ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize
	ec.CP, ec.TP, ec.Selection, ec.Backend = cfg.CP, cfg.TP, selection, be
	ec.CapacityPages = (pages+cfg.CP-1)/cfg.CP + 2
	ec.Policy.PageSize, ec.Policy.BudgetTokens, ec.Policy.DenseLayers, ec.Policy.GQA, ec.Policy.Selector = cfg.PageSize, cfg.Budget, cfg.DenseLayers, mode, sel
	ec.StepTimeout = time.Minute
	ec.DeviceResident = cfg.DeviceResident
	eng, err := engine.New(ec)
	if err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	defer eng.Close()
	kvBytes, sumBytes, _ := eng.Shard(0, 0).Store().Config().PoolBytes()
	shards := cfg.CP * cfg.TP
	fmt.Fprintf(w, "questrt demo: %d-token context, %d layers (%d dense), %d query / %d KV heads, D=%d, S=%d, budget %d tokens (K=%d pages), selector %s, %s\n",
		cfg.Context, cfg.Layers, cfg.DenseLayers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize, cfg.Budget, cfg.Budget/cfg.PageSize, sel, mode)
	where := "host memory"
	if cfg.DeviceResident {
		where = "device memory only"
	}
	fmt.Fprintf(w, "layout: cp %d x tp %d in-process shards, %s selection, %s backend, pages in %s; pools: %d x %.1f MiB K/V, %.1f MiB summaries (1/S of K+V, float32 sizes)\n",
		cfg.CP, cfg.TP, selection, be.Name(), where, shards, float64(kvBytes)/(1<<20), float64(sumBytes)/(1<<20))

	g := newGenerator(cfg)
	id, err := eng.Create(engine.Striped)
	if err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	t0 := time.Now()
	if err := g.prefill(ctx, eng, id, w); err != nil {
		return Summary{}, err
	}
	fmt.Fprintf(w, "prefill: %d tokens x %d layers in %.1fs; needles of B at tokens %v (page offsets %v)\n",
		cfg.Context, cfg.Layers, time.Since(t0).Seconds(), g.needles, g.needleOffsets())

	fmt.Fprintf(w, "\n%4s %3s %13s %7s %7s %6s %7s %7s %8s %7s %7s %7s %8s %9s %8s\n",
		"step", "ask", "pages read", "rho", "formula", "recall", "mass", "relL2", "score_ms", "topk_ms", "attn_ms", "coll_ms", "quest_ms", "dense_ms", "speedup")
	var sum Summary
	var nA, nB, hits, trials int
	var rhoNum, rhoDen float64
	var speedups []float64
	var res, dres, qres engine.Result
	var collT, totalT time.Duration
	for step := range cfg.Steps {
		askB := step >= cfg.Steps/2
		var read, total int
		var stepNum float64
		var recall, mass, rel float64
		var questT, denseT time.Duration
		var score, topk, attn, coll time.Duration
		sparse := 0
		for layer := range cfg.Layers {
			if err := ctx.Err(); err != nil {
				return sum, err
			}
			q := g.query(layer, askB)
			k, v := g.token()
			req := []engine.Request{{Seq: id, Q: q, K: k, V: v}}
			isSparse := layer >= cfg.DenseLayers
			if err := eng.Step(ctx, layer, req, engine.StepOptions{Diagnostics: isSparse}, &res); err != nil {
				return sum, fmt.Errorf("demo step %d layer %d: %w", step, layer, err)
			}
			if !isSparse {
				continue
			}
			req[0].K, req[0].V = nil, nil
			if err := eng.Step(ctx, layer, req, engine.StepOptions{ForceDense: true}, &dres); err != nil {
				return sum, fmt.Errorf("demo dense step %d layer %d: %w", step, layer, err)
			}
			// The timed Quest step: the same query without diagnostics,
			// as a server runs it (fused at CP 1, ranked at CP > 1).
			if err := eng.Step(ctx, layer, req, engine.StepOptions{}, &qres); err != nil {
				return sum, fmt.Errorf("demo quest step %d layer %d: %w", step, layer, err)
			}
			sparse++
			dg := res.Diag[0]
			pl := res.Plans[0]
			read += dg.PagesRead
			total += dg.PagesTotal
			recall += dg.Recall
			mass += dg.MassRecall
			rel += dg.RelL2
			score += res.Time.Score
			topk += res.Time.TopK
			attn += res.Time.Attend
			coll += qres.Time.Collective()
			questT += qres.Time.Total
			denseT += dres.Time.Total
			collT += qres.Time.Collective()
			totalT += qres.Time.Total
			summaryRead := 0
			if !pl.Dense {
				summaryRead = pl.Pages * cfg.KVHeads
			}
			stepNum += float64(dg.PagesRead) + float64(summaryRead)/float64(cfg.PageSize)
			rhoNum += float64(dg.PagesRead) + float64(summaryRead)/float64(cfg.PageSize)
			rhoDen += float64(dg.PagesTotal)
			if askB {
				for kvh := range cfg.KVHeads {
					trials++
					if g.needlesRead(dg.Selected[kvh*(cfg.QHeads/cfg.KVHeads)]) {
						hits++
					}
				}
			}
		}
		if sparse == 0 {
			fmt.Fprintf(w, "%4d %3s (every layer is dense)\n", step, ask(askB))
			continue
		}
		f := float64(sparse)
		rho := 0.0
		if total > 0 {
			rho = stepNum / float64(total)
		}
		formula := 1/float64(cfg.PageSize) + float64(cfg.Budget/cfg.PageSize)/float64(res.Plans[0].Pages)
		sp := float64(denseT) / float64(questT)
		speedups = append(speedups, sp)
		fmt.Fprintf(w, "%4d %3s %6d/%-6d %7.4f %7.4f %6.3f %7.4f %7.4f %8.2f %7.2f %7.2f %7.2f %8.2f %9.2f %7.1fx\n",
			step, ask(askB), read, total, rho, formula, recall/f, mass/f, rel/f,
			ms(score), ms(topk), ms(attn), ms(coll), ms(questT), ms(denseT), sp)
		if askB {
			sum.RecallB += recall / f
			sum.MassB += mass / f
			nB++
		} else {
			sum.RecallA += recall / f
			sum.MassA += mass / f
			nA++
		}
		sum.RhoFormula = formula
	}
	sum.Steps = cfg.Steps
	if nA > 0 {
		sum.RecallA /= float64(nA)
		sum.MassA /= float64(nA)
	}
	if nB > 0 {
		sum.RecallB /= float64(nB)
		sum.MassB /= float64(nB)
	}
	if trials > 0 {
		sum.NeedleHitRate = float64(hits) / float64(trials)
	}
	if rhoDen > 0 {
		sum.RhoMeasured = rhoNum / rhoDen
	}
	for _, s := range speedups {
		sum.SpeedupMean += s / float64(len(speedups))
	}
	if totalT > 0 {
		sum.CollectiveShare = float64(collT) / float64(totalT)
	}
	fmt.Fprintf(w, "\nsummary over sparse layers: speedup %.1fx (dense step time / Quest step time, same data), bytes rho %.4f (formula 1/S + K/P = %.4f); collectives %.1f%% of the Quest step time\n",
		sum.SpeedupMean, sum.RhoMeasured, sum.RhoFormula, 100*sum.CollectiveShare)
	fmt.Fprintf(w, "asking A: recall %.3f, mass recall %.4f; asking B: recall %.3f, mass recall %.4f; every needle page read in %.0f%% of B-phase (layer, KV head) selections\n",
		sum.RecallA, sum.MassA, sum.RecallB, sum.MassB, 100*sum.NeedleHitRate)
	fmt.Fprintf(w, "(rho counts K/V pages read plus summaries at 1/S of a page; pages read are (KV head, page) pairs; the tail page is always read;\n score/topk/attn_ms come from the step with diagnostics, run phase by phase; quest_ms and coll_ms from the same step without them, as served)\n")
	return sum, nil
}

func ask(b bool) string {
	if b {
		return "B"
	}
	return "A"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// generator makes the synthetic data: Gaussian noise keys, entity A keys at
// Mentions positions spread over the context, entity B's needle keys at a
// few early positions (at a page's start, middle and end), and queries that
// point at A or B.
type generator struct {
	cfg      Config
	rng      *rand.Rand
	dirA     [][]float32 // [layer][KVHeads*D] unit directions
	dirB     [][]float32
	isA      map[int]bool
	isB      map[int]bool
	needles  []int
	noiseAmp float32
	entAmp   float32
	qAmp     float32
}

func newGenerator(cfg Config) *generator {
	g := &generator{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 42)), isA: map[int]bool{}, isB: map[int]bool{}}
	d := cfg.HeadDim
	g.noiseAmp = 1
	g.entAmp = float32(math.Sqrt(float64(d)))
	g.qAmp = 3
	unit := func() []float32 {
		v := make([]float32, cfg.KVHeads*d)
		for h := range cfg.KVHeads {
			var n float64
			for j := range d {
				x := g.rng.NormFloat64()
				v[h*d+j] = float32(x)
				n += x * x
			}
			for j := range d {
				v[h*d+j] /= float32(math.Sqrt(n))
			}
		}
		return v
	}
	for range cfg.Layers {
		g.dirA = append(g.dirA, unit())
		g.dirB = append(g.dirB, unit())
	}
	// Needles in the first quarter, at a page start, middle and end.
	s := cfg.PageSize
	for i := range cfg.Needles {
		page := (i + 1) * (cfg.Context / 4 / s) / (cfg.Needles + 1)
		off := []int{0, s / 2, s - 1}[i%3]
		t := page*s + off
		g.needles = append(g.needles, t)
		g.isB[t] = true
	}
	for i := range cfg.Mentions {
		t := (i*cfg.Context)/max(cfg.Mentions, 1) + cfg.PageSize/3
		if t < cfg.Context && !g.isB[t] {
			g.isA[t] = true
		}
	}
	return g
}

func (g *generator) needleOffsets() []int {
	var o []int
	for _, t := range g.needles {
		o = append(o, t%g.cfg.PageSize)
	}
	return o
}

// needlesRead reports whether every needle page is in the attended list.
func (g *generator) needlesRead(sel []int32) bool {
	for _, t := range g.needles {
		p := int32(t / g.cfg.PageSize)
		found := false
		for _, x := range sel {
			if x == p {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func (g *generator) prefill(ctx context.Context, eng *engine.Engine, id engine.SeqID, w io.Writer) error {
	cfg := g.cfg
	tok := cfg.KVHeads * cfg.HeadDim
	const chunk = 4096
	k := make([]float32, chunk*tok)
	v := make([]float32, chunk*tok)
	state := uint64(cfg.Seed)*0x9e3779b97f4a7c15 + 1
	next := time.Now()
	for layer := range cfg.Layers {
		for t0 := 0; t0 < cfg.Context; t0 += chunk {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(chunk, cfg.Context-t0)
			state = gaussFill(k[:n*tok], state, g.noiseAmp)
			state = gaussFill(v[:n*tok], state, 1)
			for i := range n {
				var dir []float32
				switch t := t0 + i; {
				case g.isA[t]:
					dir = g.dirA[layer]
				case g.isB[t]:
					dir = g.dirB[layer]
				default:
					continue
				}
				for j := range tok {
					k[i*tok+j] += g.entAmp * dir[j]
				}
			}
			if err := eng.Append(id, layer, k[:n*tok], v[:n*tok]); err != nil {
				return fmt.Errorf("demo prefill layer %d: %w", layer, err)
			}
			if time.Now().After(next) {
				done := layer*cfg.Context + t0 + n
				fmt.Fprintf(w, "  building context: %5.1f%% (layer %d, token %d)\n", 100*float64(done)/float64(cfg.Layers*cfg.Context), layer, t0+n)
				next = time.Now().Add(time.Second)
			}
		}
	}
	return nil
}

// gaussFill fills x with approximately Gaussian values (sum of four
// uniforms, variance matched) times amp, from a splitmix64 state.
func gaussFill(x []float32, s uint64, amp float32) uint64 {
	for i := range x {
		var acc float32
		for range 2 {
			s += 0x9e3779b97f4a7c15
			z := s
			z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
			z = (z ^ (z >> 27)) * 0x94d049bb133111eb
			z ^= z >> 31
			acc += float32(uint32(z))/(1<<32) + float32(uint32(z>>32))/(1<<32)
		}
		// Sum of 4 U(0,1): mean 2, variance 1/3.
		x[i] = (acc - 2) * 1.7320508 * amp
	}
	return s
}

// query builds q for every query head: each group points at its KV head's
// A or B direction, with per-head noise.
func (g *generator) query(layer int, askB bool) []float32 {
	cfg := g.cfg
	d := cfg.HeadDim
	dir := g.dirA[layer]
	if askB {
		dir = g.dirB[layer]
	}
	gs := cfg.QHeads / cfg.KVHeads
	q := make([]float32, cfg.QHeads*d)
	for h := range cfg.QHeads {
		kvh := h / gs
		for j := range d {
			q[h*d+j] = g.qAmp*dir[kvh*d+j]*float32(math.Sqrt(float64(d)))/2 + float32(g.rng.NormFloat64())*0.5
		}
	}
	return q
}

// token makes the new decode token's k and v (noise).
func (g *generator) token() ([]float32, []float32) {
	n := g.cfg.KVHeads * g.cfg.HeadDim
	k := make([]float32, n)
	v := make([]float32, n)
	for i := range k {
		k[i] = float32(g.rng.NormFloat64()) * g.noiseAmp
		v[i] = float32(g.rng.NormFloat64())
	}
	return k, v
}
