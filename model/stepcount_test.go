package model

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// callCounter counts the step calls a coordinator makes to a worker (the
// worker boundary: what a remote worker pays one round trip for).
type callCounter struct {
	worker.Worker
	begin, layer, end, other *atomic.Int64
}

func (c callCounter) BeginStep(ctx context.Context, m worker.BeginRequest) error {
	c.begin.Add(1)
	return c.Worker.BeginStep(ctx, m)
}

func (c callCounter) Layer(ctx context.Context, m worker.LayerRequest, rep *worker.LayerReply) error {
	c.layer.Add(1)
	return c.Worker.Layer(ctx, m, rep)
}

func (c callCounter) EndStep(ctx context.Context, m worker.EndRequest) error {
	c.end.Add(1)
	return c.Worker.EndStep(ctx, m)
}

func (c callCounter) Append(ctx context.Context, m worker.AppendRequest) error {
	c.other.Add(1)
	return c.Worker.Append(ctx, m)
}

// solo is an Attention that is not a BatchAttention.
type solo struct{ Attention }

// countedEngine opens an engine over cp in-process workers (one rank
// each), every one behind a callCounter sharing the returned counters.
func countedEngine(t *testing.T, m *Model, p plan.Policy, capacity, cp int) (*engine.Engine, *[4]atomic.Int64) {
	t.Helper()
	cfg := engine.ModelConfig(m.Geometry(), p, capacity)
	cfg.CP = cp
	var n [4]atomic.Int64
	trs := collective.NewInprocGroup(cp)
	be := kernels.NewCPU(kernels.CPUConfig{})
	t.Cleanup(func() { be.Close() })
	var hosts []engine.Host
	for r := range cp {
		rank := worker.Rank{CP: r}
		l, err := worker.NewLocal(cfg.WorkerConfig(), []worker.RankSpec{{Rank: rank, Backend: be, Transport: trs[r]}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close(); trs[r].Close() })
		hosts = append(hosts, engine.Host{Worker: callCounter{l, &n[0], &n[1], &n[2], &n[3]}, Ranks: []worker.Rank{rank}})
	}
	e, err := engine.Open(cfg, hosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, &n
}

// TestDecodeBatchWorkerCalls counts the worker calls of a decode token
// through DecodeBatch on an engine of W = 2 workers (CP 2): one BeginStep
// and one EndStep per worker and one Layer round (one call per worker)
// per layer, 2W + L x W calls per token, for batches of 1, 4 and 16
// sequences and models of 4 and 32 layers (one step per sequence and
// layer made 3 x W x B x L). The logits equal each sequence's own
// one-token Forward on a CP 2 engine of its own
// with one engine step per layer (the per-sequence path), bit for bit.
func TestDecodeBatchWorkerCalls(t *testing.T) {
	const W = 2
	ctx := context.Background()
	for _, layers := range []int{4, 32} {
		cfg := tinyConfig()
		cfg["num_hidden_layers"] = layers
		m, err := Load(writeTiny(t, cfg, tinyTensors(cfg, F32, 7), 1), LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		p := plan.DefaultPolicy()
		p.BudgetTokens = 32 // sparse past 32 tokens in the layers past the policy's dense ones
		for _, b := range []int{1, 4, 16} {
			t.Run(fmt.Sprintf("L%d/B%d", layers, b), func(t *testing.T) {
				e, n := countedEngine(t, m, p, 16*b+16, W)
				twin := newEngine(t, m, p, 64*(b+1), W, 1)
				rng := rand.New(rand.NewPCG(uint64(b), uint64(layers)))
				attns, alone, toks := make([]Attention, b), make([]Attention, b), make([]int, b)
				for i := range b {
					a, err := NewEngineAttention(e, m.Geometry())
					if err != nil {
						t.Fatal(err)
					}
					a2, err := NewEngineAttention(twin, m.Geometry())
					if err != nil {
						t.Fatal(err)
					}
					ids := randTokens(rng, 40+3*i)
					lg, err := m.Forward(ctx, a, ids, ForwardOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if _, err := m.Forward(ctx, a2, ids, ForwardOptions{}); err != nil {
						t.Fatal(err)
					}
					// solo hides BatchAttention: the twin decodes one
					// engine step per layer (engine.Step), the old path.
					attns[i], alone[i], toks[i] = a, solo{a2}, Argmax(lg)
				}
				for step := range 3 {
					for i := range n {
						n[i].Store(0)
					}
					got, err := m.DecodeBatch(ctx, attns, toks)
					if err != nil {
						t.Fatal(err)
					}
					if bg, ly, en, ap := n[0].Load(), n[1].Load(), n[2].Load(), n[3].Load(); bg != W || ly != int64(W*layers) || en != W || ap != 0 {
						t.Fatalf("token %d: %d BeginStep, %d Layer, %d EndStep, %d Append calls; want %d, %d, %d, 0", step, bg, ly, en, ap, W, W*layers, W)
					}
					for i := range b {
						want, err := m.Forward(ctx, alone[i], []int{toks[i]}, ForwardOptions{})
						if err != nil {
							t.Fatal(err)
						}
						if at := sameBits(got[i], want); at >= 0 {
							t.Fatalf("token %d sequence %d: logit %d is %v batched, %v alone (CP 2 both)", step, i, at, got[i][at], want[at])
						}
						toks[i] = Argmax(want)
					}
				}
			})
		}
	}
}

// TestDecodeBatchStepperMixes: rows of one engine that cannot share a
// step all decode layer by layer, and a row that Begin refuses does not
// fail the others; each case must finish well inside the engine's step
// timeout (a row holding the engine for a step while another waits for
// it per layer deadlocked until the timeout):
//   - one row asks for diagnostics (a step per layer), the other not;
//   - the rows' options differ (phased and fused);
//   - a row's sequence was released: it fails alone (a *BatchError
//     naming it), the others decode bit for bit as alone.
func TestDecodeBatchStepperMixes(t *testing.T) {
	m := loadTiny(t, F32, 1)
	ctx := context.Background()
	p := plan.DefaultPolicy()
	p.DenseLayers, p.BudgetTokens = 0, 32
	cfg := engine.ModelConfig(m.Geometry(), p, 64)
	cfg.StepTimeout = 3 * time.Second
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	twin := newEngine(t, m, p, 256, 1, 1)
	rng := rand.New(rand.NewPCG(5, 5))
	mk := func(n int) (*EngineAttention, *EngineAttention, int) {
		a, err := NewEngineAttention(e, m.Geometry())
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewEngineAttention(twin, m.Geometry())
		if err != nil {
			t.Fatal(err)
		}
		ids := randTokens(rng, n)
		lg, err := m.Forward(ctx, a, ids, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(ctx, b, ids, ForwardOptions{}); err != nil {
			t.Fatal(err)
		}
		return a, b, Argmax(lg)
	}
	run := func(name string, attns []Attention, toks []int) ([][]float32, error) {
		t.Helper()
		type out struct {
			lg  [][]float32
			err error
		}
		done := make(chan out, 1)
		start := time.Now()
		go func() {
			lg, err := m.DecodeBatch(ctx, attns, toks)
			done <- out{lg, err}
		}()
		select {
		case o := <-done:
			if d := time.Since(start); d > time.Second {
				t.Errorf("%s: DecodeBatch took %v (waited for the engine)", name, d)
			}
			return o.lg, o.err
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: DecodeBatch did not return in 20 s", name)
			return nil, nil
		}
	}
	same := func(name string, got []float32, twin Attention, tok int) {
		t.Helper()
		want, err := m.Forward(ctx, solo{twin}, []int{tok}, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if at := sameBits(got, want); at >= 0 {
			t.Fatalf("%s: logit %d is %v batched, %v alone", name, at, got[at], want[at])
		}
	}

	a, at, ta := mk(40)
	b, bt, tb := mk(50)
	b.Options.Diagnostics = true
	lg, err := run("diagnostics", []Attention{a, b}, []int{ta, tb})
	if err != nil {
		t.Fatal(err)
	}
	same("diagnostics row 0", lg[0], at, ta)
	same("diagnostics row 1", lg[1], bt, tb)
	if !b.Steps()[len(b.Steps())-1].Diag {
		t.Errorf("the row with diagnostics has none")
	}
	b.Options.Diagnostics = false

	ta, tb = Argmax(lg[0]), Argmax(lg[1])
	a.Options.Phased = true
	lg, err = run("options", []Attention{a, b}, []int{ta, tb})
	if err != nil {
		t.Fatal(err)
	}
	same("options row 0", lg[0], at, ta)
	same("options row 1", lg[1], bt, tb)
	a.Options.Phased = false

	c, _, tc := mk(30)
	if err := c.Release(); err != nil {
		t.Fatal(err)
	}
	ta, tb = Argmax(lg[0]), Argmax(lg[1])
	lg, err = run("released row", []Attention{a, c, b}, []int{ta, tc, tb})
	var be *BatchError
	if !errors.As(err, &be) || !slices.Equal(be.FailedIndices(), []int{1}) || !errors.Is(err, engine.ErrUnknownSequence) {
		t.Fatalf("released row: %v, want a BatchError naming index 1 (unknown sequence)", err)
	}
	same("released: row 0", lg[0], at, ta)
	same("released: row 2", lg[2], bt, tb)

	// The same through a Stepper that learns Begin's refusal at the
	// first layer (decode.ErrBeginRefused, as the cluster client does):
	// the rows go alone from there, and only the released one fails.
	ta, tb = Argmax(lg[0]), Argmax(lg[2])
	lg, err = run("released row, refused ahead", []Attention{aheadAttn{a}, aheadAttn{c}, aheadAttn{b}}, []int{ta, tc, tb})
	if !errors.As(err, &be) || !slices.Equal(be.FailedIndices(), []int{1}) || !errors.Is(err, engine.ErrUnknownSequence) {
		t.Fatalf("released row, refused ahead: %v, want a BatchError naming index 1 (unknown sequence)", err)
	}
	same("refused ahead: row 0", lg[0], at, ta)
	same("refused ahead: row 2", lg[2], bt, tb)
}

// aheadAttn is an EngineAttention whose steps run on aheadStepper.
type aheadAttn struct{ *EngineAttention }

func (a aheadAttn) DecodeRow() (decode.Stepper, decode.Row, decode.Options, bool) {
	s, r, o, ok := a.EngineAttention.DecodeRow()
	if s != nil {
		s = aheadStepper{s}
	}
	return s, r, o, ok
}

// aheadStepper reports its Stepper's Begin refusals at the step's first
// Layer, as a runner that sends its begin ahead of the first layer does.
type aheadStepper struct{ decode.Stepper }

func (s aheadStepper) Begin(ctx context.Context, b decode.Batch) (decode.Step, error) {
	st, err := s.Stepper.Begin(ctx, b)
	if err != nil {
		return &refusedStep{err: err}, nil
	}
	return st, nil
}

// refusedStep is a step whose begin was refused.
type refusedStep struct {
	err  error
	told bool
}

func (r *refusedStep) Layer(context.Context, int, decode.Tensor, decode.Tensor, decode.Tensor, *decode.Result) error {
	if r.told {
		return fmt.Errorf("%w: %w", decode.ErrStepFailed, r.err)
	}
	r.told = true
	return fmt.Errorf("%w: %w", decode.ErrBeginRefused, r.err)
}

func (r *refusedStep) End(context.Context) error { return nil }
