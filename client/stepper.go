package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/api/wire"
	"github.com/questrt/questrt/decode"
)

// Client implements decode.Stepper over the Steps stream.
var _ decode.Stepper = (*Client)(nil)

// handles maps sequence ids to Stepper handles and back.
type handles struct {
	mu   sync.Mutex
	byID map[string]decode.SeqID
	ids  map[decode.SeqID]string
	next decode.SeqID
}

// Handle returns the decode.Stepper handle of sequence id (the row id
// Begin takes for it), the same for the same id until Release.
func (c *Client) Handle(id string) decode.SeqID {
	h := &c.handles
	h.mu.Lock()
	defer h.mu.Unlock()
	if x, ok := h.byID[id]; ok {
		return x
	}
	if h.byID == nil {
		h.byID, h.ids = map[string]decode.SeqID{}, map[decode.SeqID]string{}
	}
	h.next++
	h.byID[id], h.ids[h.next] = h.next, id
	return h.next
}

func (c *Client) forget(id string) {
	h := &c.handles
	h.mu.Lock()
	defer h.mu.Unlock()
	if x, ok := h.byID[id]; ok {
		delete(h.byID, id)
		delete(h.ids, x)
	}
}

func (c *Client) idOf(x decode.SeqID) (string, bool) {
	h := &c.handles
	h.mu.Lock()
	defer h.mu.Unlock()
	id, ok := h.ids[x]
	return id, ok
}

// Begin implements decode.Stepper: rows name sequences by their handles
// (Handle), all coordinated by one node. It sends the step's begin on a
// Steps stream, the one the last step with the same first sequence
// left open (see keptSteps) or a new one, and returns without waiting
// for the coordinator's answer: the first Layer's message follows the
// begin at once and the answer comes with that layer's reply (one round
// trip per token less), so a step the coordinator refuses (an unknown
// sequence, a busy grid, a node short of pages...) is reported by the
// first Layer call, wrapping decode.ErrBeginRefused and the refusal's
// class, with nothing changed (see decode.Step). ctx must outlive the
// step: its end fails the step (each Layer is bounded by its own context
// too). Each layer is then one message each way, and the step runs
// through the model's last layer, or through b's last (b.Layers): the
// coordinator ends the step after it and the stream stays open for the
// next. A step with b.Options.Diagnostics (which the Steps stream does
// not carry) runs each Layer as a Step call of its own instead, which
// returns the rows' diagnostics in the Result's Diag. Layer checks shapes and
// values here (finite, within decode.MagnitudeLimit), so that such bad
// input leaves the step usable; what the coordinator refuses after that
// (a sequence whose layers differ in length) fails the step: the error
// wraps ErrStepFailed, and ErrBadInput too.
func (c *Client) Begin(ctx context.Context, b decode.Batch) (decode.Step, error) {
	if len(b.Rows) == 0 {
		return nil, fmt.Errorf("client: begin step: %w: no rows", decode.ErrBadInput)
	}
	st := &clientStep{ids: make([]string, len(b.Rows)), rows: b.Rows, next: b.FirstLayer}
	for i, r := range b.Rows {
		id, ok := c.idOf(r.Seq)
		if !ok {
			return nil, fmt.Errorf("client: begin step: rows[%d]: %w: unknown sequence handle %d", i, decode.ErrBadInput, r.Seq)
		}
		st.ids[i] = id
		if r.New {
			st.nNew++
		}
	}
	g := c.geoOf(st.ids[0])
	st.g = g
	if b.FirstLayer < 0 || b.FirstLayer >= g.Layers || b.Layers < 0 || b.FirstLayer+b.Layers > g.Layers {
		return nil, fmt.Errorf("client: begin step: %w: %d layers from layer %d in a model of %d", decode.ErrBadInput, b.Layers, b.FirstLayer, g.Layers)
	}
	st.last = b.LastLayer(g.Layers)
	if b.Options.Diagnostics {
		return c.beginMeasured(st, b)
	}
	m := &decodev1.StepsRequest{Begin: true, Ahead: true, FirstLayer: uint32(b.FirstLayer), LastLayer: uint32(st.last),
		ForceDense: b.Options.ForceDense, Phased: b.Options.Phased}
	for i, r := range b.Rows {
		if r.Budget < 0 || r.DenseLayers < 0 {
			return nil, fmt.Errorf("client: begin step: rows[%d]: %w: budget %d, dense layers %d", i, decode.ErrBadInput, r.Budget, r.DenseLayers)
		}
		m.Items = append(m.Items, &decodev1.StepItem{Sequence: st.ids[i], BudgetTokens: uint32(r.Budget),
			DenseLayers: uint32(r.DenseLayers), NewToken: r.New})
	}
	ks, fresh := c.kept.take(st.ids[0])
	st.beginDone = ctx.Err
	fail := func(err error) (decode.Step, error) {
		if ks != nil {
			ks.cancel()
		}
		return nil, beginErr(ctx.Err(), err)
	}
	var err error
	if fresh {
		if ks, err = c.openSteps(ctx); err != nil {
			return fail(err)
		}
	}
	err = ks.stream.Send(m)
	if errors.Is(err, io.EOF) && !fresh {
		// The kept stream ended between steps (the node went or
		// restarted): nothing of m went out, so a new stream takes it.
		ks.cancel()
		if ks, err = c.openSteps(ctx); err != nil {
			return fail(err)
		}
		err = ks.stream.Send(m)
	}
	if err != nil {
		return fail(stepsErr(ks.stream, err))
	}
	st.c, st.ks = c, ks
	st.stopCtx = context.AfterFunc(ctx, ks.cancel) // the step's context ends it
	// The answer (begun, or the refusal) comes with the first layer's.
	return st, nil
}

// beginErr is the error of a begin that did not open the step; ctxErr
// is the begin's context's.
func beginErr(ctxErr, err error) error {
	// The server's copy of the deadline may end the stream first:
	// DEADLINE_EXCEEDED before ctx itself is done.
	if ctxErr != nil || status.Code(err) == codes.DeadlineExceeded {
		// The coordinator did not open the step within ctx: what the
		// engine reports as a step holding the sequences too long (its
		// Aborted answer may not reach this side first).
		return fmt.Errorf("client: begin step: %w (not open before the deadline): %w", decode.ErrStepOpen, err)
	}
	return stepErr("begin step", err)
}

// keptSteps are the Steps streams that steps ran to their end left open
// for the next step, by the first sequence of the step (a later step
// with the same first sequence has the same coordinator, which a
// stream's later steps must have); a step takes its stream out while it
// runs, so concurrent steps never share one.
type keptSteps struct {
	mu     sync.Mutex
	m      map[string]*stepsStream
	closed bool
}

// stepsStream is a Steps stream and what ends it.
type stepsStream struct {
	stream grpc.BidiStreamingClient[decodev1.StepsRequest, decodev1.StepsReply]
	cancel context.CancelFunc
}

// openSteps opens a Steps stream that outlives ctx (a kept stream
// serves later steps; each step's own context guards it while it runs)
// but keeps its values.
func (c *Client) openSteps(ctx context.Context) (*stepsStream, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := c.api.Steps(sctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return &stepsStream{stream: stream, cancel: cancel}, nil
}

// take returns the stream kept for first, if any (fresh false), and
// forgets it.
func (k *keptSteps) take(first string) (*stepsStream, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ks := k.m[first]
	delete(k.m, first)
	return ks, ks == nil
}

// maxKept bounds the Steps streams a Client keeps open: each holds a
// stream of the node's connection (which caps them: a client past the cap
// waits for one to end) and two goroutines there.
const maxKept = 64

// put keeps ks for the next step whose first sequence is first; a
// stream already kept for it, maxKept kept streams, or a closed client
// end ks instead.
func (k *keptSteps) put(first string, ks *stepsStream) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || k.m[first] != nil || len(k.m) >= maxKept {
		ks.cancel()
		return
	}
	if k.m == nil {
		k.m = map[string]*stepsStream{}
	}
	k.m[first] = ks
}

// drop ends the stream kept for first.
func (k *keptSteps) drop(first string) {
	if ks, _ := k.take(first); ks != nil {
		ks.cancel()
	}
}

// close ends every kept stream, and those put later.
func (k *keptSteps) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	for id, ks := range k.m {
		ks.cancel()
		delete(k.m, id)
	}
}

// stepErr marks the coordinator's refusals with the decode sentinels.
func stepErr(what string, err error) error {
	switch status.Code(err) {
	case codes.InvalidArgument:
		return fmt.Errorf("client: %s: %w: %w", what, decode.ErrBadInput, err)
	case codes.Aborted:
		return fmt.Errorf("client: %s: %w: %w", what, decode.ErrStepOpen, err)
	}
	return fmt.Errorf("client: %s: %w", what, err)
}

// clientStep is an open step on a Steps stream.
type clientStep struct {
	g    Geometry
	ids  []string
	rows []decode.Row
	nNew int
	next int
	last int // the layer after the step's last
	c    *Client
	ks   *stepsStream
	// stopCtx stops Begin's context from ending the stream.
	stopCtx func() bool
	// beginDone is Begin's context's Err; begun says the coordinator
	// opened the step (its answer comes with the first layer's).
	beginDone func() error
	begun     bool
	failed    error
	ended     bool
}

// recv returns the stream's next layer reply, reading first the begun
// that the step's begin awaits (on the first layer's reply, or a reply
// of its own from a coordinator that does not take begins ahead).
func (st *clientStep) recv() (*decodev1.StepsReply, error) {
	for {
		rep, err := st.ks.stream.Recv()
		if err != nil || st.begun {
			return rep, err
		}
		if !rep.GetBegun() {
			return nil, errors.New("the coordinator answered a layer of a step it did not open")
		}
		st.begun = true
		if rep.GetO() != nil {
			return rep, nil
		}
	}
}

// Layer implements decode.Step. Layers run in order, each exactly once,
// from the batch's first layer to the model's last.
func (st *clientStep) Layer(ctx context.Context, layer int, q, k, v decode.Tensor, res *decode.Result) error {
	g := st.g
	switch {
	case st.ended:
		return fmt.Errorf("client: layer %d: %w", layer, decode.ErrStepEnded)
	case st.failed != nil:
		return fmt.Errorf("client: layer %d: %w: %w", layer, decode.ErrStepFailed, st.failed)
	case layer == st.last:
		return fmt.Errorf("client: layer %d: %w: the step ran its last layer; End it", layer, decode.ErrBadInput)
	case layer != st.next:
		return fmt.Errorf("client: layer %d: %w: a Steps stream runs its layers in order; the next is %d", layer, decode.ErrBadInput, st.next)
	}
	qd, kd, vd, out, err := st.inputs(layer, q, k, v, res)
	if err != nil {
		return err
	}
	n, qr, kr := len(st.rows), g.QHeads*g.HeadDim, g.KVHeads*g.HeadDim
	start := time.Now()
	stop := context.AfterFunc(ctx, st.ks.cancel) // the layer's own deadline ends the stream
	defer stop()
	m := &decodev1.StepsRequest{Items: make([]*decodev1.StepItem, n)}
	j := 0
	for i, r := range st.rows {
		it := &decodev1.StepItem{Sequence: st.ids[i], Q: wire.Float32Tensor(qd[i*qr:(i+1)*qr], g.QHeads, g.HeadDim)}
		if r.New {
			it.K = wire.Float32Tensor(kd[j*kr:(j+1)*kr], g.KVHeads, g.HeadDim)
			it.V = wire.Float32Tensor(vd[j*kr:(j+1)*kr], g.KVHeads, g.HeadDim)
			j++
		}
		m.Items[i] = it
	}
	st.next = layer + 1
	fail := func(err error) error {
		if !st.begun {
			// No begun came before the end of the stream: the
			// coordinator refused the step (or did not open it in
			// time) and ran nothing of this layer.
			st.failed = fmt.Errorf("client: layer %d: %w: %w", layer, decode.ErrBeginRefused, beginErr(st.beginDone(), err))
			st.ks.cancel()
			return st.failed
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		// Sent: whatever the coordinator refused (ErrBadInput when it
		// was the input), the stream is over and so is the step.
		st.failed = fmt.Errorf("%w: %w", decode.ErrStepFailed, stepErr(fmt.Sprintf("layer %d", layer), err))
		st.ks.cancel()
		return st.failed
	}
	if err := st.ks.stream.Send(m); err != nil {
		if errors.Is(err, io.EOF) {
			// The stream ended: its status, after any begun.
			if _, err = st.recv(); err == nil {
				err = errors.New("the coordinator ended the stream's sending side with a reply owed")
			}
		}
		return fail(err)
	}
	rep, err := st.recv()
	if err != nil {
		return fail(err)
	}
	r, err := decodeOutputs(g, n, rep.GetO(), rep.GetLse(), rep.GetPlans(), rep.GetTime(), rep.GetTotalNs())
	if err != nil {
		return fail(fmt.Errorf("reply: %w", err))
	}
	copy(out, r.O)
	res.LSE = append(res.LSE[:0], r.LSE...)
	res.Plans = append(res.Plans[:0], r.Plans...)
	res.Time = decode.Times{Score: r.Time.Score, TopK: r.Time.TopK, Select: r.Time.Select, Attend: r.Time.Attend,
		Merge: r.Time.Merge, Fused: r.Time.Fused, Total: time.Since(start)}
	return nil
}

// inputs checks a layer's inputs (host tensors of the step's shapes,
// finite, within decode.MagnitudeLimit) and returns them and the
// output's host slice.
func (st *clientStep) inputs(layer int, q, k, v decode.Tensor, res *decode.Result) (qd, kd, vd, out []float32, err error) {
	g := st.g
	if qd, kd, vd, err = decode.HostInputs(q, k, v); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("client: layer %d: %w", layer, err)
	}
	n, qr, kr := len(st.rows), g.QHeads*g.HeadDim, g.KVHeads*g.HeadDim
	if len(qd) != n*qr || len(kd) != st.nNew*kr || len(vd) != len(kd) || !finite(qd) || !finite(kd) || !finite(vd) {
		return nil, nil, nil, nil, fmt.Errorf("client: layer %d: %w: q, k and v must be [%d][%d], [%d][%d] and [%d][%d] finite floats", layer, decode.ErrBadInput, n, qr, st.nNew, kr, st.nNew, kr)
	}
	if err := decode.CheckMagnitude("q", qd, g.HeadDim); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("client: layer %d: %w", layer, err)
	}
	if err := decode.CheckMagnitude("k", kd, g.HeadDim); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("client: layer %d: %w", layer, err)
	}
	if out, err = res.Output(n * qr); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("client: layer %d: %w", layer, err)
	}
	return qd, kd, vd, out, nil
}

// finite reports whether every element of x is finite.
func finite(x []float32) bool {
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return false
		}
	}
	return true
}

// End implements decode.Step. It returns at once: after the model's
// last layer the coordinator ends the step behind its last reply (its
// workers' EndStep round, which the next step over the grid waits for
// in its Begin, not this client) and the stream stays open for the next
// step with the same first sequence; before it (or after a failure) End
// ends the stream, and the coordinator fails the step (the new tokens of
// the layers that ran stay appended). A failure of the coordinator's own
// End comes back to no client: the node logs it, and the grid's next
// step meets it in Begin.
func (st *clientStep) End(context.Context) error {
	if st.ended {
		return decode.ErrStepEnded
	}
	st.ended = true
	if !st.stopCtx() || st.failed != nil || st.next != st.last {
		st.ks.cancel()
		return nil
	}
	st.c.kept.put(st.ids[0], st.ks)
	return nil
}
