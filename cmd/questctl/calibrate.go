package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

func runCalibrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, calibrateCommand, args, stdout, stderr)
}

// calibrateCommand builds the flags and the action of
// 'questctl calibrate' without running it (see [runCommand]).
func calibrateCommand() (*flag.FlagSet, action) {
	fs := newFlags("calibrate", `Usage: questctl calibrate --model DIR --prompts FILE|--lengths L [flags] [--out policy.yaml]

Calibrates Quest's per-layer token budgets for a checkpoint (notes
section 1: redraw the budget curve whenever a checkpoint is deployed).
Every prompt is decoded with dense attention (the question through
decode steps unless --answer-only, then the greedy answer); at every
decode step and layer the step's queries and the cache's post-RoPE keys
give, per KV head, the attention-mass recall 1 - eps that Quest's page
selection (min/max bounds, --gqa, --sink and --local pages forced) would
keep at every page budget. Per layer and KV head it reports the smallest
budget whose mean mass recall (over prompts, steps and the KV head's
query heads) reaches --target-mass; a layer's budget is the largest of
its KV heads'. A layer whose budget reads no fewer bytes than dense by
the byte model (1/S + K/P >= --max-rho at the prompts' mean page count
P) is recommended dense. --out writes the policy file (dense layers,
per-layer budgets) that generate, eval and questd load with --policy,
and the summary names the uniform budget that reads the same bytes.

Prompts: --prompts FILE (JSON lines {"prompt", "answer", ...}, as eval
passkey reads them), or generated passkey prompts (--lengths, --n,
--seed). Budgets are absolute token budgets at the prompts' length.
Progress goes to stderr; a table (or --json: one JSON object) to stdout.`)
	rf := addRunFlags(fs)
	prompts := fs.String("prompts", "", fmt.Sprintf("JSON-lines prompt file (the format of eval passkey --prompts; at most %s)", memlimit.Bytes(maxInputFile)))
	lengths := fs.String("lengths", "", "generate passkey prompts of these lengths in bytes instead (comma-separated, 64..1048576)")
	n := fs.Int("n", 8, "generated prompts per length (1..100000)")
	seed := fs.Uint64("seed", 1, "generated prompts' seed")
	target := fs.Float64("target-mass", 0.99, "attention-mass recall each layer's budget must reach, mean over prompts, steps and heads (0..1]")
	maxRho := fs.Float64("max-rho", 1, "recommend dense where the needed budget's 1/S + K/P reaches this (0 < x)")
	answerOnly := fs.Bool("answer-only", false, "measure only the answer's decode steps (prefill the question)")
	out := fs.String("out", "", "write the calibrated policy file here (YAML; see --policy of generate and eval)")
	asJSON := fs.Bool("json", false, "print the calibration as one JSON object instead of a table")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		if err := rf.check(); err != nil {
			return usageError{err}
		}
		for _, f := range []string{"cp", "tp", "selection"} {
			if name := givenAs(fs, f); name != "" {
				return usageError{fmt.Errorf("%s: calibrate runs dense attention in process; the grid does not apply", name)}
			}
		}
		switch {
		case (*prompts == "") == (*lengths == ""):
			return usageError{errors.New("--prompts or --lengths: give exactly one")}
		case *n < 1 || *n > 100000:
			return usageError{fmt.Errorf("--n %d: want 1..100000", *n)}
		case !(*target > 0 && *target <= 1):
			return usageError{fmt.Errorf("--target-mass %v: want a fraction in (0, 1]", *target)}
		case !(*maxRho > 0):
			return usageError{fmt.Errorf("--max-rho %v: want a positive ratio", *maxRho)}
		}
		pol, err := rf.policy("quest", 0)
		if err != nil {
			return usageError{err}
		}
		cfg := eval.DefaultCalibrateConfig()
		cfg.Policy, cfg.TargetMass, cfg.MaxRho = pol, *target, *maxRho
		cfg.DecodeQuestion = !*answerOnly
		cfg.Workers, cfg.MemoryLimit = rf.workers, *rf.maxMem
		var ps []eval.Prompt
		if *prompts != "" {
			if flagSet(fs, "n") || flagSet(fs, "seed") {
				return usageError{errors.New("--prompts: the file gives the prompts; drop --n and --seed")}
			}
			var err error
			if ps, err = readPromptFile(*prompts); err != nil {
				return err
			}
		} else {
			ls, err := evalInts("--lengths", *lengths, 64, 1<<20)
			if err != nil {
				return err
			}
			rng := rand.New(rand.NewPCG(*seed, 0x5eed))
			for _, l := range ls {
				for range *n {
					p, err := eval.Passkey(rng, l, eval.PasskeyOptions{})
					if err != nil {
						return usageError{err}
					}
					ps = append(ps, p)
				}
			}
		}
		if *out != "" {
			// Refuse an unwritable --out before the long run.
			dir := filepath.Dir(*out)
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				return usageError{fmt.Errorf("--out %s: directory %s does not exist", *out, dir)}
			}
		}
		m, tok, err := rf.load()
		if err != nil {
			return err
		}
		defer m.Close()
		cal, err := eval.NewCalibrator(m, tok, cfg)
		if err != nil {
			return usageError{err}
		}
		start := time.Now()
		for i, p := range ps {
			t0 := time.Now()
			if err := cal.Add(ctx, p); err != nil {
				return fmt.Errorf("prompt %d: %w", i+1, err)
			}
			fmt.Fprintf(stderr, "prompt %d/%d (%d bytes): %.1fs\n", i+1, len(ps), len(p.Context)+len(p.Question), time.Since(t0).Seconds())
		}
		res, err := cal.Result()
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "calibrated on %d prompts, %d decode steps in %.1fs\n", res.Prompts, res.Steps, time.Since(start).Seconds())
		if *out != "" {
			var b strings.Builder
			header := fmt.Sprintf("questctl calibrate --model %s: target mass recall %g, %d prompts, %d decode steps, mean %.0f pages of %d tokens\n%s",
				rf.model, res.TargetMass, res.Prompts, res.Steps, res.MeanPages, pol.PageSize, uniformLine(pol, res))
			if err := plan.WritePolicyFile(&b, res.Policy, header); err != nil {
				return err
			}
			if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			fmt.Fprintf(stderr, "policy written to %s\n", *out)
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(calibrationJSON{Model: rf.model, PageSize: pol.PageSize, GQA: pol.GQA.String(),
				Sink: pol.SinkPages, Local: pol.LocalPages, Prompts: res.Prompts, Steps: res.Steps, MeanPages: res.MeanPages,
				TargetMass: res.TargetMass, Layers: res.Layers, Policy: plan.FilePolicy(res.Policy), UniformBudget: res.UniformBudget, UniformBudgetAll: res.UniformBudgetAll})
		}
		fmt.Fprintf(stdout, "%d prompts, %d decode steps, mean %.0f pages of %d tokens; target mass recall %g (%s)\n",
			res.Prompts, res.Steps, res.MeanPages, pol.PageSize, res.TargetMass, pol.GQA)
		fmt.Fprintf(stdout, "%-5s %-8s %-6s %-6s %-20s  mass recall at 1, 2, 4, ... pages\n", "layer", "budget", "rho", "dense", "per KV head")
		for _, l := range res.Layers {
			var heads, curve []string
			for _, b := range l.HeadBudgets {
				heads = append(heads, fmt.Sprint(b))
			}
			for _, pt := range l.Curve {
				curve = append(curve, fmt.Sprintf("%.3f", pt.Mass))
			}
			fmt.Fprintf(stdout, "%-5d %-8d %-6.3f %-6v %-20s  %s\n", l.Layer, l.Budget, l.Rho, l.Dense, strings.Join(heads, ","), strings.Join(curve, " "))
		}
		fmt.Fprintln(stdout, uniformLine(pol, res))
		return nil
	}
}

// uniformLine names the uniform budgets that read the calibrated
// policy's bytes.
func uniformLine(pol plan.Policy, res eval.Calibration) string {
	with := "none (one page per sparse layer reads more)"
	if res.UniformBudget > 0 {
		with = fmt.Sprintf("%d tokens", res.UniformBudget)
	}
	all := "none"
	if res.UniformBudgetAll > 0 {
		all = fmt.Sprintf("%d tokens", res.UniformBudgetAll)
	}
	return fmt.Sprintf("uniform budget at the same bytes: %s with --dense-layers %d, %s with no dense layer", with, pol.DenseLayers, all)
}

// calibrationJSON is calibrate's --json output.
type calibrationJSON struct {
	Model            string                  `json:"model"`
	PageSize         int                     `json:"page_size"`
	GQA              string                  `json:"gqa"`
	Sink             int                     `json:"sink"`
	Local            int                     `json:"local"`
	Prompts          int                     `json:"prompts"`
	Steps            int                     `json:"decode_steps"`
	MeanPages        float64                 `json:"mean_pages"`
	TargetMass       float64                 `json:"target_mass"`
	Layers           []eval.LayerCalibration `json:"layers"`
	Policy           plan.PolicyFile         `json:"policy"`
	UniformBudget    int                     `json:"uniform_budget"`
	UniformBudgetAll int                     `json:"uniform_budget_no_dense"`
}
