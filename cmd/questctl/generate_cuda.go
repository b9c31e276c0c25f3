//go:build cuda

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// cudaAvailable: this build has the CUDA backend.
func cudaAvailable() error { return nil }

// generateCUDA is generate with --backend cuda: the prompt is prefilled
// on GPU 0 by the device executor (with bf16 or f16 pages; else by the
// CPU executor) into an engine of one rank whose pages live there, then
// every decode step runs on the GPU (model/gpu), sampling on the host
// from the step's logits unless it is greedy.
func generateCUDA(ctx context.Context, g gpuGenerate, stdout, stderr io.Writer) error {
	dt, err := plan.ParseDType(g.kvDType)
	if err != nil {
		return usageError{fmt.Errorf("--kv-cache-dtype: %w", err)}
	}
	be, err := cuda.New(cuda.Config{DType: dt, SummaryDType: g.pol.SummaryDType})
	if err != nil {
		return fmt.Errorf("--backend cuda: %w", err)
	}
	defer be.Close()
	cfg := g.rf.engineConfig(g.m, g.pol, g.total, 1)
	cfg.Geometry.DType = dt
	cfg.Backend, cfg.DeviceResident = be, true
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	opt := gpu.Options{MaxBatch: 1}
	pb, err := cfg.DevicePageBytes()
	if err != nil {
		return usageError{err}
	}
	if err := gpu.AdmitAll(ctx, be, g.m.Config, opt, cfg.CapacityPages, pb); err != nil {
		return err
	}
	eng, err := engine.New(cfg)
	if err != nil {
		return err
	}
	defer eng.Close()
	attn, err := model.NewEngineAttention(eng, g.m.Geometry())
	if err != nil {
		return err
	}
	attn.Workers = g.rf.workers
	fmt.Fprintf(stderr, "weights: %d parameters onto GPU 0 as bf16 ...\n", g.m.Config.Params())
	x, err := gpu.New(ctx, be, g.m, opt)
	if err != nil {
		return err
	}
	defer x.Close(ctx)
	var pre model.Timing
	var logits []float32
	if dt == plan.BFloat16 || dt == plan.Float16 {
		fmt.Fprintf(stderr, "prefill on the GPU: %d tokens ...\n", len(g.ids))
		t0 := time.Now()
		logits, err = (&gpu.Decoder{X: x}).Prefill(ctx, attn, g.ids)
		pre.Total = time.Since(t0)
	} else {
		// The GPU's prefill attention reads 16-bit pages.
		fmt.Fprintf(stderr, "prefill on the CPU (--kv-cache-dtype %v): %d tokens into pages on the GPU ...\n", dt, len(g.ids))
		logits, err = g.m.Forward(ctx, attn, g.ids, model.ForwardOptions{Timing: &pre})
	}
	if err != nil {
		return err
	}
	sum := genSummary{Model: g.rf.model, PromptTokens: len(g.ids), PageSize: g.rf.pageSize, DenseLayers: g.rf.denseLayers, CP: 1, TP: 1,
		PrefillSeconds: pre.Total.Seconds(), PrefillTokensS: float64(len(g.ids)) / pre.Total.Seconds()}
	fmt.Fprintf(stderr, "prefill: %d tokens in %.2fs (%.0f tokens/s)\n", len(g.ids), pre.Total.Seconds(), sum.PrefillTokensS)
	_, row, _, ok := attn.DecodeRow()
	if !ok {
		return fmt.Errorf("--backend cuda: the engine sequence has no decode row")
	}
	out := stdout
	if g.asJSON {
		out = io.Discard
	}
	run := genRun{Selector: g.pol.Selector.String() + " (gpu)", Budget: g.budget}
	next := g.opt.Sampler.Sample(logits)
	emit := func(id int) {
		s := model.TokenText(g.tok, id)
		fmt.Fprint(out, s)
		run.Steps = append(run.Steps, genStep{Step: len(run.Tokens), Token: id, Text: s})
		run.Tokens = append(run.Tokens, id)
	}
	emit(next)
	var el time.Duration
	var read, dense, rhoF float64 // bytes read and dense, rho's formula summed over the steps
	for len(run.Tokens) < g.opt.MaxTokens && !slices.Contains(g.opt.StopTokens, next) {
		t0 := time.Now()
		// Sampled on the GPU (the sampler's stream draws u): the token
		// Sample would pick from the step's logits.
		ids, err := x.Decode(ctx, eng, []gpu.Row{{Seq: row.Seq, Token: next, Pos: len(g.ids) + len(run.Tokens) - 1, Sample: g.opt.Sampler.Params()}})
		if err != nil {
			return err
		}
		next = ids[0]
		d := time.Since(t0)
		el += d
		emit(next)
		st := &run.Steps[len(run.Steps)-1]
		sm := model.Summarize(x.LastSteps(0), g.pol.PageSize)
		st.StepUS = us(d)
		st.PagesRead, st.PagesTotal = sm.PagesRead, sm.PagesTotal
		st.Rho, st.RhoFormula, st.SparseRho = sm.Rho, sm.RhoFormula, sm.SparseRho
		read += sm.Rho * float64(sm.PagesTotal)
		dense += float64(sm.PagesTotal)
		rhoF += sm.RhoFormula
		run.PagesRead += sm.PagesRead
		run.PagesTotal += sm.PagesTotal
	}
	if dense > 0 {
		run.Rho = read / dense
		run.RhoFormula = rhoF / float64(len(run.Tokens)-1)
	}
	if !g.asJSON {
		fmt.Fprintln(stdout)
	}
	run.Text = g.tok.Decode(run.Tokens)
	run.DecodeSteps = len(run.Tokens) - 1
	run.DecodeSeconds = el.Seconds()
	if el > 0 {
		run.TokensPerS = float64(run.DecodeSteps) / el.Seconds()
	}
	sum.genRun = run
	if run.DecodeSteps > 0 {
		fmt.Fprintf(stderr, "decode on the GPU (%s): %d steps in %.2fs, %.2f tokens/s\n", run.Selector, run.DecodeSteps, run.DecodeSeconds, run.TokensPerS)
	}
	if g.asJSON {
		return json.NewEncoder(stdout).Encode(sum)
	}
	return nil
}
