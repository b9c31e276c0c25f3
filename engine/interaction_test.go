package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// TestInteraction drives the step protocol between an engine and its
// workers from the scripts in testdata/interaction (in the style of etcd
// raft's interaction tests): every command prints the messages the
// workers received, in worker order, and its outcome. After a deliberate
// change, regenerate with `go test ./engine -run TestInteraction -rewrite`
// and review the diff.
//
// Commands (state carries over within a file):
//
//	engine cp=N tp=N layers=L [q-heads=H kv-heads=H dim=D page=S budget=B dense-layers=N sink=N local=N] [replicated] [persist]
//	                                  (persist: every worker keeps a data
//	                                   directory, worker.Config.DataDir)
//	create name=X
//	append name=X tokens=N [seed=S [skip=K | step-rows=R]] [layer=L]
//	                                  (N random tokens to every layer, or
//	                                   to layer L;
//	                                   seed: drawn from seed S, not the
//	                                   file's stream; skip: the last N of
//	                                   the K+N tokens tokens=K+N draws;
//	                                   step-rows: the new token that a
//	                                   layer command with seed S gave a
//	                                   step of R rows, N = 1)
//	begin rows=(X+, Y) [first=L] [budget=B] [dense-layers=N]
//	                                  (X+: X brings a new token)
//	layer l=L [bad=q|layer] [seed=S] [as=LABEL]
//	                                  (the open step's layer; random q, k,
//	                                   v; as: compare o and lse bit for bit
//	                                   with the layer first run as LABEL in
//	                                   this file, or record it)
//	end
//	fail w=N op=begin|layer           (worker N fails its next such call,
//	                                   after doing it)
//	len name=X
//	release name=X
//
// and, for persisting workers (interaction_restart_test.go):
//
//	restart w=(N, ...)|all [crash[=(N, ...)]] [engine]
//	                                  (close the workers and reopen them
//	                                   from their data directories;
//	                                   crash: (those listed) from a copy
//	                                   taken before the close, as kill -9
//	                                   leaves it; alone, a worker keeps
//	                                   its transport; engine, with w=all:
//	                                   the grid reopens as a cluster
//	                                   reopens it: engine closed first,
//	                                   new transports, a new engine over
//	                                   the workers)
//	adopt name=X                      (the engine adopts what the workers
//	                                   recovered of X's id)
//	seqs                              (the engine's sequence table)
//	parked                            (the workers' parked keys)
//	pending                           (collective messages buffered per
//	                                   worker, unreceived)
//
// A worker's call that fails prints its error on the next line
// ("w1   -> ...").
func TestInteraction(t *testing.T) {
	digests := map[string]digest{} // layer outputs by label, per file
	datadriven.Walk(t, "testdata/interaction", func(t *testing.T, path string) {
		clear(digests)
		env := &interaction{t: t, digests: digests}
		defer env.close()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return env.run(t, d)
		})
	})
}

type interaction struct {
	t     *testing.T
	e     *Engine
	cfg   Config
	rng   *rand.Rand
	names map[string]SeqID
	rows  []decode.Row
	step  decode.Step
	be    kernels.Backend
	trs   []collective.Transport
	locs  []*worker.Local
	rec   *recorder
	// Per worker: its recorder wrapper (the engine's host; a restart
	// swaps the worker behind it), its config and rank.
	wrs   []*recWorker
	wcfgs []worker.Config
	specs []worker.RankSpec
	hosts []Host
	// digests are the layer outputs recorded under a label (layer as=).
	digests map[string]digest
}

// recorder logs the workers' calls and injects failures.
type recorder struct {
	mu    sync.Mutex
	lines []recLine
	fail  map[int]string // worker -> op of its next failing call
}

type recLine struct {
	w    int
	text string
}

func (r *recorder) log(w int, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, recLine{w, fmt.Sprintf("w%d %s", w, fmt.Sprintf(format, args...))})
}

// failing reports whether worker w's call op is to fail (once).
func (r *recorder) failing(w int, op string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail[w] == op {
		delete(r.fail, w)
		return true
	}
	return false
}

// flush returns the logged lines in worker order (each worker's in call
// order) and forgets them.
func (r *recorder) flush() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	slices.SortStableFunc(r.lines, func(a, b recLine) int { return a.w - b.w })
	var b strings.Builder
	for _, l := range r.lines {
		b.WriteString(l.text + "\n")
	}
	r.lines = r.lines[:0]
	return b.String()
}

var errScripted = errors.New("injected failure")

// recWorker is worker w behind the recorder.
type recWorker struct {
	worker.Worker
	w   int
	rec *recorder
}

// answer logs a failed call's error under its call's line.
func (r *recWorker) answer(err error) error {
	if err != nil {
		r.rec.log(r.w, "  -> %v", err)
	}
	return err
}

func (r *recWorker) Create(ctx context.Context, m worker.CreateRequest) error {
	r.rec.log(r.w, "Create seq=%d", m.Seq)
	return r.answer(r.Worker.Create(ctx, m))
}

func (r *recWorker) Release(ctx context.Context, m worker.ReleaseRequest) error {
	r.rec.log(r.w, "Release seq=%d", m.Seq)
	return r.answer(r.Worker.Release(ctx, m))
}

func (r *recWorker) Check(ctx context.Context, m worker.CheckRequest) error {
	r.rec.log(r.w, "Check seq=%d layer=%d len=%d append=%d drop=%d", m.Seq, m.Layer, m.Len, m.Append, m.Drop)
	return r.answer(r.Worker.Check(ctx, m))
}

func (r *recWorker) Append(ctx context.Context, m worker.AppendRequest) error {
	r.rec.log(r.w, "Append seq=%d rank=(%d,%d) layer=%d start=%d tokens=%d", m.Seq, m.Rank.TP, m.Rank.CP, m.Layer, m.Start, m.Tokens)
	return r.answer(r.Worker.Append(ctx, m))
}

func (r *recWorker) Rollback(ctx context.Context, m worker.RollbackRequest) (worker.RollbackReply, error) {
	if m.Lens != nil {
		r.rec.log(r.w, "Rollback seq=%d rank=(%d,%d) lens=%v", m.Seq, m.Rank.TP, m.Rank.CP, m.Lens)
	} else {
		r.rec.log(r.w, "Rollback seq=%d rank=(%d,%d) len=%d drop=%d", m.Seq, m.Rank.TP, m.Rank.CP, m.Len, m.Drop)
	}
	rep, err := r.Worker.Rollback(ctx, m)
	return rep, r.answer(err)
}

// The Claimer calls (Adopt, DropRecovered), on the worker behind r.
var _ Claimer = (*recWorker)(nil)

func (r *recWorker) Claim(ctx context.Context, key, seq uint64) error {
	r.rec.log(r.w, "Claim key=%d seq=%d", key, seq)
	return r.answer(r.Worker.(Claimer).Claim(ctx, key, seq))
}

func (r *recWorker) DropRecovered(ctx context.Context, key uint64) error {
	r.rec.log(r.w, "DropRecovered key=%d", key)
	return r.answer(r.Worker.(Claimer).DropRecovered(ctx, key))
}

func (r *recWorker) Park(ctx context.Context, seq uint64) error {
	r.rec.log(r.w, "Park seq=%d", seq)
	return r.answer(r.Worker.(Claimer).Park(ctx, seq))
}

func (r *recWorker) BeginStep(ctx context.Context, m worker.BeginRequest) error {
	var seqs []string
	for _, s := range m.Seqs {
		x := fmt.Sprintf("%d:len=%d", s.Seq, s.Len)
		if s.New {
			x += ",new"
		}
		if s.Budget != 0 {
			x += fmt.Sprintf(",budget=%d", s.Budget)
		}
		if s.DenseLayers != 0 {
			x += fmt.Sprintf(",dense<%d", s.DenseLayers)
		}
		seqs = append(seqs, x)
	}
	r.rec.log(r.w, "BeginStep step=%d layer=%d seqs=[%s]", m.Step, m.Layer, strings.Join(seqs, " "))
	err := r.Worker.BeginStep(ctx, m)
	if err == nil && r.rec.failing(r.w, "begin") {
		err = fmt.Errorf("w%d: %w", r.w, errScripted)
	}
	return r.answer(err)
}

func (r *recWorker) Layer(ctx context.Context, m worker.LayerRequest, rep *worker.LayerReply) error {
	var ranks []string
	for _, in := range m.Ranks {
		ranks = append(ranks, fmt.Sprintf("(%d,%d) q=%d k=%d mirror=%d", in.Rank.TP, in.Rank.CP, len(in.Q), len(in.K), len(in.MirrorK)))
	}
	r.rec.log(r.w, "Layer step=%d layer=%d ranks=[%s]", m.Step, m.Layer, strings.Join(ranks, " "))
	err := r.Worker.Layer(ctx, m, rep)
	if err == nil && r.rec.failing(r.w, "layer") {
		err = fmt.Errorf("w%d: %w", r.w, errScripted)
	}
	return r.answer(err)
}

func (r *recWorker) EndStep(ctx context.Context, m worker.EndRequest) error {
	r.rec.log(r.w, "EndStep step=%d failed=%v layers=%v", m.Step, m.Failed, m.Layers)
	return r.answer(r.Worker.EndStep(ctx, m))
}

func (env *interaction) close() {
	if env.step != nil {
		env.step.End(context.Background())
	}
	if env.e != nil {
		env.e.Close()
	}
	for _, l := range env.locs {
		l.Close()
	}
	for _, tr := range env.trs {
		tr.Close()
	}
	if env.be != nil {
		env.be.Close()
	}
	*env = interaction{t: env.t, digests: env.digests}
}

func arg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

func (env *interaction) run(t *testing.T, d *datadriven.TestData) string {
	ctx := context.Background()
	switch d.Cmd {
	case "engine":
		env.close()
		c := DefaultConfig()
		c.CP, c.TP, c.Layers = arg(t, d, "cp", 1), arg(t, d, "tp", 1), arg(t, d, "layers", 2)
		c.QHeads, c.KVHeads, c.HeadDim, c.PageSize = arg(t, d, "q-heads", 4), arg(t, d, "kv-heads", 2), arg(t, d, "dim", 8), arg(t, d, "page", 4)
		c.Policy.PageSize, c.Policy.BudgetTokens = c.PageSize, arg(t, d, "budget", 8)
		c.Policy.DenseLayers, c.Policy.SinkPages, c.Policy.LocalPages = arg(t, d, "dense-layers", 1), arg(t, d, "sink", 0), arg(t, d, "local", 1)
		c.CapacityPages, c.StepTimeout = 64, 5*time.Second
		if d.HasArg("replicated") {
			c.Selection = Replicated
		}
		env.cfg, env.rng, env.names = c, rand.New(rand.NewPCG(1, 2)), map[string]SeqID{}
		env.rec = &recorder{fail: map[int]string{}}
		env.be = kernels.NewCPU(kernels.CPUConfig{})
		for tp := range c.TP {
			trs := collective.NewInprocGroup(c.CP)
			env.trs = append(env.trs, trs...)
			for cp := range c.CP {
				r := worker.Rank{TP: tp, CP: cp}
				wc := c.WorkerConfig()
				if d.HasArg("persist") {
					wc.DataDir, wc.GridID = env.t.TempDir(), "interaction"
				}
				spec := worker.RankSpec{Rank: r, Backend: env.be, Transport: trs[cp]}
				l, err := worker.NewLocal(wc, []worker.RankSpec{spec})
				if err != nil {
					t.Fatal(err)
				}
				wr := &recWorker{Worker: l, w: len(env.hosts), rec: env.rec}
				env.locs, env.wrs = append(env.locs, l), append(env.wrs, wr)
				env.wcfgs, env.specs = append(env.wcfgs, wc), append(env.specs, spec)
				env.hosts = append(env.hosts, Host{Worker: wr, Ranks: []worker.Rank{r}})
			}
		}
		e, err := Open(c, env.hosts)
		if err != nil {
			return err.Error()
		}
		env.e = e
		out := fmt.Sprintf("%d workers, one rank each (worker = tp*%d + cp)\n", len(env.hosts), c.CP)
		if d.HasArg("persist") {
			out += "persisting: every worker has a data directory\n"
		}
		return out
	case "create":
		var name string
		d.ScanArgs(t, "name", &name)
		id, err := env.e.Create(plan.Striped)
		out := env.rec.flush()
		if err != nil {
			return out + "error: " + err.Error() + "\n"
		}
		env.names[name] = id
		return out + fmt.Sprintf("%s = seq %d\n", name, id)
	case "append":
		var name string
		d.ScanArgs(t, "name", &name)
		n, skip, row := arg(t, d, "tokens", 1), arg(t, d, "skip", 0), env.cfg.KVRow()
		var errs []string
		for l := range env.cfg.Layers {
			if d.HasArg("layer") && l != arg(t, d, "layer", 0) {
				continue
			}
			rng := env.rngFor(t, d, l)
			if d.HasArg("step-rows") {
				// The new row of a layer command with the same seed:
				// drawn after the step's queries.
				randn(rng, arg(t, d, "step-rows", 1)*env.cfg.QRow())
				k, v := randn(rng, n*row), randn(rng, n*row)
				if err := env.e.Append(env.names[name], l, k, v); err != nil {
					errs = append(errs, fmt.Sprintf("layer %d: %v", l, err))
				}
				continue
			}
			k, v := randn(rng, (skip+n)*row)[skip*row:], randn(rng, (skip+n)*row)[skip*row:]
			if err := env.e.Append(env.names[name], l, k, v); err != nil {
				errs = append(errs, fmt.Sprintf("layer %d: %v", l, err))
			}
		}
		return env.rec.flush() + outcome(errs)
	case "begin":
		var rows []string
		d.ScanArgs(t, "rows", &rows)
		b := decode.Batch{FirstLayer: arg(t, d, "first", 0)}
		for _, r := range rows {
			name, isNew := strings.CutSuffix(r, "+")
			id, ok := env.names[name]
			if !ok {
				id = 999
			}
			b.Rows = append(b.Rows, decode.Row{Seq: id, New: isNew, Budget: arg(t, d, "budget", 0), DenseLayers: arg(t, d, "dense-layers", 0)})
		}
		st, err := env.e.Begin(ctx, b)
		out := env.rec.flush()
		if err != nil {
			return out + "error: " + err.Error() + "\n"
		}
		env.step, env.rows = st, b.Rows
		return out + "open\n"
	case "layer":
		if env.step == nil {
			return "no open step\n"
		}
		l := arg(t, d, "l", 0)
		c := env.cfg
		nNew := decode.Batch{Rows: env.rows}.NewRows()
		rng := env.rngFor(t, d, l)
		q, k, v := randn(rng, len(env.rows)*c.QRow()), randn(rng, nNew*c.KVRow()), randn(rng, nNew*c.KVRow())
		if d.HasArg("bad") {
			var what string
			d.ScanArgs(t, "bad", &what)
			q = q[1:]
		}
		var res decode.Result
		err := env.step.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(v), &res)
		out := env.rec.flush()
		if err != nil {
			return out + "error: " + err.Error() + "\n"
		}
		for i, pl := range res.Plans {
			out += fmt.Sprintf("row %d: plan pages=%d dense=%v K=%d sink=%d local=%d rank=%d; o[0:3]=%.4f lse[0]=%.4f\n",
				i, pl.Pages, pl.Dense, pl.K, pl.Sink, pl.Local, pl.Rank, res.O.Data[i*c.QRow():i*c.QRow()+3], res.LSE[i*c.QHeads])
		}
		if d.HasArg("as") {
			var label string
			d.ScanArgs(t, "as", &label)
			out += env.compare(label, res.O.Data[:len(env.rows)*c.QRow()], res.LSE)
		}
		return out
	case "end":
		if env.step == nil {
			return "no open step\n"
		}
		err := env.step.End(ctx)
		env.step = nil
		return env.rec.flush() + outcome(errStrings(err))
	case "fail":
		var op string
		d.ScanArgs(t, "op", &op)
		env.rec.fail[arg(t, d, "w", 0)] = op
		return ""
	case "release":
		var name string
		d.ScanArgs(t, "name", &name)
		err := env.e.Release(env.names[name])
		return env.rec.flush() + outcome(errStrings(err))
	case "restart", "adopt", "seqs", "parked", "pending":
		return env.runRestart(t, d)
	case "len":
		var name string
		d.ScanArgs(t, "name", &name)
		n, err := env.e.Len(env.names[name])
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		return fmt.Sprintf("%s: %d tokens\n", name, n)
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return ""
}

// rngFor returns the generator of a command's draws for layer l: the
// file's stream, or with seed=S one seeded by (S, l), so that the same
// command draws the same tensors whatever ran before it.
func (env *interaction) rngFor(t *testing.T, d *datadriven.TestData, l int) *rand.Rand {
	if !d.HasArg("seed") {
		return env.rng
	}
	return rand.New(rand.NewPCG(uint64(arg(t, d, "seed", 0)), uint64(l)))
}

func randn(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

func errStrings(err error) []string {
	if err == nil {
		return nil
	}
	return []string{err.Error()}
}

func outcome(errs []string) string {
	if len(errs) == 0 {
		return "ok\n"
	}
	return "error: " + strings.Join(errs, "; ") + "\n"
}
