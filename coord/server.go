package coord

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/api/wire"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/redact"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
)

// ServerConfig configures the Decode service of a node.
type ServerConfig struct {
	// Coordinator runs the sequences this node coordinates. Required.
	Coordinator *Coordinator
	// Status fills the parts of a StatusReply the coordinator does not
	// know (members, devices, hosted grids, version); nil leaves them
	// empty.
	Status func(*decodev1.StatusReply)
}

// Server is the Decode gRPC service of a node: calls for sequences this
// node coordinates run on its Coordinator, the others are forwarded to
// their coordinator's node (looked up in the membership view).
type Server struct {
	decodev1.UnimplementedDecodeServer
	cfg ServerConfig
	c   *Coordinator
	// draining is closed by Drain: Steps streams end between steps.
	draining  chan struct{}
	drainOnce sync.Once
}

// Drain makes the Steps streams that clients keep between decode steps
// end (UNAVAILABLE) instead of waiting for a next step, so that a node's
// graceful stop does not wait for them; a step in progress runs on. Call
// it before the gRPC server's GracefulStop.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

var _ decodev1.DecodeServer = (*Server)(nil)

// NewServer returns the service; register it with Register.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Coordinator == nil {
		return nil, errors.New("decode server: no coordinator")
	}
	return &Server{cfg: cfg, c: cfg.Coordinator, draining: make(chan struct{})}, nil
}

// Register adds the service to a gRPC server.
func (s *Server) Register(r grpc.ServiceRegistrar) { decodev1.RegisterDecodeServer(r, s) }

// forward returns a client of the node that coordinates sequence id, or
// nil when it is this node.
func (s *Server) forward(id string) (decodev1.DecodeClient, error) {
	owner, err := Owner(id)
	if err != nil {
		return nil, Status(err)
	}
	if owner == s.c.cfg.Name {
		return nil, nil
	}
	m, ok := s.c.cfg.View().Member(owner)
	if !ok || !m.State.Up() {
		return nil, status.Errorf(codes.Unavailable, "sequence %q: its coordinator %s is not in this node's view", id, owner)
	}
	conn, err := s.c.cfg.Conn(m.Meta.GRPCAddr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "sequence %q: coordinator %s at %s: %v", id, owner, m.Meta.GRPCAddr, err)
	}
	return decodev1.NewDecodeClient(passAuth{conn}), nil
}

// passAuth is a connection that passes the caller's authorization
// metadata (the bearer token of the client API) on to the coordinator a
// call is forwarded to: gRPC does not copy incoming metadata into
// outgoing calls.
type passAuth struct{ grpc.ClientConnInterface }

func (p passAuth) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return p.ClientConnInterface.Invoke(withAuth(ctx), method, args, reply, opts...)
}

func (p passAuth) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return p.ClientConnInterface.NewStream(withAuth(ctx), desc, method, opts...)
}

// withAuth adds the incoming authorization metadata of ctx to its
// outgoing metadata.
func withAuth(ctx context.Context) context.Context {
	in, _ := metadata.FromIncomingContext(ctx)
	auth := in.Get("authorization")
	if len(auth) == 0 {
		return ctx
	}
	if out, _ := metadata.FromOutgoingContext(ctx); len(out.Get("authorization")) > 0 {
		return ctx
	}
	kv := make([]string, 0, 2*len(auth))
	for _, v := range auth {
		kv = append(kv, "authorization", v)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// Create implements decodev1.DecodeServer.
func (s *Server) Create(ctx context.Context, req *decodev1.CreateRequest) (*decodev1.CreateReply, error) {
	p := plan.Striped
	if req.GetPlacement() != "" {
		var err error
		if p, err = plan.ParsePlacement(req.GetPlacement()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "placement %q: %v", req.GetPlacement(), err)
		}
	}
	var ec *engine.Config
	if req.GetConfig() != nil {
		wc, err := remote.GridConfigFromProto(req.GetConfig())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "create: config: %v", err)
		}
		e := engine.Config{Layers: wc.Layers, Geometry: wc.Geometry, CP: wc.CP, TP: wc.TP, CapacityPages: wc.Capacity,
			Policy: wc.Policy, Selection: wc.Mode}
		ec = &e
	}
	cr, err := s.c.Create(ctx, p, ec)
	if err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("create: %w", err))
	}
	return &decodev1.CreateReply{Sequence: cr.ID, Nodes: cr.Nodes, View: cr.View}, nil
}

// Append implements decodev1.DecodeServer.
func (s *Server) Append(ctx context.Context, req *decodev1.AppendRequest) (*decodev1.AppendReply, error) {
	if fw, err := s.forward(req.GetSequence()); fw != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return fw.Append(ctx, req)
	}
	ec, err := s.c.SeqConfig(req.GetSequence())
	if err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("append: %w", err))
	}
	if err := checkLayer(ec, req.GetLayer()); err != nil {
		return nil, err
	}
	k, err := wire.Float32s(req.GetK(), "k", -1, ec.KVHeads, ec.HeadDim)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "append: "+err.Error())
	}
	v, err := wire.Float32s(req.GetV(), "v", len(k)/max(1, ec.KVHeads*ec.HeadDim), ec.KVHeads, ec.HeadDim)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "append: "+err.Error())
	}
	if err := s.c.Append(ctx, req.GetSequence(), int(req.GetLayer()), k, v); err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("append %s layer %d: %w", req.GetSequence(), req.GetLayer(), err))
	}
	return &decodev1.AppendReply{}, nil
}

func checkLayer(ec engine.Config, layer uint32) error {
	if n := ec.Layers; int64(layer) >= int64(n) {
		return status.Errorf(codes.InvalidArgument, "layer %d: the model has %d layers", layer, n)
	}
	return nil
}

// Step implements decodev1.DecodeServer.
func (s *Server) Step(ctx context.Context, req *decodev1.StepRequest) (*decodev1.StepReply, error) {
	items := req.GetItems()
	if len(items) == 0 {
		return nil, status.Error(codes.InvalidArgument, "step: items: empty")
	}
	// All items must share a coordinator; forward when it is another node.
	if _, err := owner("step", items); err != nil {
		return nil, err
	}
	if fw, err := s.forward(items[0].GetSequence()); fw != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return fw.Step(ctx, req)
	}
	ec, err := s.c.SeqConfig(items[0].GetSequence())
	if err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("step: items[0]: %w", err))
	}
	if err := checkLayer(ec, req.GetLayer()); err != nil {
		return nil, err
	}
	its, err := s.decodeItems("step", ec, items)
	if err != nil {
		return nil, err
	}
	opt := engine.StepOptions{ForceDense: req.GetForceDense(), Phased: req.GetPhased(), Diagnostics: req.GetDiagnostics()}
	var res engine.Result
	if err := s.c.Step(ctx, int(req.GetLayer()), its, opt, &res); err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("step layer %d: %w", req.GetLayer(), err))
	}
	n := len(items)
	rep := &decodev1.StepReply{
		O:       wire.Float32Tensor(res.O, n, ec.QHeads, ec.HeadDim),
		Lse:     wire.Float32Tensor(res.LSE, n, ec.QHeads),
		TotalNs: res.Time.Total.Nanoseconds(),
		Time:    timesProto(res.Time),
	}
	rep.Plans = plansProto(res.Plans)
	for i, dg := range res.Diag {
		indptr := []int32{0}
		var pages []int32
		for _, sel := range dg.Selected {
			pages = append(pages, sel...)
			indptr = append(indptr, int32(len(pages)))
		}
		d := &decodev1.Diagnostics{
			Indptr:   wire.Int32Tensor(indptr, len(indptr)),
			Pages:    wire.Int32Tensor(pages, len(pages)),
			DenseLse: wire.Float32Tensor(res.DenseLSE[i*ec.QHeads:(i+1)*ec.QHeads], ec.QHeads),
			AbsL2:    dg.AbsL2,
			Recall:   dg.Recall, MassRecall: dg.MassRecall, MinMassRecall: dg.MinMassRecall,
			HeadRecall: dg.HeadRecall, HeadMassRecall: dg.HeadMassRecall,
			SlackP50: dg.SlackP50, SlackP90: dg.SlackP90, SlackMax: dg.SlackMax,
		}
		if !math.IsNaN(dg.RelL2) {
			d.RelL2, d.RelL2Defined = dg.RelL2, true
		}
		if dg.Scores != nil {
			np := res.Plans[i].Pages
			flat := make([]float32, 0, ec.QHeads*np)
			for _, sc := range dg.Scores {
				flat = append(flat, sc...)
			}
			d.Scores = wire.Float32Tensor(flat, ec.QHeads, np)
		}
		rep.Diag = append(rep.Diag, d)
	}
	return rep, nil
}

// decodeItems decodes and checks a step's items (what does not need the
// sequence table).
func (s *Server) decodeItems(what string, ec engine.Config, items []*decodev1.StepItem) ([]StepItem, error) {
	its := make([]StepItem, len(items))
	for i, it := range items {
		q, err := wire.Float32s(it.GetQ(), fmt.Sprintf("items[%d].q", i), ec.QHeads, ec.HeadDim)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, what+": "+err.Error())
		}
		its[i] = StepItem{Seq: it.GetSequence(), Request: engine.Request{Q: q, BudgetTokens: int(it.GetBudgetTokens()), DenseLayers: int(it.GetDenseLayers())}}
		if it.GetK() != nil || it.GetV() != nil {
			k, err := wire.Float32s(it.GetK(), fmt.Sprintf("items[%d].k", i), ec.KVHeads, ec.HeadDim)
			if err != nil {
				return nil, status.Error(codes.InvalidArgument, what+": "+err.Error())
			}
			v, err := wire.Float32s(it.GetV(), fmt.Sprintf("items[%d].v", i), ec.KVHeads, ec.HeadDim)
			if err != nil {
				return nil, status.Error(codes.InvalidArgument, what+": "+err.Error())
			}
			its[i].K, its[i].V = k, v
		}
		if b := it.GetBudgetTokens(); b > 0 && int(b) < ec.PageSize {
			return nil, status.Errorf(codes.InvalidArgument, "%s: items[%d].budget_tokens %d: below one page (%d tokens)", what, i, b, ec.PageSize)
		}
	}
	return its, nil
}

// owner returns the one coordinator of a step's items.
func owner(what string, items []*decodev1.StepItem) (string, error) {
	if len(items) == 0 {
		return "", status.Errorf(codes.InvalidArgument, "%s: items: empty", what)
	}
	first, err := Owner(items[0].GetSequence())
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "%s: items[0].sequence: %v", what, err)
	}
	for i, it := range items[1:] {
		o, err := Owner(it.GetSequence())
		if err != nil {
			return "", status.Errorf(codes.InvalidArgument, "%s: items[%d].sequence: %v", what, i+1, err)
		}
		if o != first {
			return "", status.Errorf(codes.InvalidArgument, "%s: items[%d].sequence %q: coordinated by %s, items[0] by %s; one step's items share a coordinator", what, i+1, it.GetSequence(), o, first)
		}
	}
	return first, nil
}

// plansProto encodes plans.
func plansProto(plans []plan.Plan) []*decodev1.Plan {
	out := make([]*decodev1.Plan, 0, len(plans))
	for _, p := range plans {
		out = append(out, &decodev1.Plan{Pages: uint32(p.Pages), K: uint32(p.K), Rank: uint32(p.Rank),
			Sink: uint32(p.Sink), Local: uint32(p.Local), Dense: p.Dense})
	}
	return out
}

// timesProto encodes a result's phase times.
func timesProto(t engine.Times) *workerv1.Times {
	return &workerv1.Times{ScoreNs: t.Score.Nanoseconds(), TopkNs: t.TopK.Nanoseconds(),
		SelectNs: t.Select.Nanoseconds(), AttendNs: t.Attend.Nanoseconds(),
		MergeNs: t.Merge.Nanoseconds(), FusedNs: t.Fused.Nanoseconds()}
}

// Steps implements decodev1.DecodeServer: one decode step over a range
// of layers through the coordinator's Stepper (Begin, one Layer per
// message, End), a message each way per layer. A first message with
// begin set opens the step alone and is answered with begun; once such
// a step ran its last layer the stream stays open for the client's next
// step, which starts with a begin message again (its sequences
// coordinated by this node too), until the client closes its side (a
// Stepper keeps one stream from token to token: opening a stream costs
// headers both ways and a handler goroutine, per token otherwise).
func (s *Server) Steps(stream grpc.BidiStreamingServer[decodev1.StepsRequest, decodev1.StepsReply]) error {
	ctx := stream.Context()
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	o, err := owner("steps", req.GetItems())
	if err != nil {
		return err
	}
	if o != s.c.cfg.Name {
		return s.proxySteps(ctx, req.GetItems()[0].GetSequence(), req, stream)
	}
	recv := newStepsReceiver(stream)
	defer recv.stop()
	for {
		if err := s.steps(ctx, stream, recv, req); err != nil || !req.GetBegin() {
			return err
		}
		// The step ended: wait, without a bound, for the client's next
		// begin or the end of its side.
		if req, err = recv.next(ctx, 0, s.draining); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if errors.Is(err, errDraining) {
				return status.Error(codes.Unavailable, "steps: the node is draining")
			}
			return statusCtx(ctx, fmt.Errorf("steps: receive the next begin: %w", err))
		}
		if !req.GetBegin() {
			return status.Error(codes.InvalidArgument, "steps: after a step's last layer, a Steps stream takes a begin message (the next step) or its end")
		}
		o, err := owner("steps", req.GetItems())
		if err != nil {
			return err
		}
		if o != s.c.cfg.Name {
			return status.Errorf(codes.InvalidArgument, "steps: a later step on a Steps stream must be coordinated by %s too (items[0] is %s's)", s.c.cfg.Name, o)
		}
	}
}

// steps runs one step of a Steps stream coordinated by this node, whose
// first message is req.
func (s *Server) steps(ctx context.Context, stream grpc.BidiStreamingServer[decodev1.StepsRequest, decodev1.StepsReply], recv *stepsReceiver, req *decodev1.StepsRequest) error {
	ec, err := s.c.SeqConfig(req.GetItems()[0].GetSequence())
	if err != nil {
		return statusCtx(ctx, fmt.Errorf("steps: items[0]: %w", err))
	}
	first, last := int(req.GetFirstLayer()), int(req.GetLastLayer())
	if first >= last || last > ec.Layers {
		return status.Errorf(codes.InvalidArgument, "steps: layers [%d, %d): want first < last <= %d", first, last, ec.Layers)
	}
	b := decode.Batch{FirstLayer: first, Options: decode.Options{ForceDense: req.GetForceDense(), Phased: req.GetPhased()}}
	ids := make([]string, len(req.GetItems()))
	for i, it := range req.GetItems() {
		ids[i] = it.GetSequence()
		h, err := s.c.Handle(ids[i])
		if err != nil {
			return statusCtx(ctx, fmt.Errorf("steps: items[%d]: %w", i, err))
		}
		row := decode.Row{Seq: h, Budget: int(it.GetBudgetTokens()), DenseLayers: int(it.GetDenseLayers()), New: it.GetNewToken()}
		if !req.GetBegin() {
			row.New = it.GetK() != nil || it.GetV() != nil
		}
		if b := row.Budget; b > 0 && b < ec.PageSize {
			return status.Errorf(codes.InvalidArgument, "steps: items[%d].budget_tokens %d: below one page (%d tokens)", i, b, ec.PageSize)
		}
		b.Rows = append(b.Rows, row)
	}
	var its []StepItem
	if !req.GetBegin() {
		// The first message brings the first layer's tensors too: a
		// malformed one is refused before the step opens.
		if its, err = s.decodeItems(fmt.Sprintf("steps layer %d", first), ec, req.GetItems()); err != nil {
			return err
		}
	}
	return s.runSteps(ctx, stream, recv, req, its, ec, b, ids)
}

// runSteps runs an opened Steps stream's step: Begin on the coordinator,
// then one layer per message, each message within stepsIdle of the
// previous reply (a client that stalls between layers holds the grid's
// engine: the stream ends with DEADLINE_EXCEEDED instead), then End,
// which reports the step's outcome to the metrics. firstIts are the
// decoded items of a first message that runs the first layer (nil after
// a begin message).
func (s *Server) runSteps(ctx context.Context, stream grpc.BidiStreamingServer[decodev1.StepsRequest, decodev1.StepsReply], recv *stepsReceiver,
	req *decodev1.StepsRequest, firstIts []StepItem, ec engine.Config, b decode.Batch, ids []string) (err error) {
	first, last := b.FirstLayer, int(req.GetLastLayer())
	start := time.Now()
	st, err := s.c.Begin(ctx, b)
	if err != nil {
		return statusCtx(ctx, fmt.Errorf("steps: %w", err))
	}
	ended := false
	defer func() {
		if ended {
			return
		}
		if cs, ok := st.(*coordStep); ok {
			cs.outcome(err)
		}
		st.End(ctx)
	}()
	var msg *decodev1.StepsRequest
	// owe: begun is still to be said (ahead: with the first layer's
	// reply, or before the error that ends the stream after the step
	// opened; a begin refused at the first layer says no begun).
	owe := req.GetBegin() && req.GetAhead()
	beginRefused := false
	defer func() {
		if owe && err != nil && !beginRefused {
			_ = stream.Send(&decodev1.StepsReply{Begun: true})
		}
	}()
	if req.GetBegin() && !owe {
		if err := stream.Send(&decodev1.StepsReply{Begun: true}); err != nil {
			return err
		}
	}
	n := len(ids)
	its := firstIts
	var res decode.Result
	var q, k, v []float32
	for l := first; l < last; l++ {
		if its == nil {
			if msg, err = recv.next(ctx, stepsIdle(ec.StepTimeout), nil); err != nil {
				if errors.Is(err, errStepsIdle) {
					return status.Error(codes.DeadlineExceeded, "steps: receive layer "+strconv.Itoa(l)+": "+err.Error())
				}
				return statusCtx(ctx, fmt.Errorf("steps: receive layer %d: %w", l, err))
			}
			what := fmt.Sprintf("steps layer %d", l)
			if len(msg.GetItems()) != n {
				return status.Errorf(codes.InvalidArgument, "%s: %d items, the step has %d", what, len(msg.GetItems()), n)
			}
			if its, err = s.decodeItems(what, ec, msg.GetItems()); err != nil {
				return err
			}
		}
		what := fmt.Sprintf("steps layer %d", l)
		q, k, v = q[:0], k[:0], v[:0]
		for i, it := range its {
			switch {
			case it.Seq != ids[i]:
				return status.Errorf(codes.InvalidArgument, "%s: items[%d].sequence %q, the step's is %q", what, i, it.Seq, ids[i])
			case (it.K != nil) != b.Rows[i].New:
				return status.Errorf(codes.InvalidArgument, "%s: items[%d]: a new token at some layers of a step and not at others", what, i)
			}
			q, k, v = append(q, it.Q...), append(k, it.K...), append(v, it.V...)
		}
		its = nil
		res.O = decode.Tensor{}
		if err := st.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(v), &res); err != nil {
			beginRefused = errors.Is(err, decode.ErrBeginRefused) && !errors.Is(err, decode.ErrStepFailed)
			return statusCtx(ctx, fmt.Errorf("steps: %w", err))
		}
		rep := &decodev1.StepsReply{Layer: uint32(l),
			O:   wire.Float32Tensor(res.O.Data, n, ec.QHeads, ec.HeadDim),
			Lse: wire.Float32Tensor(res.LSE, n, ec.QHeads), Plans: plansProto(res.Plans), Time: timesProto(res.Time),
			Begun: owe}
		owe = false
		if l == last-1 && req.GetBegin() {
			// A Stepper's stream (begin): the last reply goes out first
			// and the step ends behind it (the workers' EndStep round off
			// the client's path; the client does not wait for it, and
			// the grid's next step waits for it in Begin). The step ran:
			// End's context outlives a client that goes once it has
			// its reply.
			ended = true
			rep.TotalNs = time.Since(start).Nanoseconds()
			serr := stream.Send(rep)
			if err := st.End(context.WithoutCancel(ctx)); err != nil {
				// The client has its reply and may be gone: its End
				// reports nothing (clientStep.End), so the node says it.
				// The stream goes on: ending it with this error would
				// fail the client's next step on it with a failure of
				// this one, which the grid's next Begin meets anyway
				// if it lasts.
				s.c.log.Warn("steps: ending a step after its last reply failed", "err", err)
			}
			return serr
		}
		if l == last-1 {
			ended = true
			if err := st.End(ctx); err != nil {
				return statusCtx(ctx, fmt.Errorf("steps: %w", err))
			}
			rep.TotalNs = time.Since(start).Nanoseconds()
		}
		if err := stream.Send(rep); err != nil {
			return err
		}
	}
	return nil
}

// errStepsIdle: a Steps client sent no message for a layer within
// stepsIdle; the stream ends with DEADLINE_EXCEEDED.
var errStepsIdle = errors.New("steps: the client sent no layer in time")

// stepsIdle is how long a Steps stream's step waits for its client's
// next layer, while it holds the grid: the client computes the layer's
// inputs meanwhile (a whole batch's MLP and projections for a model), so
// it is ten step timeouts, at least 30 s.
func stepsIdle(stepTimeout time.Duration) time.Duration {
	return max(10*stepTimeout, 30*time.Second)
}

// stepsReceiver receives a Steps stream's messages on a goroutine of
// its own, so that the handler can wait for the next one with a
// deadline; the goroutine ends with the stream (or at stop).
type stepsReceiver struct {
	ch   chan stepsMsg
	done chan struct{}
}

type stepsMsg struct {
	m   *decodev1.StepsRequest
	err error
}

func newStepsReceiver(stream grpc.BidiStreamingServer[decodev1.StepsRequest, decodev1.StepsReply]) *stepsReceiver {
	r := &stepsReceiver{ch: make(chan stepsMsg), done: make(chan struct{})}
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case r.ch <- stepsMsg{m, err}:
			case <-r.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return r
}

// errDraining: the node drains (Server.Drain) while a Steps stream waits
// for its next step.
var errDraining = errors.New("steps: the node is draining")

// next returns the stream's next message, waiting at most d (0: no
// bound; past it, the error wraps errStepsIdle), until ctx ends, or until
// stop is closed (errDraining; nil: never); a stream the client ended
// wraps context.Canceled and the stream's error (io.EOF when the client
// closed its side).
func (r *stepsReceiver) next(ctx context.Context, d time.Duration, stop <-chan struct{}) (*decodev1.StepsRequest, error) {
	var idle <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		idle = t.C
	}
	select {
	case x := <-r.ch:
		if x.err != nil {
			return nil, fmt.Errorf("%w: %w", context.Canceled, x.err)
		}
		return x.m, nil
	case <-stop:
		return nil, errDraining
	case <-idle:
		return nil, fmt.Errorf("%w: no message within %v while the step holds the grid", errStepsIdle, d)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// stop ends the receiving goroutine once the stream ends (the handler
// returns and gRPC ends the stream's Recv).
func (r *stepsReceiver) stop() { close(r.done) }

// proxySteps relays a Steps stream to the coordinator of sequence id.
func (s *Server) proxySteps(ctx context.Context, id string, first *decodev1.StepsRequest, down grpc.BidiStreamingServer[decodev1.StepsRequest, decodev1.StepsReply]) error {
	fw, err := s.forward(id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up, err := fw.Steps(ctx)
	if err != nil {
		return err
	}
	if err := up.Send(first); err != nil {
		return err
	}
	// A stream that begins steps stays open between them (Steps): when
	// this node drains, the relay ends such a stream (UNAVAILABLE) once
	// no step runs on it, as the coordinator ends its own. between is
	// set after a step's last reply went down (the one with total_ns)
	// and cleared when the next begin comes up.
	var between, drained atomic.Bool
	draining := s.draining
	if !first.GetBegin() {
		draining = nil
	}
	errDrained := status.Error(codes.Unavailable, "steps: the relaying node is draining")
	// Client to coordinator on a goroutine owned by the stream: it ends
	// when the client closes its side or when this handler returns (gRPC
	// then cancels the stream, and its Recv fails). Waiting for it here
	// would hang with a client that reads to the end of the stream before
	// it closes its own side.
	go func() {
		for {
			m, err := down.Recv()
			if err != nil {
				up.CloseSend()
				return
			}
			if m.GetBegin() {
				between.Store(false)
			}
			if up.Send(m) != nil {
				return
			}
		}
	}()
	go func() {
		select {
		case <-draining:
			if between.Load() {
				drained.Store(true)
				cancel()
			}
		case <-ctx.Done():
		}
	}()
	for {
		m, err := up.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if drained.Load() {
				return errDrained
			}
			return err
		}
		if err := down.Send(m); err != nil {
			return err
		}
		if m.GetTotalNs() > 0 && draining != nil {
			between.Store(true)
			select {
			case <-draining:
				return errDrained // the step ended: the stream goes with the node
			default:
			}
		}
	}
}

// Fork implements decodev1.DecodeServer.
func (s *Server) Fork(ctx context.Context, req *decodev1.ForkRequest) (*decodev1.ForkReply, error) {
	if fw, err := s.forward(req.GetSequence()); fw != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return fw.Fork(ctx, req)
	}
	child, err := s.c.Fork(ctx, req.GetSequence())
	if err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("fork %s: %w", req.GetSequence(), err))
	}
	return &decodev1.ForkReply{Sequence: child}, nil
}

// Rollback implements decodev1.DecodeServer.
func (s *Server) Rollback(ctx context.Context, req *decodev1.RollbackRequest) (*decodev1.RollbackReply, error) {
	if fw, err := s.forward(req.GetSequence()); fw != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return fw.Rollback(ctx, req)
	}
	if req.GetTokens() == 0 || req.GetTokens() > math.MaxInt32 {
		return nil, status.Errorf(codes.InvalidArgument, "rollback %s: tokens %d: want 1 up to the length", req.GetSequence(), req.GetTokens())
	}
	if err := s.c.Rollback(ctx, req.GetSequence(), int(req.GetTokens())); err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("rollback %s: %w", req.GetSequence(), err))
	}
	return &decodev1.RollbackReply{}, nil
}

// Release implements decodev1.DecodeServer.
func (s *Server) Release(ctx context.Context, req *decodev1.ReleaseRequest) (*decodev1.ReleaseReply, error) {
	if fw, err := s.forward(req.GetSequence()); fw != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return fw.Release(ctx, req)
	}
	if err := s.c.Release(ctx, req.GetSequence()); err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("release %s: %w", req.GetSequence(), err))
	}
	return &decodev1.ReleaseReply{}, nil
}

// Length implements decodev1.DecodeServer.
func (s *Server) Length(ctx context.Context, req *decodev1.LengthRequest) (*decodev1.LengthReply, error) {
	if fw, err := s.forward(req.GetSequence()); fw != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return fw.Length(ctx, req)
	}
	n, err := s.c.Len(req.GetSequence())
	if err != nil {
		return nil, statusCtx(ctx, fmt.Errorf("length %s: %w", req.GetSequence(), err))
	}
	return &decodev1.LengthReply{Length: uint64(n)}, nil
}

// Status implements decodev1.DecodeServer.
func (s *Server) Status(ctx context.Context, _ *decodev1.StatusRequest) (*decodev1.StatusReply, error) {
	c := s.c
	v := c.cfg.View()
	rep := &decodev1.StatusReply{
		Node:      c.cfg.Name,
		View:      v.Version,
		Config:    remote.GridConfigProto(c.cfg.Engine.WorkerConfig()),
		Sequences: uint32(c.Sequences()),
	}
	for _, m := range v.Members {
		rep.Members = append(rep.Members, &decodev1.Member{Name: m.Name, State: m.State.String(),
			GrpcAddr: m.Meta.GRPCAddr, Version: m.Meta.Version,
			FreePages: uint32(min(m.Meta.FreePages, math.MaxUint32)), TotalPages: uint32(min(m.Meta.TotalPages, math.MaxUint32))})
	}
	rep.Recovered, rep.Damaged = recoveryProto(c.Recovery())
	if s.cfg.Status != nil {
		s.cfg.Status(rep)
	}
	return rep, nil
}

// Recovered implements decodev1.DecodeServer: this node's coordinator
// opens the grid of the node's config (Coordinator.Recover), waits for
// its adoption (bounded: Config.RecoverWait and the caller's deadline)
// and lists what it adopted. A recovery still not done then answers
// UNAVAILABLE with a message that says to retry and a RetryInfo detail
// (the pause to take first); the recovery goes on meanwhile.
func (s *Server) Recovered(ctx context.Context, _ *decodev1.RecoveredRequest) (*decodev1.RecoveredReply, error) {
	r, err := s.c.Recover(ctx)
	if errors.Is(err, ErrRecovering) {
		st := status.New(codes.Unavailable, err.Error())
		if with, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(RecoveredRetryDelay)}); derr == nil {
			st = with
		}
		return nil, st.Err()
	}
	if err != nil {
		return nil, statusCtx(ctx, err)
	}
	rep := &decodev1.RecoveredReply{}
	rep.Sequences, rep.Damaged = recoveryProto(r)
	return rep, nil
}

// RecoveredRetryDelay is the pause the Decode API's Recovered asks for
// (its RetryInfo) when it answers UNAVAILABLE because the recovery is
// not finished.
const RecoveredRetryDelay = 500 * time.Millisecond

// recoveryProto is r as the Decode API reports it.
func recoveryProto(r Recovery) ([]*decodev1.RecoveredSequence, []*decodev1.DamagedSequence) {
	var seqs []*decodev1.RecoveredSequence
	for _, q := range r.Sequences {
		p := &decodev1.RecoveredSequence{Sequence: q.ID, Length: uint64(q.Len()), Had: uint64(q.Had),
			LostTokens: uint64(q.LostTokens()), Nodes: q.Nodes, RenamedFrom: q.RenamedFrom}
		for _, n := range q.Lens {
			p.Lens = append(p.Lens, uint64(n))
		}
		for _, n := range q.Lost() {
			p.Lost = append(p.Lost, uint64(n))
		}
		for _, n := range q.RolledBack {
			p.RolledBack = append(p.RolledBack, uint64(n))
		}
		p.LostExact = q.LostExact()
		seqs = append(seqs, p)
	}
	var dmg []*decodev1.DamagedSequence
	for _, d := range r.Damaged {
		id := d.ID
		if id == "" {
			id = d.Grid + "#" + strconv.FormatUint(d.Seq, 10)
		}
		// A client reads these: no peer's address (the node logged
		// the whole error when it adopted).
		msg, _ := redact.Addresses(d.Err.Error())
		reason, _ := redact.Addresses(d.Reason)
		dmg = append(dmg, &decodev1.DamagedSequence{Sequence: id, Error: msg, Parked: d.Parked, Reason: reason})
	}
	return seqs, dmg
}

// Status maps a coordinator, engine or worker error to a gRPC status
// error with the same message: bad input INVALID_ARGUMENT, unknown
// sequences NOT_FOUND, no pages, no node with capacity or a grid full of
// sequences (worker.ErrTooManySequences) RESOURCE_EXHAUSTED, broken
// sequences FAILED_PRECONDITION, a lost grid or an unreachable node
// UNAVAILABLE, a closed coordinator UNAVAILABLE, a sequence whose
// recovered page failed its check at first use DATA_LOSS.
func Status(err error) error {
	if err == nil {
		return nil
	}
	code := codes.Internal
	switch {
	case errors.Is(err, decode.ErrStepFailed) && errors.Is(err, engine.ErrBadInput):
		// Refused after part of the step ran (one grid refused what
		// another took): not a refusal that changed nothing.
		code = codes.FailedPrecondition
	case errors.Is(err, engine.ErrBadInput), errors.Is(err, worker.ErrBadMessage), errors.Is(err, ErrBadSequenceID), errors.Is(err, decode.ErrDeviceTensor):
		code = codes.InvalidArgument
	case errors.Is(err, engine.ErrUnknownSequence), errors.Is(err, ErrUnknownSequence), errors.Is(err, worker.ErrUnknownSequence):
		code = codes.NotFound
	case errors.Is(err, pagestore.ErrPersist) && (errors.Is(err, worker.ErrChanged) || errors.Is(err, engine.ErrBroken)):
		// The change took effect in memory and the sequence is broken
		// (the disk may be full: the message says): not a refusal
		// that changed nothing.
		code = codes.FailedPrecondition
	case errors.Is(err, pagestore.ErrPoolExhausted), errors.Is(err, cluster.ErrNoCapacity), errors.Is(err, worker.ErrTooManySequences):
		code = codes.ResourceExhausted
	case errors.Is(err, engine.ErrBroken), errors.Is(err, pagestore.ErrUnevenLayers):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrGridLost), errors.Is(err, remote.ErrUnavailable), errors.Is(err, ErrClosed), errors.Is(err, engine.ErrClosed),
		errors.Is(err, ErrRecovering):
		code = codes.Unavailable
	case errors.Is(err, pagestore.ErrDiskFull):
		code = codes.ResourceExhausted
	case errors.Is(err, pagestore.ErrDamaged):
		// A recovered page failed its check at first use
		// (--recovery-verify on-read): the sequence is gone on that
		// node.
		code = codes.DataLoss
	case errors.Is(err, decode.ErrStepOpen):
		// Another step held the sequences' grid until the deadline:
		// try again.
		code = codes.Aborted
	case errors.Is(err, decode.ErrStepEnded):
		code = codes.FailedPrecondition
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.Unavailable
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	default:
		// A status from another node (a forwarded call) keeps its code.
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
			code = st.Code()
		}
	}
	return status.Error(code, err.Error())
}

// statusCtx is Status, except that an error of the caller's own deadline
// or cancellation keeps its code (a step deadline the node set and missed
// is UNAVAILABLE: a node it needed did not answer in time).
func statusCtx(ctx context.Context, err error) error {
	if ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return status.FromContextError(ctx.Err()).Err()
	}
	return Status(err)
}

// BenchCollective implements decodev1.DecodeServer: the collective
// benchmark on nodes of the cluster (Coordinator.BenchCollective).
func (s *Server) BenchCollective(ctx context.Context, req *decodev1.BenchCollectiveRequest) (*decodev1.BenchCollectiveReply, error) {
	reps, err := s.c.BenchCollective(ctx, int(min(req.GetNodes(), math.MaxInt32)), req.GetSpec())
	if err != nil {
		return nil, statusCtx(ctx, err)
	}
	out := &decodev1.BenchCollectiveReply{}
	for _, r := range reps {
		out.Ranks = append(out.Ranks, &decodev1.BenchRankReport{Rank: uint32(r.Rank), Node: r.Name, Addr: r.Addr, Report: r.Report, Tls: r.TLS})
	}
	return out, nil
}
