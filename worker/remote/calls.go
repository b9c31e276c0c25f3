package remote

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// Calls implements workerv1.WorkerServer: every Call on the stream runs
// its unary method as the gRPC server would run it alone (the stream's
// metadata, a context that ends with the stream or the call's timeout,
// the method's trailer kept), one at a time and in order, and is
// answered before the next is taken. It ends the stream (OK) after
// answering a call marked last, or when the client closes its side, and
// with UNAVAILABLE once the server drains (Drain), at the first wait for
// a call outside a decode step (none begun, or the last one's EndStep
// answered).
func (s *Server) Calls(stream grpc.BidiStreamingServer[workerv1.Call, workerv1.Answer]) error {
	ctx := stream.Context()
	type received struct {
		c   *workerv1.Call
		err error
	}
	// The calls are read on a goroutine of the stream's, so that a
	// drain ends a stream that waits between steps; it ends with the
	// stream (this handler's return cancels its Recv).
	in := make(chan received)
	go func() {
		for {
			c, err := stream.Recv()
			select {
			case in <- received{c, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	inStep := false
	for {
		drain := s.draining
		if inStep {
			drain = nil // a step runs to its EndStep
		}
		var r received
		select {
		case r = <-in:
		case <-drain:
			return status.Error(codes.Unavailable, "calls: the node is draining")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		if errors.Is(r.err, io.EOF) {
			return nil
		}
		if r.err != nil {
			return r.err
		}
		a := s.call(ctx, r.c)
		switch r.c.GetMethod() {
		case workerv1.Worker_BeginStep_FullMethodName:
			inStep = a.GetStatus() == nil
		case workerv1.Worker_EndStep_FullMethodName:
			inStep = false
		}
		if err := stream.Send(a); err != nil {
			return err
		}
		if r.c.GetLast() {
			return nil
		}
	}
}

// call runs one Call of a Calls stream.
func (s *Server) call(ctx context.Context, c *workerv1.Call) *workerv1.Answer {
	h, ok := workerMethods[c.GetMethod()]
	if !ok {
		return statusAnswer(status.New(codes.Unimplemented, "calls: unknown method "+c.GetMethod()), nil)
	}
	if d := c.GetTimeoutNs(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(d))
		defer cancel()
	}
	st := &localStream{method: c.GetMethod()}
	ctx = grpc.NewContextWithServerTransportStream(ctx, st)
	dec := func(m any) error {
		pm, ok := m.(proto.Message)
		if !ok {
			return status.Errorf(codes.Internal, "calls: request %T is no protobuf message", m)
		}
		// The embedded request is counted before it is decoded, as the
		// node's codec counts a request of its own (node).
		if err := checkCounts(c.GetRequest(), pm, MaxRequestElements(s.cfg.MaxPages)); err != nil {
			return err
		}
		if err := proto.Unmarshal(c.GetRequest(), pm); err != nil {
			// What a gRPC server answers for a request it cannot parse.
			return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		return nil
	}
	rep, err := h(s, ctx, dec, nil)
	if err != nil {
		return statusAnswer(methodStatus(err), st.trailer)
	}
	b, err := proto.Marshal(rep.(proto.Message))
	if err != nil {
		return statusAnswer(status.Newf(codes.Internal, "grpc: error while marshaling: %v", err), st.trailer)
	}
	return &workerv1.Answer{Reply: b, Trailer: trailerEntries(st.trailer)}
}

// methodStatus is the status a gRPC server answers for a method's error:
// the error's own status, or UNKNOWN (the context's code for a context
// error).
func methodStatus(err error) *status.Status {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	return st
}

// statusAnswer answers a call with st and trailer.
func statusAnswer(st *status.Status, trailer metadata.MD) *workerv1.Answer {
	b, err := proto.Marshal(st.Proto())
	if err != nil {
		b, _ = proto.Marshal(status.New(codes.Internal, "calls: status: "+err.Error()).Proto())
	}
	return &workerv1.Answer{Status: b, Trailer: trailerEntries(trailer)}
}

func trailerEntries(md metadata.MD) []*workerv1.MetadataEntry {
	var out []*workerv1.MetadataEntry
	for k, vs := range md {
		for _, v := range vs {
			out = append(out, &workerv1.MetadataEntry{Key: k, Value: []byte(v)})
		}
	}
	return out
}

// callStream runs a Client's decode-step calls (BeginStep, Layer,
// EndStep) on one Calls stream (see the Worker service) that lives from
// the grid's first step to CloseGrid: the first call opens it and every
// later step reuses it, so a step opens no stream of its own (a stream's
// opening costs its HTTP/2 headers both ways and a goroutine on the node,
// once per token per node otherwise). A call answers what the same unary call
// would: the method's reply, trailer and status, CANCELED or
// DEADLINE_EXCEEDED when the caller's context ends first (the stream is
// then cut, which cancels the call on the node as it cancels a unary
// one), and the stream's status when it breaks (UNAVAILABLE for a lost
// node). A call that finds the kept stream already ended before
// sending anything (the node closed it between steps, as an idle
// connection's GOAWAY does) runs on a fresh one. A node without the
// Calls method (UNIMPLEMENTED) gets unary calls from then on.
type callStream struct {
	cc grpc.ClientConnInterface

	lock  chan struct{} // one call at a time; a call waiting for it gives up with its context
	unary bool          // in process, or the node has no Calls method (under lock)
	local bool          // in process (set once)
	// replyLimit bounds the repeated elements of an answer's reply
	// (MaxReplyElements of the grid; 0: no bound).
	replyLimit int

	mu     sync.Mutex // s, cancel and closed, which CloseGrid's close changes too
	s      grpc.BidiStreamingClient[workerv1.Call, workerv1.Answer]
	cancel context.CancelFunc
	closed bool // the grid was closed: no stream opens again

	// owed are the calls sent ahead (see ahead) whose answers no one
	// has read yet, oldest first; held under lock. The next call reads
	// them before its own answer.
	owed []*owedCall
}

// owedCall is a call sent ahead of the next without waiting for its
// answer.
type owedCall struct {
	ctx  context.Context
	s    grpc.BidiStreamingClient[workerv1.Call, workerv1.Answer]
	stop func() bool // stops ctx from cutting s
	out  proto.Message
	done chan struct{} // closed once err is set (under the stream's lock)
	err  error
}

func newCallStream(cc grpc.ClientConnInterface, replyLimit int) *callStream {
	_, local := cc.(*localConn)
	// In process there is no stream to save: the calls stay direct.
	return &callStream{cc: cc, lock: make(chan struct{}, 1), unary: local, local: local, replyLimit: replyLimit}
}

// invoke runs method (a unary method of the Worker service) with in and
// out as cc.Invoke does.
func (cs *callStream) invoke(ctx context.Context, method string, in, out proto.Message, opts ...grpc.CallOption) error {
	select {
	case cs.lock <- struct{}{}:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-cs.lock }()
	return cs.invokeLocked(ctx, method, in, out, opts...)
}

// ahead sends method (a unary method of the Worker service, answered
// with out) on the kept stream and returns without waiting for the
// answer: the next call on the stream reads it before its own (the node
// answers a stream's calls in order), or wait does. With no stream open
// yet, in process, or when the kept stream ended before the call went
// out, the call runs as invoke runs it (a round trip, once per stream:
// the first call of a stream also learns whether the node has Calls at
// all), and wait returns its error. ctx bounds the call until its answer
// is read: its end cuts the stream, as it does for invoke.
func (cs *callStream) ahead(ctx context.Context, method string, in, out proto.Message) (wait func(context.Context) error) {
	done := func(err error) func(context.Context) error { return func(context.Context) error { return err } }
	select {
	case cs.lock <- struct{}{}:
	case <-ctx.Done():
		return done(status.FromContextError(ctx.Err()).Err())
	}
	defer func() { <-cs.lock }()
	cs.mu.Lock()
	s, cut := cs.s, cs.cancel
	cs.mu.Unlock()
	if cs.unary || s == nil {
		return done(cs.invokeLocked(ctx, method, in, out))
	}
	if err := ctx.Err(); err != nil {
		return done(status.FromContextError(err).Err())
	}
	req, err := proto.Marshal(in)
	if err != nil {
		return done(status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err))
	}
	c := &workerv1.Call{Method: method, Request: req}
	if dl, ok := ctx.Deadline(); ok {
		c.TimeoutNs = max(int64(time.Until(dl)), 1)
	}
	stop := context.AfterFunc(ctx, cut)
	if err := s.Send(c); err != nil {
		stop()
		cs.dropStream(s)
		if errors.Is(err, io.EOF) {
			// The kept stream ended before c went out (the node closed
			// it between steps): nothing ran, a fresh stream takes it.
			return done(cs.invokeLocked(ctx, method, in, out))
		}
		return done(err)
	}
	o := &owedCall{ctx: ctx, s: s, stop: stop, out: out, done: make(chan struct{})}
	cs.owed = append(cs.owed, o)
	return func(wctx context.Context) error { return cs.await(wctx, o) }
}

// await returns o's answer, reading the answers owed before it when no
// later call did, until ctx ends.
func (cs *callStream) await(ctx context.Context, o *owedCall) error {
	select {
	case <-o.done:
		return o.err
	case cs.lock <- struct{}{}:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-cs.lock }()
	for len(cs.owed) > 0 && !isClosed(o.done) {
		cs.readOwed()
	}
	return o.err
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// readOwed reads the oldest owed answer (under lock), from the stream
// its call went out on (a stream dropped since then answers at once
// with its error).
func (cs *callStream) readOwed() {
	o := cs.owed[0]
	cs.owed[0] = nil
	cs.owed = cs.owed[1:]
	a, err := o.s.Recv()
	stopped := o.stop()
	switch {
	case err != nil:
		cs.dropStream(o.s)
		switch {
		case !stopped || o.ctx.Err() != nil:
			err = status.FromContextError(o.ctx.Err()).Err()
		case errors.Is(err, io.EOF):
			err = status.Error(codes.Unavailable, "calls: the node ended the stream without an answer")
		}
	case !stopped:
		// The answer came, but the call's context ended meanwhile and
		// cut the stream: the next call opens another.
		cs.dropStream(o.s)
		err = answerOf(a, o.out, nil, cs.replyLimit)
	default:
		err = answerOf(a, o.out, nil, cs.replyLimit)
	}
	o.err = err
	close(o.done)
}

// invokeLocked is invoke holding the lock.
func (cs *callStream) invokeLocked(ctx context.Context, method string, in, out proto.Message, opts ...grpc.CallOption) error {
	if cs.unary {
		return cs.cc.Invoke(ctx, method, in, out, opts...)
	}
	err := cs.onStream(ctx, method, in, out, opts)
	if errors.Is(err, errNoCalls) {
		cs.unary = true
		return cs.cc.Invoke(ctx, method, in, out, opts...)
	}
	return err
}

// errNoCalls: the node answered the Calls stream UNIMPLEMENTED (an older
// node), before running anything.
var errNoCalls = errors.New("the node has no Calls method")

var callsDesc = &workerv1.Worker_ServiceDesc.Streams[0]

func (cs *callStream) onStream(ctx context.Context, method string, in, out proto.Message, opts []grpc.CallOption) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	req, err := proto.Marshal(in)
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	c := &workerv1.Call{Method: method, Request: req}
	if dl, ok := ctx.Deadline(); ok {
		c.TimeoutNs = max(int64(time.Until(dl)), 1)
	}
	a, err := cs.send(ctx, c, false)
	if err != nil {
		return err
	}
	return answerOf(a, out, opts, cs.replyLimit)
}

// send sends c on the kept stream (opening one when there is none, or
// when retry says the kept one ended before c went out) and returns its
// answer; a call marked last (none of callStream's own) drops the
// stream after it.
func (cs *callStream) send(ctx context.Context, c *workerv1.Call, retry bool) (*workerv1.Answer, error) {
	cs.mu.Lock()
	s, cut := cs.s, cs.cancel
	cs.mu.Unlock()
	fresh := s == nil
	if fresh {
		// The stream outlives each call's context (a step's calls have
		// their own); a call whose context ends cuts it.
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		cst, err := cs.cc.NewStream(sctx, callsDesc, workerv1.Worker_Calls_FullMethodName)
		if err != nil {
			cancel()
			if status.Code(err) == codes.Unimplemented {
				return nil, errNoCalls // refused before anything ran
			}
			return nil, err
		}
		s, cut = &grpc.GenericClientStream[workerv1.Call, workerv1.Answer]{ClientStream: cst}, cancel
		cs.mu.Lock()
		closed := cs.closed
		if !closed {
			cs.s, cs.cancel = s, cut
		}
		cs.mu.Unlock()
		if closed {
			// CloseGrid ran while the stream opened: nothing owns it.
			cancel()
			return nil, status.Error(codes.Unavailable, "calls: the grid was closed")
		}
	}
	stop := context.AfterFunc(ctx, cut)
	err := s.Send(c)
	// The answers of calls sent ahead come first (a stream's calls are
	// answered in order; those of a dropped stream fail at once).
	for len(cs.owed) > 0 {
		cs.readOwed()
	}
	var a *workerv1.Answer
	unsent := false
	if err == nil {
		a, err = s.Recv()
	} else if errors.Is(err, io.EOF) {
		// The stream ended before c went out: Recv has its status.
		unsent = true
		_, err = s.Recv()
	}
	stopped := stop()
	if err != nil {
		cs.drop()
		switch {
		case !stopped || ctx.Err() != nil:
			return nil, status.FromContextError(ctx.Err()).Err()
		case unsent && !fresh && !retry:
			// A stream kept from an earlier step that ended meanwhile:
			// nothing of c ran, so it goes out on a fresh stream.
			return cs.send(ctx, c, true)
		case errors.Is(err, io.EOF):
			return nil, status.Error(codes.Unavailable, "calls: the node ended the stream without an answer")
		case fresh && status.Code(err) == codes.Unimplemented:
			return nil, errNoCalls
		}
		return nil, err
	}
	switch {
	case !stopped:
		// The answer came, but the call's context ended meanwhile and
		// cut the stream: the next call opens another.
		cs.drop()
	case c.GetLast():
		// The node ends the stream after this answer. Its status adds
		// nothing to the answer in hand, and waiting for it could hang
		// on a silent peer (the call's context no longer guards the
		// stream): cut it.
		cs.drop()
	}
	return a, nil
}

// answerOf fills out and opts' header and trailer from a, or returns
// the status a carries. A reply whose repeated fields hold more than
// limit elements (0: no bound) is refused before it is decoded
// (RESOURCE_EXHAUSTED): the Answer itself passed the connection's codec
// as one bytes field.
func answerOf(a *workerv1.Answer, out proto.Message, opts []grpc.CallOption, limit int) error {
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.TrailerCallOption:
			md := metadata.MD{}
			for _, e := range a.GetTrailer() {
				md.Append(e.GetKey(), string(e.GetValue()))
			}
			*o.TrailerAddr = md
		case grpc.HeaderCallOption:
			*o.HeaderAddr = metadata.MD{}
		}
	}
	if b := a.GetStatus(); b != nil {
		var p spb.Status
		if err := proto.Unmarshal(b, &p); err != nil {
			return status.Errorf(codes.Internal, "calls: answer status: %v", err)
		}
		if p.GetCode() == int32(codes.OK) {
			return status.Error(codes.Internal, "calls: an answer with status OK and no reply")
		}
		return status.FromProto(&p).Err()
	}
	if err := checkReplyCounts(a.GetReply(), out, limit); err != nil {
		return err
	}
	if err := proto.Unmarshal(a.GetReply(), out); err != nil {
		return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
	return nil
}

// dropStream drops the kept stream if it is s (a stream dropped before
// is cut already).
func (cs *callStream) dropStream(s grpc.BidiStreamingClient[workerv1.Call, workerv1.Answer]) {
	cs.mu.Lock()
	kept := cs.s == s
	cs.mu.Unlock()
	if kept {
		cs.drop()
	}
}

// drop forgets the stream, cutting it (a no-op once it ended).
func (cs *callStream) drop() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.cancel != nil {
		cs.cancel()
	}
	cs.s, cs.cancel = nil, nil
}

// close drops the stream for good (CloseGrid): a call opening one
// meanwhile cuts it and fails UNAVAILABLE, so that no stream outlives the
// grid.
func (cs *callStream) close() {
	cs.mu.Lock()
	cs.closed = true
	cs.mu.Unlock()
	cs.drop()
}
