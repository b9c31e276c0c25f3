package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/internal/evalengine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/readlimit"
	"github.com/questrt/questrt/plan"
)

func runEval(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h" || args[0] == "-help") {
			fmt.Fprint(stdout, "Usage: questctl eval passkey [flags]\n\nRun 'questctl eval passkey --help' for its flags.\n")
			return nil
		}
		return usageError{errors.New("want an evaluation name: passkey")}
	}
	if args[0] != "passkey" {
		return usageError{fmt.Errorf("unknown evaluation %q (want passkey)", args[0])}
	}
	return runEvalPasskey(ctx, args[1:], stdout, stderr)
}

func runEvalPasskey(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, evalPasskeyCommand, args, stdout, stderr)
}

// evalPasskeyCommand builds the flags and the action of
// 'questctl eval passkey' without running it (see [runCommand]).
func evalPasskeyCommand() (*flag.FlagSet, action) {
	fs := newFlags("eval passkey", `Usage: questctl eval passkey --model DIR [flags]

Passkey retrieval (notes 2.2, 3.3). For every length, --n prompts in the
format the test models were trained on (intro, filler sentences, the
fact at a random depth or at --depths, the question; --keys k for k named
keys), or the prompts of --prompts FILE (JSON lines {"prompt", "answer",
"length"}). Each prompt is prefilled densely once; its answer is decoded
with dense attention (the baseline, budget 0) and with every selector
and budget on forks of the prefilled sequence: free-running greedy
(accuracy) and teacher-forced on the dense answer (token agreement,
KL(dense || policy) of the next-token distributions). With diagnostics
(default) every sparse decode step is also measured against dense
attention on the same pages: per layer, recall of the dense top-10
tokens and attention-mass recall 1 - eps; per layer and head, output
cosine and relative L2 error; pages read vs dense next to the byte model
rho = 1/S + K/P. --hier-group G ranks quest's pages by the exact
hierarchical search (the same pages as flat; with --no-diagnostics,
which the search needs) and the JSON phases carry "hier": the summary
records read per (row, step) against the candidates. --attn-top-p P prunes
each sparse step's selected tokens to the smallest sets reaching softmax
mass P (per query head, a KV head reading its heads' union) and the
JSON phases carry "top_p": tokens kept per (KV head, step), mean, p50,
p95 and max. --sub-boxes C ranks quest's pages by C min/max
sub-boxes per page (multi-box summaries; the score reads C x 2 x D
summary values per page and KV head). --decode-question feeds the question through decode
steps so that selection follows the query as it forms. --stop-rule
replays the stop rules of notes 3.2 on every teacher-forced sparse step
(per query head, float64 from the keys): the exact top-R branch and
bound (pages opened per row, fallback rate), the softmax-mass bound, and
the score-gap budget (calibrated on the even prompts, tested on the odd
ones); nothing it reports changes the pages the runs read.
--summary-dtype takes a comma-separated list here (bf16,fp8): every
sparse run is made with each summary type, on the same prompts and
prefill, and the results carry summary_dtype.

--task reversal builds relevance-reversal prompts instead (notes 3.3):
two named keys, B's stated once early (near --depths, one depth,
default random in [0.05, 0.35)), A's stated --reversal-repeats times
over the rest of the filler, the last right before the question, which
asks for B. B's fact is placed so that its code's first digit falls at
each of --offsets in its KV page (start = token 0 of the page, middle =
S/2, end = S-1, or a token offset; any = no alignment), counting the
BOS token: --reversal-align block (default) keeps facts at filler-block
boundaries, B's alone or right after A's first statement, the nearest
such point to the depth; sentence allows any sentence start and pad
adds spaces (both outside the trained format). --n prompts per offset;
results are per (length, offset, selector, budget), the JSON lines
carrying "task" and "offset".

Results go to stdout when a length is done: a table (pages, rho and
1/S+K/P over the sparse layers, teacher-forced), or with --json one JSON
line per (length, selector, budget) with at least length, selector,
budget (0 for dense), n and accuracy. Progress goes to stderr.`)
	rf := addRunFlags(fs)
	rf.summary.list = true // a list: every sparse run with each type
	lengths := fs.String("lengths", "2048,8192", "comma-separated prompt lengths in bytes (64..1048576)")
	budgets := fs.String("budgets", "64,128,256,512", "comma-separated token budgets (each at least --page-size); \"policy\" (with --policy): the policy file's own per-layer budgets")
	selectors := fs.String("selectors", "quest", "comma-separated sparse selectors: quest, oracle, recent (dense always runs as the baseline)")
	n := fs.Int("n", 40, "prompts per length (1..100000)")
	seed := fs.Uint64("seed", 1, "prompt seed")
	keys := fs.Int("keys", 1, "keys per prompt (1..10; k > 1: named keys, the question asks for one)")
	depths := fs.String("depths", "", "comma-separated fact depths in [0, 1], one per key or one for all (default: random)")
	prompts := fs.String("prompts", "", fmt.Sprintf("JSON-lines prompt file instead of generated prompts (at most %s)", memlimit.Bytes(maxInputFile)))
	decodeQ := fs.Bool("decode-question", false, "feed the question's tokens through decode steps with the policy's selection instead of prefilling them")
	stopRule := fs.Bool("stop-rule", false, "replay the stop rules of notes 3.2 on every sparse step (needs diagnostics): exact top-R branch and bound (pages opened, fallback), the softmax-mass bound, and the score-gap budget calibrated on the even prompts and tested on the odd ones; a report per length and budget after the results")
	noDiag := fs.Bool("no-diagnostics", false, "skip the per-step comparison with dense attention (recall, mass recall, cosine)")
	asJSON := fs.Bool("json", false, "JSON lines on stdout instead of a table")
	plotOut := fs.String("plot", "", "after the run, draw accuracy vs budget and mass recall per layer to this PNG file (as 'questctl plot')")
	task := fs.String("task", "passkey", "prompts: passkey, or reversal (B asked after A was repeated; see above)")
	revRepeats := fs.Int("reversal-repeats", eval.DefaultReversalRepeats, "--task reversal: how often A's fact is stated (1..100)")
	offsets := fs.String("offsets", "start,middle,end", "--task reversal: comma-separated in-page offsets of B's first digit: start, middle, end, any or a token offset")
	revAlign := fs.String("reversal-align", eval.AlignBlock, "--task reversal: how B is moved to its offset: block (filler-block boundaries), sentence (any sentence start) or pad (spaces)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		if err := rf.check(); err != nil {
			return usageError{err}
		}
		if *plotOut != "" {
			if err := checkPlotOut("--plot", *plotOut); err != nil {
				return err
			}
		}
		cfg := eval.DefaultConfig()
		var err error
		var nums []string
		cfg.Budgets = nil
		for _, b := range strings.Split(*budgets, ",") {
			if strings.TrimSpace(b) != "policy" {
				nums = append(nums, b)
				continue
			}
			if rf.file == nil {
				return usageError{fmt.Errorf("--budgets %q: \"policy\" needs --policy FILE", *budgets)}
			}
			if !slices.Contains(cfg.Budgets, eval.PolicyBudget) {
				cfg.Budgets = append(cfg.Budgets, eval.PolicyBudget)
			}
			cfg.PolicyName = filepath.Base(rf.policyFile)
		}
		if len(nums) > 0 {
			bs, err := evalInts("--budgets", strings.Join(nums, ","), rf.pageSize, 1<<24)
			if err != nil {
				return err
			}
			cfg.Budgets = append(bs, cfg.Budgets...)
		}
		cfg.Selectors = nil
		for _, s := range strings.Split(*selectors, ",") {
			sel, err := plan.ParseSelector(strings.TrimSpace(s))
			if err != nil || sel == plan.Dense || strings.TrimSpace(s) == "" {
				return usageError{fmt.Errorf("--selectors %q: want a comma-separated list of quest, oracle, recent", *selectors)}
			}
			if !slices.Contains(cfg.Selectors, sel) {
				cfg.Selectors = append(cfg.Selectors, sel)
			}
		}
		switch {
		case *n < 1 || *n > 100000:
			return usageError{fmt.Errorf("--n %d: want 1..100000", *n)}
		case *keys < 1 || *keys > 10:
			return usageError{fmt.Errorf("--keys %d: want 1..10", *keys)}
		}
		var depthList []float64
		if *depths != "" {
			for _, f := range strings.Split(*depths, ",") {
				d, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
				if err != nil || !(d >= 0 && d <= 1) {
					return usageError{fmt.Errorf("--depths: %q is not a depth in [0, 1]", f)}
				}
				depthList = append(depthList, d)
			}
			if len(depthList) != 1 && len(depthList) != *keys {
				return usageError{fmt.Errorf("--depths: %d depths for --keys %d (want 1 or %d)", len(depthList), *keys, *keys)}
			}
		}
		var offsetList []string
		switch *task {
		case "passkey":
			for _, f := range []string{"reversal-repeats", "offsets", "reversal-align"} {
				if flagSet(fs, f) {
					return usageError{fmt.Errorf("--%s: only with --task reversal", f)}
				}
			}
		case eval.TaskReversal:
			switch {
			case flagSet(fs, "keys"):
				return usageError{errors.New("--keys: --task reversal has its own two keys")}
			case flagSet(fs, "prompts"):
				return usageError{errors.New("--prompts: the file gives the prompts; drop --task reversal")}
			case *revRepeats < 1 || *revRepeats > 100:
				return usageError{fmt.Errorf("--reversal-repeats %d: want 1..100", *revRepeats)}
			case *revAlign != eval.AlignBlock && *revAlign != eval.AlignSentence && *revAlign != eval.AlignPad:
				return usageError{fmt.Errorf("--reversal-align %q: want block, sentence or pad", *revAlign)}
			}
			for _, f := range strings.Split(*offsets, ",") {
				o := strings.TrimSpace(f)
				if _, err := eval.ResolveOffset(o, rf.pageSize); err != nil || o == "" {
					return usageError{fmt.Errorf("--offsets: %q is not start, middle, end, any or a token offset in 0..%d", f, rf.pageSize-1)}
				}
				if !slices.Contains(offsetList, o) {
					offsetList = append(offsetList, o)
				}
			}
		default:
			return usageError{fmt.Errorf("--task %q: want passkey or reversal", *task)}
		}
		cfg.Policy, err = rf.policy("quest", 0)
		if err != nil {
			return usageError{err}
		}
		if flagSet(fs, "summary-dtype") {
			cfg.SummaryDTypes = rf.summary.types
		}
		cfg.DecodeQuestion = *decodeQ
		cfg.Diagnostics = !*noDiag
		if *stopRule && *noDiag {
			return usageError{errors.New("--stop-rule needs the diagnostics (drop --no-diagnostics)")}
		}
		cfg.StopRule = *stopRule
		if cfg.Policy.HierGroup > 0 && cfg.Diagnostics {
			return usageError{fmt.Errorf("--hier-group %d needs --no-diagnostics (diagnostics score every page flat)", cfg.Policy.HierGroup)}
		}
		cfg.CP, cfg.TP = rf.cp, rf.tp
		cfg.Selection, _ = engine.ParseSelection(rf.selection)
		cfg.Workers = rf.workers
		cfg.MemoryLimit = *rf.maxMem
		cfg.NewRunner = evalengine.NewRunner
		if err := cfg.Validate(); err != nil {
			return usageError{err}
		}
		// The prompts, grouped by length in the order given.
		var groups [][]eval.Prompt
		if *prompts != "" {
			if flagSet(fs, "lengths") || flagSet(fs, "keys") || flagSet(fs, "depths") || flagSet(fs, "n") {
				return usageError{errors.New("--prompts: the file gives the prompts; drop --lengths, --n, --keys and --depths")}
			}
			ps, err := readPromptFile(*prompts)
			if err != nil {
				return err
			}
			for _, p := range ps {
				i := slices.IndexFunc(groups, func(g []eval.Prompt) bool { return g[0].Length == p.Length })
				if i < 0 {
					groups = append(groups, nil)
					i = len(groups) - 1
				}
				groups[i] = append(groups[i], p)
			}
		} else {
			ls, err := evalInts("--lengths", *lengths, 64, 1<<20)
			if err != nil {
				return err
			}
			rng := rand.New(rand.NewPCG(*seed, 0x5eed))
			for _, l := range ls {
				var g []eval.Prompt
				for range *n {
					if *task == eval.TaskReversal {
						// --n per offset, the offsets interleaved.
						ro := eval.ReversalOptions{PageSize: rf.pageSize, Align: *revAlign, Repeats: *revRepeats, Depth: -1}
						if len(depthList) > 0 {
							ro.Depth = depthList[0]
						}
						for _, o := range offsetList {
							ro.Offset = o
							p, err := eval.Reversal(rng, l, ro)
							if err != nil {
								return usageError{fmt.Errorf("--task reversal: %w", err)}
							}
							g = append(g, p)
						}
						continue
					}
					p, err := eval.Passkey(rng, l, eval.PasskeyOptions{Keys: *keys, Depths: depthList})
					if err != nil {
						return usageError{err}
					}
					g = append(g, p)
				}
				groups = append(groups, g)
			}
		}
		longest := 0
		for _, g := range groups {
			for _, p := range g {
				longest = max(longest, len(p.Context)+len(p.Question)+len(p.Answer)+1)
			}
		}
		m, tok, err := rf.load()
		if err != nil {
			return err
		}
		defer m.Close()
		if mp := m.Config.MaxPositions; mp > 0 && longest > mp {
			return usageError{fmt.Errorf("the longest prompt needs %d positions, more than the model's %d", longest, mp)}
		}
		h, err := eval.NewHarness(m, tok, cfg, longest)
		if err != nil {
			return err
		}
		defer h.Close()
		agg := eval.NewAggregate(cfg)
		var stops eval.StopRules
		enc := json.NewEncoder(stdout)
		for _, g := range groups {
			start := time.Now()
			for i, p := range g {
				r, err := h.Evaluate(ctx, p)
				if err != nil {
					return err
				}
				agg.Add(r)
				stops.Add(i, r)
				var b strings.Builder
				fmt.Fprintf(&b, "length %d prompt %d/%d (%d tokens, depth %.2f%s): prefill %.1fs, decode %.1fs; answer %s, dense %s", p.Length, i+1, len(g), r.Tokens, p.Depth(), placed(p, rf.pageSize), r.PrefillSeconds, r.DecodeSeconds, p.Answer, mark(r.Dense.Output, p.Answer))
				for _, run := range r.Runs {
					if len(cfg.SummaryDTypes) > 0 {
						fmt.Fprintf(&b, ", %s/%s/%d %s", run.Selector, run.SummaryDType, run.Budget, mark(run.Output, p.Answer))
						continue
					}
					fmt.Fprintf(&b, ", %s/%d %s", run.Selector, run.Budget, mark(run.Output, p.Answer))
				}
				fmt.Fprintln(stderr, b.String())
			}
			recs := agg.Records(g[0].Length)
			for i := range recs {
				recs[i].Model = rf.model
			}
			if *asJSON {
				for _, r := range recs {
					if err := enc.Encode(r); err != nil {
						return err
					}
				}
			} else {
				printEvalTable(stdout, recs)
			}
			for _, rep := range stops.Reports() {
				if rep.Length != g[0].Length {
					continue
				}
				if *asJSON {
					if err := enc.Encode(map[string]any{"stop_rule": rep}); err != nil {
						return err
					}
					continue
				}
				eval.WriteStopReport(stdout, rep)
			}
			fmt.Fprintf(stderr, "length %d: %d prompts in %.1fs\n", g[0].Length, len(g), time.Since(start).Seconds())
		}
		if *plotOut != "" {
			return plotPasskey(*plotOut, rf.model, agg.Records(-1))
		}
		return nil
	}
}

// placed describes where a reversal prompt put its answer ("" for the
// plain task).
func placed(p eval.Prompt, pageSize int) string {
	if p.Task == "" {
		return ""
	}
	return fmt.Sprintf(", %s, offset %s: token %d = page %d + %d, distractor %s", p.Task, p.Offset, p.AnswerToken, p.AnswerToken/pageSize, p.AnswerToken%pageSize, p.Distractor)
}

// mark shows a model's answer: the text, with a check for the expected one.
func mark(got, want string) string {
	if got == want {
		return "ok"
	}
	return strconv.Quote(got)
}

func printEvalTable(w io.Writer, recs []eval.Record) {
	// Tasks other than the plain passkey add the in-page offset.
	offsetCol := slices.ContainsFunc(recs, func(r eval.Record) bool { return r.Task != "" })
	if offsetCol {
		fmt.Fprintf(w, "%-8s ", "offset")
	}
	fmt.Fprintf(w, "%-8s %-8s %6s %4s %8s %6s %8s %7s %7s  mass recall per layer (teacher-forced)\n", "length", "selector", "budget", "n", "accuracy", "agree", "pages/P", "rho", "1/S+K/P")
	for _, r := range recs {
		agree, pages, rho, formula := "-", "-", "-", "-"
		var mass []string
		if tf := r.TeacherForced; tf != nil {
			agree = fmt.Sprintf("%.3f", *tf.TokenAgreement)
			pages = fmt.Sprintf("%.3f", tf.SparsePagesFraction)
			rho = fmt.Sprintf("%.3f", tf.SparseRho)
			formula = fmt.Sprintf("%.3f", tf.SparseRhoFormula)
			for _, l := range tf.Layers {
				if l.MassRecall != nil {
					mass = append(mass, fmt.Sprintf("%.3f", *l.MassRecall))
				}
			}
		}
		if offsetCol {
			fmt.Fprintf(w, "%-8s ", r.Offset)
		}
		sel := r.Selector
		if r.SummaryDType != "" {
			sel += "/" + r.SummaryDType
		}
		fmt.Fprintf(w, "%-8d %-8s %6d %4d %8.3f %6s %8s %7s %7s  %s\n", r.Length, sel, r.Budget, r.N, r.Accuracy, agree, pages, rho, formula, strings.Join(mass, " "))
	}
	fmt.Fprintln(w, "(budget: tokens per KV head, 0 dense; accuracy: share of prompts whose greedy answer is right; agree: share of answer tokens equal to dense's, teacher-forced;")
	fmt.Fprintln(w, " pages/P: share of the sparse layers' (KV head, page) pairs read; rho: their bytes read over dense's, next to the formula 1/S + K/P;")
	fmt.Fprintln(w, " mass recall: dense attention mass inside the pages read, per layer from layer 0, dense layers 1.000)")
}

// evalInts parses a comma-separated list of integers in [lo, hi].
func evalInts(flag, s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < lo || v > hi {
			return nil, usageError{fmt.Errorf("%s: %q is not an integer in %d..%d", flag, f, lo, hi)}
		}
		out = append(out, v)
	}
	return out, nil
}

// maxInputFile bounds the user files questctl reads whole (prompt files,
// the JSON lines of plot, a model's config.json): a larger regular file is
// refused from its size before it is read, a stream past it is cut.
const maxInputFile = 256 << 20

// readPromptFile reads the JSON-lines prompt file of --prompts; its
// errors are usage errors naming the flag.
func readPromptFile(path string) ([]eval.Prompt, error) {
	f, err := readlimit.Open(path, maxInputFile)
	if err != nil {
		return nil, usageError{fmt.Errorf("--prompts: %w", err)}
	}
	defer f.Close()
	ps, err := eval.ReadPrompts(readlimit.Reader(f, path, maxInputFile))
	if err != nil {
		return nil, usageError{fmt.Errorf("--prompts %s: %w", path, err)}
	}
	return ps, nil
}
