package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/readlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// runFlags are the model and runtime flags that generate and eval share.
type runFlags struct {
	model       string
	pageSize    int
	sink, local int
	denseLayers int
	denseRho    float64
	hierGroup   int
	topP        float64
	subBoxes    int
	reuseSteps  int
	// reuseLayers is --reuse-layers; layers its parsed list.
	reuseLayers string
	layers      []int
	gqa         string
	cp, tp      int
	selection   string
	workers     int
	maxMem      *int64
	summary     *summaryDTypeValue
	// policyFile is --policy; file is its policy once check has read it.
	policyFile string
	file       *plan.Policy
	fs         *flag.FlagSet
}

func addRunFlags(fs *flag.FlagSet) *runFlags {
	f := &runFlags{fs: fs}
	p := plan.DefaultPolicy()
	fs.StringVar(&f.policyFile, "policy", "", "policy file (YAML, as questctl calibrate --out writes it): page size, sink, local, GQA, dense layers, default and per-layer budgets; flags given explicitly override its values")
	fs.StringVar(&f.model, "model", "", "checkpoint directory: config.json and model.safetensors (or a sharded index); required")
	fs.IntVar(&f.pageSize, "page-size", p.PageSize, "tokens per page S (1..4096)")
	fs.IntVar(&f.sink, "sink", p.SinkPages, "first pages always read (0..)")
	fs.IntVar(&f.local, "local", p.LocalPages, "last pages always read, the tail page included (0..)")
	fs.IntVar(&f.denseLayers, "dense-layers", p.DenseLayers, "leading layers that always attend densely (0..)")
	fs.Float64Var(&f.denseRho, "dense-rho", 0, "a sparse layer reads every page while Quest would read at least this share R of the dense bytes, 1/S + K/P >= R (0..2; 0: off, dense only when K >= P)")
	fs.IntVar(&f.hierGroup, "hier-group", 0, "rank the quest selector's pages by an exact best-first search over boxes of G pages (2..1024; 0: flat scoring); the same pages as flat, on the CPU backend's host pools")
	fs.Float64Var(&f.topP, "attn-top-p", 0, "top-p over attention (not sampling: see --top-p of generate): after the page selection keep, per KV head, the union of its query heads' smallest token sets reaching softmax mass P, and attend only those (0 < P <= 1; 0 or 1: off); the CPU backend only")
	fs.IntVar(&f.subBoxes, "sub-boxes", 0, "multi-box summaries: rank quest's pages by the best of C contiguous min/max sub-boxes per page and KV head, each over S/C slots (C divides the page size, up to 64; 0 or 1: one box); the CPU backend's host float32 pools only, not with --hier-group")
	fs.IntVar(&f.reuseSteps, "reuse-steps", 0, "selection reuse: a sparse layer ranks pages afresh every R-th decode step of a sequence and in between attends its last selection plus every page that became a candidate since (0..4096; 0 or 1: every step ranks)")
	fs.StringVar(&f.reuseLayers, "reuse-layers", "", "selection reuse across layers: comma-separated layers (ascending, each after a sparse layer) that attend the pages the layer before them selected at the same step instead of ranking (\"\": every sparse layer ranks)")
	fs.StringVar(&f.gqa, "gqa", "group_max", "GQA page sharing: group_max or per_head")
	f.cp, f.tp = 1, 1
	gridFlags(fs, &f.cp, &f.tp, "context-parallel shards in process (1..64)", "tensor-parallel shards in process (divides the model's KV heads)")
	fs.StringVar(&f.selection, "selection", "exact", "CP selection: exact, union or replicated")
	fs.IntVar(&f.workers, "workers", 0, "goroutines of the model's matrix products and prefill attention (0: GOMAXPROCS)")
	f.maxMem = maxMemoryFlag(fs)
	f.summary = summaryDTypeFlag(fs, "")
	return f
}

// check reads --policy (its values fill the flags not given) and
// validates the shared flags; each error names its flag.
func (f *runFlags) check() error {
	if f.policyFile != "" {
		fh, err := os.Open(f.policyFile)
		if err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
		p, err := plan.ReadPolicyFile(fh)
		fh.Close()
		if err != nil {
			return fmt.Errorf("--policy %s: %w", f.policyFile, err)
		}
		f.file = &p
		for name, set := range map[string]func(){
			"page-size": func() { f.pageSize = p.PageSize }, "sink": func() { f.sink = p.SinkPages },
			"local": func() { f.local = p.LocalPages }, "dense-layers": func() { f.denseLayers = p.DenseLayers },
			"dense-rho":    func() { f.denseRho = p.DenseRho },
			"hier-group":   func() { f.hierGroup = p.HierGroup },
			"attn-top-p":   func() { f.topP = p.TopP },
			"sub-boxes":    func() { f.subBoxes = p.SubBoxes },
			"reuse-steps":  func() { f.reuseSteps = p.ReuseSteps },
			"reuse-layers": func() { f.layers = slices.Clone(p.ReuseLayers) },
			"gqa":          func() { f.gqa = p.GQA.String() },
		} {
			if !flagSet(f.fs, name) {
				set()
			}
		}
	}
	if flagSet(f.fs, "reuse-layers") || f.policyFile == "" {
		f.layers = nil
		if strings.TrimSpace(f.reuseLayers) != "" {
			ls, err := intList(f.reuseLayers)
			if err != nil {
				return fmt.Errorf("--reuse-layers: %w", err)
			}
			f.layers = ls
		}
	}
	for i, l := range f.layers {
		if i > 0 && l <= f.layers[i-1] {
			return fmt.Errorf("--reuse-layers %v: want ascending layers, each once", f.layers)
		}
	}
	switch {
	case f.model == "":
		return errors.New("--model is required (a checkpoint directory)")
	case f.pageSize < 1 || f.pageSize > 4096:
		return fmt.Errorf("--page-size %d: want 1..4096", f.pageSize)
	case f.sink < 0:
		return fmt.Errorf("--sink %d: want 0 or more pages", f.sink)
	case f.local < 0:
		return fmt.Errorf("--local %d: want 0 or more pages", f.local)
	case f.denseLayers < 0:
		return fmt.Errorf("--dense-layers %d: want 0 or more", f.denseLayers)
	case !(f.denseRho >= 0 && f.denseRho <= plan.MaxDenseRho):
		return fmt.Errorf("--dense-rho %v: want 0..%v", f.denseRho, plan.MaxDenseRho)
	case f.hierGroup != 0 && (f.hierGroup < 2 || f.hierGroup > plan.MaxHierGroup):
		return fmt.Errorf("--hier-group %d: want 0 (off) or 2..%d", f.hierGroup, plan.MaxHierGroup)
	case f.topP != 0 && !(f.topP > 0 && f.topP <= 1):
		return fmt.Errorf("--attn-top-p %v: want 0 (off) or a mass in (0, 1]", f.topP)
	case f.subBoxes < 0 || f.subBoxes > plan.MaxSubBoxes || (f.subBoxes > 1 && f.pageSize%f.subBoxes != 0):
		return fmt.Errorf("--sub-boxes %d: want 0 or 1 (off) or a divisor of the page size %d up to %d", f.subBoxes, f.pageSize, plan.MaxSubBoxes)
	case f.subBoxes > 1 && f.hierGroup != 0:
		return fmt.Errorf("--sub-boxes %d with --hier-group %d: the box trees are built over single page boxes", f.subBoxes, f.hierGroup)
	case f.reuseSteps < 0 || f.reuseSteps > plan.MaxReuseSteps:
		return fmt.Errorf("--reuse-steps %d: want 0..%d (0 or 1: off)", f.reuseSteps, plan.MaxReuseSteps)
	case f.cp < 1 || f.cp > 64:
		return fmt.Errorf("--cp %d: want 1..64", f.cp)
	case f.tp < 1 || f.tp > 64:
		return fmt.Errorf("--tp %d: want 1..64", f.tp)
	case f.workers < 0 || f.workers > 256:
		return fmt.Errorf("--workers %d: want 0..256", f.workers)
	}
	if _, err := plan.ParseGQAMode(f.gqa); err != nil {
		return fmt.Errorf("--gqa: %w", err)
	}
	if _, err := engine.ParseSelection(f.selection); err != nil {
		return fmt.Errorf("--selection: %w", err)
	}
	return nil
}

// policy is the selection policy of the flags for one selector and budget
// (budget 0: a budget of one page, overridden per request).
func (f *runFlags) policy(selector string, budget int) (plan.Policy, error) {
	p := plan.DefaultPolicy()
	p.PageSize, p.SinkPages, p.LocalPages, p.DenseLayers, p.DenseRho = f.pageSize, f.sink, f.local, f.denseLayers, f.denseRho
	p.HierGroup = f.hierGroup
	p.TopP = f.topP
	p.SubBoxes = f.subBoxes
	p.ReuseSteps = f.reuseSteps
	p.ReuseLayers = slices.Clone(f.layers)
	p.BudgetTokens = max(budget, f.pageSize)
	p.GQA, _ = plan.ParseGQAMode(f.gqa)
	sel, err := plan.ParseSelector(selector)
	if err != nil {
		return p, fmt.Errorf("--selector: %w", err)
	}
	p.Selector = sel
	p.SummaryDType = f.summary.types[0]
	if f.file != nil && len(f.file.LayerBudget) > 0 {
		p.LayerBudget = maps.Clone(f.file.LayerBudget)
	}
	return p, p.Validate()
}

// load opens the checkpoint and its tokenizer (tokenizer.json byte-level
// BPE, or the byte tokenizer of the test models).
func (f *runFlags) load() (*model.Model, model.Tokenizer, error) {
	m, err := model.Load(f.model, model.LoadOptions{MemoryLimit: *f.maxMem, Workers: f.workers})
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, model.ErrConfig) || errors.Is(err, model.ErrUnsupported) {
			return nil, nil, usageError{fmt.Errorf("--model %s: %w", f.model, err)}
		}
		return nil, nil, err
	}
	m.MemoryLimit = *f.maxMem
	tok, err := model.LoadTokenizer(f.model, m.Config)
	if err != nil {
		m.Close()
		if errors.Is(err, model.ErrUnsupported) || errors.Is(err, model.ErrTokenizer) {
			return nil, nil, usageError{fmt.Errorf("--model %s: %w", f.model, err)}
		}
		return nil, nil, err
	}
	return m, tok, nil
}

// engineConfig is the engine configuration for m with policy p and room
// for seqs sequences of tokens tokens each.
func (f *runFlags) engineConfig(m *model.Model, p plan.Policy, tokens, seqs int) engine.Config {
	pages := (tokens + f.pageSize - 1) / f.pageSize
	per := (pages+f.cp-1)/f.cp + 2
	cfg := engine.ModelConfig(m.Geometry(), p, per*seqs)
	cfg.CP, cfg.TP = f.cp, f.tp
	cfg.Selection, _ = engine.ParseSelection(f.selection)
	cfg.MemoryLimit = *f.maxMem
	return cfg
}

// engine builds an in-process engine for m with policy p and room for
// seqs sequences of tokens tokens each.
func (f *runFlags) engine(m *model.Model, p plan.Policy, tokens, seqs int) (*engine.Engine, error) {
	cfg := f.engineConfig(m, p, tokens, seqs)
	if err := cfg.Validate(); err != nil {
		return nil, usageError{err}
	}
	return engine.New(cfg)
}

// genStep is one generated token in generate's JSON summary.
type genStep struct {
	Step       int     `json:"step"`
	Token      int     `json:"token"`
	Text       string  `json:"text"`
	PagesRead  int     `json:"pages_read"`
	PagesTotal int     `json:"pages_total"`
	Rho        float64 `json:"rho"`
	RhoFormula float64 `json:"rho_formula"`
	SparseRho  float64 `json:"sparse_rho,omitempty"`
	StepUS     float64 `json:"step_us"`
	AttnUS     float64 `json:"attention_us"`
	ScoreUS    float64 `json:"score_us"`
	TopKUS     float64 `json:"topk_us"`
	SelectUS   float64 `json:"select_us"`
	AttendUS   float64 `json:"attend_us"`
	MergeUS    float64 `json:"merge_us"`
	FusedUS    float64 `json:"fused_us"`
	Recall     float64 `json:"recall,omitempty"`
	MassRecall float64 `json:"mass_recall,omitempty"`
}

// genRun is one decode run (the selected policy, or the dense baseline).
type genRun struct {
	Selector       string    `json:"selector"`
	Budget         int       `json:"budget"`
	Text           string    `json:"text"`
	Tokens         []int     `json:"tokens"`
	DecodeSteps    int       `json:"decode_steps"`
	DecodeSeconds  float64   `json:"decode_seconds"`
	TokensPerS     float64   `json:"tokens_per_s"`
	AttentionShare float64   `json:"attention_share"`
	PagesRead      int       `json:"pages_read"`
	PagesTotal     int       `json:"pages_total"`
	Rho            float64   `json:"rho"`
	RhoFormula     float64   `json:"rho_formula"`
	Steps          []genStep `json:"steps"`
}

// genSummary is generate's --json output.
type genSummary struct {
	Model          string  `json:"model"`
	PromptTokens   int     `json:"prompt_tokens"`
	PageSize       int     `json:"page_size"`
	DenseLayers    int     `json:"dense_layers"`
	CP             int     `json:"cp"`
	TP             int     `json:"tp"`
	PrefillSeconds float64 `json:"prefill_seconds"`
	PrefillTokensS float64 `json:"prefill_tokens_per_s"`
	genRun
	Dense   *genRun `json:"dense,omitempty"`
	Speedup float64 `json:"speedup_vs_dense,omitempty"`
}

func runGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, generateCommand, args, stdout, stderr)
}

// generateCommand builds the flags and the action of
// 'questctl generate' without running it (see [runCommand]).
func generateCommand() (*flag.FlagSet, action) {
	fs := newFlags("generate", `Usage: questctl generate --model DIR --prompt TEXT|--prompt-file F [flags]

Loads a Llama checkpoint (its tokenizer.json byte-level BPE, or the byte
tokenizer of the test models), prefills the prompt (BOS first)
with dense attention into the in-process engine's KV pages, then decodes
up to --max-tokens tokens, each decode step running every layer through
the engine's page selection (--selector, --budget; the first
--dense-layers layers stay dense). With --addr the KV pages live on a
questd cluster instead (the sequence created with the model's geometry,
this policy and --cp x --tp; the model itself runs here). The text streams to stdout as it is
produced; per-step pages read vs total, bytes read vs dense (rho, next to
the formula 1/S + K/P) and phase times go to stderr, then a summary.
Without --diagnostics the pages read are the step plans' (K pages per KV
head, which group_max selection reads exactly), so rho equals the formula
by construction; --diagnostics counts the (KV head, page) pairs attention
actually read (per_head reads the union of its heads' pages). Then:
prefill and decode tokens/s and the share of decode time spent in
attention. --compare-dense decodes a second time from the same prefill
(a fork of the sequence) with dense attention and reports both speeds
and the speedup. --json prints one JSON object on stdout instead of the
text (progress stays on stderr).`)
	rf := addRunFlags(fs)
	prompt := fs.String("prompt", "", "prompt text")
	promptFile := fs.String("prompt-file", "", fmt.Sprintf("file holding the prompt text (instead of --prompt; at most %s)", memlimit.Bytes(maxInputFile)))
	maxTokens := fs.Int("max-tokens", 32, "most tokens to generate (1..1000000)")
	temperature := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	topP := fs.Float64("top-p", 1, "nucleus sampling: keep the most likely tokens up to this probability (0..1; 1: all)")
	seed := fs.Uint64("seed", 0, "sampling seed")
	budget := fs.Int("budget", plan.DefaultPolicy().BudgetTokens, "token budget B per KV head and step (page budget K = B/S; at least --page-size)")
	selector := fs.String("selector", "quest", "page selector of decode steps: quest, oracle, recent or dense")
	noStop := fs.Bool("no-stop", false, "keep generating after EOS")
	compare := fs.Bool("compare-dense", false, "also decode from the same prefill with dense attention and report the speedup")
	addr := fs.String("addr", "", "decode through the questd node at host:port (plaintext, or TLS with --tls-dir or --ca, --tls-cert and --tls-key): the sequence is created there with the model's geometry and these flags' policy and --cp x --tp grid")
	diag := fs.Bool("diagnostics", false, "measure every sparse step against dense attention (recall of the dense top-10 tokens, attention-mass recall; costs a dense pass per layer)")
	asJSON := fs.Bool("json", false, "print a JSON summary on stdout instead of the text")
	backend := fs.String("backend", "cpu", "where the model decodes: cpu, or cuda (a build with -tags cuda: the prompt prefilled on the CPU into pages on GPU 0, then every decode step on the GPU through model/gpu; one rank, in process)")
	kvDType := kvCacheDTypeFlag(fs, "; generate's pages on GPU 0")
	conn := addConnFlags(fs)
	tokenFile := tokenFileFlag(fs)
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		if err := rf.check(); err != nil {
			return usageError{err}
		}
		if rf.file != nil {
			if !flagSet(fs, "budget") {
				*budget = rf.file.BudgetTokens
			}
			if !flagSet(fs, "selector") {
				*selector = rf.file.Selector.String()
			}
		}
		switch {
		case *maxTokens < 1 || *maxTokens > 1000000:
			return usageError{fmt.Errorf("--max-tokens %d: want 1..1000000", *maxTokens)}
		case *budget < rf.pageSize:
			return usageError{fmt.Errorf("--budget %d: want at least one page (--page-size %d)", *budget, rf.pageSize)}
		case flagSet(fs, "prompt") == flagSet(fs, "prompt-file"):
			return usageError{errors.New("--prompt or --prompt-file: give exactly one")}
		}
		switch {
		case *backend != "cpu" && *backend != "cuda":
			return usageError{fmt.Errorf("--backend %q: want cpu or cuda", *backend)}
		case *backend == "cpu" && givenAs(fs, "kv-cache-dtype") != "":
			return usageError{fmt.Errorf("%s needs --backend cuda (the CPU backend stores float32)", givenAs(fs, "kv-cache-dtype"))}
		case *backend == "cuda":
			for _, name := range []string{"addr", "compare-dense", "diagnostics", "cp", "tp", "selection"} {
				if flagSet(fs, name) {
					return usageError{fmt.Errorf("--%s is not available with --backend cuda (the device executor decodes through an in-process engine of one rank)", name)}
				}
			}
			if err := cudaAvailable(); err != nil {
				return err
			}
		}
		sampler, err := model.NewSampler(*temperature, *topP, *seed)
		if err != nil {
			return usageError{fmt.Errorf("--temperature/--top-p: %w", err)}
		}
		pol, err := rf.policy(*selector, *budget)
		if err != nil {
			return usageError{err}
		}
		if *backend == "cuda" && pol.TopPOn() {
			return usageError{fmt.Errorf("--attn-top-p %v is not available with --backend cuda: %w", pol.TopP, kernels.ErrTopPUnsupported)}
		}
		if *backend == "cuda" && pol.SubBoxesOn() {
			return usageError{fmt.Errorf("--sub-boxes %d is not available with --backend cuda: %w", pol.SubBoxes, kernels.ErrSubBoxes)}
		}
		if *backend == "cuda" && pol.Selector != plan.Quest {
			return usageError{fmt.Errorf("--selector %s is not available with --backend cuda (the device step runs quest selection; a dense layer is a budget that holds the context)", pol.Selector)}
		}
		text := *prompt
		if *promptFile != "" {
			b, err := readlimit.ReadFile(*promptFile, maxInputFile)
			if err != nil {
				return usageError{fmt.Errorf("--prompt-file: %w", err)}
			}
			text = string(b)
		}
		m, tok, err := rf.load()
		if err != nil {
			return err
		}
		defer m.Close()
		ids := model.PromptIDs(tok, text)
		total := len(ids) + *maxTokens
		if mp := m.Config.MaxPositions; mp > 0 && total > mp {
			return usageError{fmt.Errorf("--max-tokens %d: the prompt's %d tokens plus %d exceed the model's %d positions", *maxTokens, len(ids), *maxTokens, mp)}
		}
		gopt := model.GenerateOptions{MaxTokens: *maxTokens, Sampler: sampler}
		if !*noStop {
			gopt.StopTokens = model.StopIDs(tok, m.Config)
		}
		if *backend == "cuda" {
			return generateCUDA(ctx, gpuGenerate{rf: rf, m: m, tok: tok, ids: ids, pol: pol, budget: *budget, opt: gopt,
				kvDType: *kvDType, total: total, asJSON: *asJSON}, stdout, stderr)
		}
		seqs := 1
		if *compare {
			seqs = 3
		}
		var attn *model.EngineAttention
		if *addr != "" {
			ec := rf.engineConfig(m, pol, total, seqs)
			if err := ec.Validate(); err != nil {
				return usageError{err}
			}
			token, err := readTokenFile(*tokenFile)
			if err != nil {
				return err
			}
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			cl, err := conn.dial(dctx, *addr, token)
			if err != nil {
				cancel()
				return fmt.Errorf("--addr %q: %w", *addr, err)
			}
			defer cl.Close()
			id, nodes, err := cl.CreateWith(dctx, plan.Striped, remote.GridConfigProto(ec.WorkerConfig()))
			cancel()
			if err != nil {
				return fmt.Errorf("--addr %q: create: %w", *addr, err)
			}
			fmt.Fprintf(stderr, "sequence %s on nodes %v\n", id, nodes)
			attn = model.NewAttentionOf(client.Sequence{C: cl, ID: id}, m.Geometry())
			defer attn.Release()
		} else {
			eng, err := rf.engine(m, pol, total, seqs)
			if err != nil {
				return err
			}
			defer eng.Close()
			if attn, err = model.NewEngineAttention(eng, m.Geometry()); err != nil {
				return err
			}
		}
		attn.Workers = rf.workers
		fmt.Fprintf(stderr, "prefill: %d tokens (%s, %d layers, %d/%d heads of %d) ...\n", len(ids), rf.model, m.Config.Layers, m.Config.Heads, m.Config.KVHeads, m.Config.HeadDim)
		var pre model.Timing
		logits, err := m.Forward(ctx, attn, ids, model.ForwardOptions{Timing: &pre})
		if err != nil {
			return err
		}
		sum := genSummary{Model: rf.model, PromptTokens: len(ids), PageSize: rf.pageSize, DenseLayers: rf.denseLayers, CP: rf.cp, TP: rf.tp,
			PrefillSeconds: pre.Total.Seconds(), PrefillTokensS: float64(len(ids)) / pre.Total.Seconds()}
		fmt.Fprintf(stderr, "prefill: %d tokens in %.2fs (%.0f tokens/s, attention %.0f%%)\n", len(ids), pre.Total.Seconds(), sum.PrefillTokensS, 100*pre.Attention.Seconds()/pre.Total.Seconds())
		var base *model.EngineAttention
		if *compare {
			if base, err = attn.Fork(); err != nil {
				return err
			}
		}
		if *diag {
			attn.Options.Diagnostics = true
		}
		stream := stdout
		if *asJSON {
			stream = io.Discard
		}
		run, err := decode(ctx, m, tok, attn, logits, gopt, pol, *budget, stream, stderr)
		if err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintln(stdout)
		}
		sum.genRun = run
		report(stderr, "decode", &run)
		if *compare {
			base.Options.ForceDense = true
			s2, _ := model.NewSampler(*temperature, *topP, *seed)
			gopt.Sampler = s2
			fmt.Fprintln(stderr, "dense baseline: decoding again from the same prefill with every page read ...")
			d, err := decode(ctx, m, tok, base, logits, gopt, pol, 0, io.Discard, stderr)
			if err != nil {
				return err
			}
			d.Selector = "dense"
			report(stderr, "dense", &d)
			sum.Dense = &d
			if d.TokensPerS > 0 {
				sum.Speedup = run.TokensPerS / d.TokensPerS
				fmt.Fprintf(stderr, "speedup vs dense: %.2fx tokens/s (same %d-token prefill)\n", sum.Speedup, len(ids))
			}
			if d.Text != run.Text {
				fmt.Fprintf(stderr, "note: dense attention generated %q\n", d.Text)
			}
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			return enc.Encode(sum)
		}
		return nil
	}
}

// decode continues a prefilled sequence, streaming the text to out and a
// line per step to log.
func decode(ctx context.Context, m *model.Model, tok model.Tokenizer, attn *model.EngineAttention, logits []float32, opt model.GenerateOptions, pol plan.Policy, budget int, out, log io.Writer) (genRun, error) {
	run := genRun{Selector: pol.Selector.String(), Budget: budget}
	var dec model.Timing
	opt.Decode = &dec
	last := time.Now()
	var read, dense, rhoF float64
	opt.OnToken = func(i, id int) error {
		now := time.Now()
		s := model.TokenText(tok, id)
		fmt.Fprint(out, s)
		st := genStep{Step: i, Token: id, Text: s}
		if i > 0 {
			sm := model.Summarize(attn.Steps(), pol.PageSize)
			st.PagesRead, st.PagesTotal = sm.PagesRead, sm.PagesTotal
			st.Rho, st.RhoFormula, st.SparseRho = sm.Rho, sm.RhoFormula, sm.SparseRho
			st.StepUS = us(now.Sub(last))
			st.ScoreUS, st.TopKUS, st.SelectUS, st.AttendUS, st.MergeUS, st.FusedUS, st.AttnUS =
				us(sm.Score), us(sm.TopK), us(sm.Select), us(sm.Attend), us(sm.Merge), us(sm.Fused), us(sm.Total)
			if attn.Options.Diagnostics {
				var n int
				for _, ls := range attn.Steps() {
					if !ls.Plan.Dense {
						st.Recall += ls.Recall
						st.MassRecall += ls.MassRecall
						n++
					}
				}
				if n > 0 {
					st.Recall /= float64(n)
					st.MassRecall /= float64(n)
				}
			}
			read += sm.Rho * float64(sm.PagesTotal)
			dense += float64(sm.PagesTotal)
			rhoF += sm.RhoFormula
			run.PagesRead += sm.PagesRead
			run.PagesTotal += sm.PagesTotal
			fmt.Fprintf(log, "step %d %s: pages %d/%d (%.1f%%), rho %.3f (formula %.3f), step %.1f ms, attention %.1f ms\n",
				i, strconv.Quote(s), st.PagesRead, st.PagesTotal, 100*float64(st.PagesRead)/float64(max(st.PagesTotal, 1)), st.Rho, st.RhoFormula, st.StepUS/1e3, st.AttnUS/1e3)
		}
		run.Steps = append(run.Steps, st)
		run.Tokens = append(run.Tokens, id)
		last = time.Now()
		return nil
	}
	if _, err := m.Continue(ctx, attn, logits, opt); err != nil {
		return run, err
	}
	run.Text = tok.Decode(run.Tokens)
	run.DecodeSteps = len(run.Tokens) - 1
	run.DecodeSeconds = dec.Total.Seconds()
	if dec.Total > 0 {
		run.TokensPerS = float64(run.DecodeSteps) / dec.Total.Seconds()
		run.AttentionShare = dec.Attention.Seconds() / dec.Total.Seconds()
	}
	if dense > 0 {
		run.Rho = read / dense
		run.RhoFormula = rhoF / float64(run.DecodeSteps)
	}
	return run, nil
}

func report(w io.Writer, what string, r *genRun) {
	if r.DecodeSteps == 0 {
		fmt.Fprintf(w, "%s: one token from the prefill, no decode step\n", what)
		return
	}
	fmt.Fprintf(w, "%s (%s): %d steps in %.2fs, %.2f tokens/s, attention %.0f%% of step time; pages read %d of %d (%.1f%%), rho %.3f (formula %.3f)\n",
		what, r.Selector, r.DecodeSteps, r.DecodeSeconds, r.TokensPerS, 100*r.AttentionShare,
		r.PagesRead, r.PagesTotal, 100*float64(r.PagesRead)/math.Max(float64(r.PagesTotal), 1), r.Rho, r.RhoFormula)
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// gpuGenerate is what generate hands to generateCUDA.
type gpuGenerate struct {
	rf      *runFlags
	m       *model.Model
	tok     model.Tokenizer
	ids     []int
	pol     plan.Policy
	budget  int
	opt     model.GenerateOptions
	kvDType string
	total   int // prompt plus generated tokens: the pages to make room for
	asJSON  bool
}
