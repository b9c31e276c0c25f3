package decode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/questrt/questrt/plan"
)

// SeqID names a sequence of a Stepper.
type SeqID uint64

// Row is one sequence of a step.
type Row struct {
	Seq SeqID
	// New says that every Layer call of the step brings one new token of
	// the sequence (its key and value), appended after the sequence's
	// tokens before attention, so the token attends to itself. Without
	// it the row only queries the sequence.
	New bool
	// Budget is the row's token budget (0: the policy's); else at least
	// one page.
	Budget int
	// DenseLayers makes the layers below it attend every page of this
	// row, besides the policy's dense layers (0: the policy alone
	// decides; the model's layer count: every layer is dense).
	DenseLayers int
}

// Options tune a step.
type Options struct {
	// Diagnostics measures the selection against dense attention (a
	// second, dense pass) and reports it in Result.Diag. Runners that
	// cannot measure inside an open step refuse it in Begin with
	// ErrBadInput; a remote client runs such a step one layer per call.
	Diagnostics bool
	// TopR is R for the recall diagnostic (10).
	TopR int
	// StopRule, with Diagnostics, replays the stop rules of notes 3.2
	// (exact top-R branch and bound, mass bound, score gap) on every
	// sparse step and reports them in Diagnostics.Stop (the in-process
	// engine only; off by default).
	StopRule bool
	// ForceDense attends every page of every row (a dense reference step).
	ForceDense bool
	// Phased keeps score, top-K and attention separate backend calls
	// where a shard could fuse them: per-phase times, and a reference for
	// the fused path.
	Phased bool
}

// Batch is what Begin plans: the rows in batch order (each sequence at
// most once) and the step's options.
type Batch struct {
	Rows []Row
	// FirstLayer is the first layer the step runs (0 for a whole-model
	// token); Layer calls come for it and higher layers, in increasing
	// order, each at most once.
	FirstLayer int
	// Layers, when positive, bounds the step to the layers
	// [FirstLayer, FirstLayer+Layers): a step of one layer (a dense
	// reference, a measured layer) is Layers 1. 0 runs through the
	// model's last layer. A runner whose remote side runs the step to a
	// fixed last layer (a client's Steps stream) ends it there cleanly.
	Layers  int
	Options Options
}

// LastLayer returns the layer after the step's last one, for a model of
// layers layers.
func (b Batch) LastLayer(layers int) int {
	if b.Layers > 0 {
		return b.FirstLayer + b.Layers
	}
	return layers
}

// NewRows returns the number of rows that bring a new token.
func (b Batch) NewRows() int {
	n := 0
	for _, r := range b.Rows {
		if r.New {
			n++
		}
	}
	return n
}

// Times are the wall times of a layer's phases (on CP rank 0 of TP group
// 0) and of the whole layer call.
type Times struct {
	Score, TopK, Select, Attend, Merge, Total time.Duration
	// Fused is the time of a local step fused into one backend call
	// (Score, TopK and Attend are then zero).
	Fused time.Duration
	// Reused counts the batch's sequences whose selection the layer
	// reused from an earlier step (plan.Policy.ReuseSteps) or from the
	// layer before (plan.Policy.ReuseLayers); RankSkipped
	// says that none ranked, so the layer ran no score phase and no
	// selection collective (counts of CP rank 0 of TP group 0; the
	// in-process engine reports them, a cluster coordinator leaves them
	// zero for now).
	Reused      int
	RankSkipped bool
}

// Collective is the time spent in collectives (selection exchange and
// merge).
func (t Times) Collective() time.Duration { return t.Select + t.Merge }

// Result is one layer's output for the whole batch. A caller reuses one
// Result across layers and steps.
type Result struct {
	// O is where Layer writes the attention output, [rows][QHeads][HeadDim].
	// A device tensor must have exactly that length; a host one (or the
	// zero value) is resized to it, reusing its capacity (see Output).
	O Tensor
	// LSE is the natural-log sum-exp of the scaled logits per row and
	// query head, [rows][QHeads], on the host. A runner that writes a
	// device O leaves it empty (it would cost a host synchronisation).
	LSE []float32
	// Plans is each row's page plan at the layer.
	Plans []plan.Plan
	// Time is the layer's phase times.
	Time Times
	// Diag is each row's diagnostics at the layer, in batch order, when
	// the step's Options.Diagnostics (a runner leaves it alone
	// otherwise).
	Diag []Diagnostics
}

// Stepper runs decode steps. Begin validates and plans a batch and opens
// the step. A step holds what its sequences live on until End: one
// engine (one grid) runs one step at a time, a coordinator one step per
// grid. A Begin that needs what an open step holds waits for it to end,
// up to ctx's deadline (or the runner's own step timeout), and then fails
// with ErrStepOpen. Implementations are safe for concurrent use; a Step
// is used by one goroutine.
type Stepper interface {
	// Begin opens a step for b. Bad input (an unknown sequence, a
	// sequence twice, a budget below one page, a layer outside the
	// model) returns an error wrapping ErrBadInput (or the runner's
	// unknown-sequence error) and changes nothing.
	Begin(ctx context.Context, b Batch) (Step, error)
}

// Step is an open decode step: Layer for each layer in increasing order,
// then End, which must be called whatever happened (it releases the
// Stepper for the next step).
type Step interface {
	// Layer runs layer for every row: q holds the rows' query heads
	// [rows][QHeads][HeadDim]; k and v the new tokens of the rows with
	// New, in batch order, [newRows][KVHeads][HeadDim]. It appends the
	// new tokens, selects pages and writes the merged attention output
	// into res. Bad input (a layer out of order or outside the model,
	// wrong shapes, non-finite values, a sequence whose layers differ in
	// length) returns an error wrapping ErrBadInput and changes nothing:
	// the step stays open and usable. A failure while the layer runs
	// (a worker, a device, a deadline) fails the step: its error and
	// those of later Layer calls wrap ErrStepFailed (a runner that can
	// only learn of some bad input after it sent the layer away, such as
	// a remote client, wraps both); the new tokens of the layers that
	// ran stay appended.
	//
	// A runner that sends the step's begin ahead of its first layer
	// without waiting for the answer (a remote client, a coordinator with
	// a remote worker: one round trip less per token) may learn at the
	// first Layer call that the step did not open: that call then returns
	// Begin's refusal wrapping ErrBeginRefused besides its own class
	// (ErrBadInput, ErrStepOpen, an unknown sequence...), the layer did
	// not run and nothing changed, as after a Begin that returned the
	// error; later Layer calls wrap ErrStepFailed, and End is still to be
	// called.
	//
	// Device tensors (q, k, v and res.O on one device, see Tensor): a
	// runner that takes them in place queues the layer on the device
	// after what the caller queued on q's stream and returns without
	// waiting; res.O is written in that stream's order. Such a runner
	// checks shapes, not values (reading them would cost a host
	// synchronisation), and a failure of the queued work surfaces at
	// End. A runner that cannot read them returns ErrDeviceTensor and
	// changes nothing.
	Layer(ctx context.Context, layer int, q, k, v Tensor, res *Result) error
	// End closes the step. A second End, or a Layer after End, returns
	// ErrStepEnded. After layers queued on a device, End waits for them
	// (one host synchronisation per step) and returns their failure,
	// wrapping ErrStepFailed; the step is closed either way.
	End(ctx context.Context) error
}

// Errors callers act on.
var (
	// ErrBadInput: a batch or layer input the runner refuses; nothing
	// changed.
	ErrBadInput = errors.New("decode: bad input")
	// ErrStepOpen: another step of the Stepper is open.
	ErrStepOpen = errors.New("decode: a step is open")
	// ErrStepEnded: the step was ended.
	ErrStepEnded = errors.New("decode: step ended")
	// ErrStepFailed: an earlier layer of the step failed; only End is
	// left to call.
	ErrStepFailed = errors.New("decode: step failed")
	// ErrBeginRefused: the step's first Layer call learnt that the
	// step's begin, sent ahead of the layer, was refused; nothing
	// changed (see Step.Layer).
	ErrBeginRefused = errors.New("decode: begin refused")
	// ErrDeviceTensor: a tensor on a device this runner cannot read
	// in place.
	ErrDeviceTensor = errors.New("decode: device tensor not supported here")
)

// Output returns the host slice Layer writes n floats of output into:
// O's data resized to n (reusing its capacity; O is set to it). A device
// O is refused with ErrDeviceTensor (a runner that writes device
// outputs checks them itself).
func (r *Result) Output(n int) ([]float32, error) {
	if !r.O.OnHost() {
		return nil, fmt.Errorf("%w: output is on %v", ErrDeviceTensor, r.O.Device)
	}
	d := r.O.Data
	if cap(d) < n {
		d = make([]float32, n)
	}
	r.O = Host(d[:n])
	return r.O.Data, nil
}
