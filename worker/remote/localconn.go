package remote

import (
	"context"
	"strings"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// LocalConn returns a connection to this server's Worker API in process,
// for a coordinator on the same node as the server (a node's own ranks):
// a call runs the server's method on the caller's request without gRPC
// (no HTTP/2 framing, no socket, no serialization: the request and the
// reply are copied as messages), and answers what the same call over gRPC
// would (the status of an error, with its details; Layer's trailer; the
// caller's context ending the call at once with CANCELED or
// DEADLINE_EXCEEDED while the method finishes on its own, as a gRPC
// server does). Calls of other services and streams go to fallback (the
// node's gRPC connection to itself), which may be nil when there are
// none. The server's gRPC interceptors (a node's token check) do not run,
// nor does its check of the grid's owner (authz.go), even when ctx is a
// gRPC server call's with a peer of its own: the caller is the process
// itself.
func (s *Server) LocalConn(fallback grpc.ClientConnInterface) grpc.ClientConnInterface {
	return &localConn{s: s, fallback: fallback}
}

// localConn implements grpc.ClientConnInterface over a Server.
type localConn struct {
	s        *Server
	fallback grpc.ClientConnInterface
}

// workerMethods are the Worker service's unary handlers by full method
// name.
var workerMethods = func() map[string]func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	d := workerv1.Worker_ServiceDesc
	m := make(map[string]func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error), len(d.Methods))
	for _, md := range d.Methods {
		m["/"+d.ServiceName+"/"+md.MethodName] = md.Handler
	}
	return m
}()

// Invoke implements grpc.ClientConnInterface.
func (c *localConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	h, ok := workerMethods[method]
	if !ok {
		if c.fallback == nil {
			return status.Errorf(codes.Unimplemented, "local connection: unknown method %s", method)
		}
		return c.fallback.Invoke(ctx, method, args, reply, opts...)
	}
	in, ok1 := args.(proto.Message)
	out, ok2 := reply.(proto.Message)
	if !ok1 || !ok2 {
		return status.Errorf(codes.Internal, "local connection: %s: request %T or reply %T is no protobuf message", method, args, reply)
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	// The server's side of the call: a context of its own that the
	// caller's ends (as a client's cancellation or deadline ends a gRPC
	// server's), the caller's metadata as incoming metadata, and a
	// stream that keeps the method's header and trailer.
	sctx := inProcess(ctx)
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		sctx = metadata.NewIncomingContext(sctx, md)
	}
	st := &localStream{method: method}
	sctx = grpc.NewContextWithServerTransportStream(sctx, st)
	type answer struct {
		rep any
		err error
	}
	// The method gets a copy taken now: the caller may reuse its request
	// once the call returns, and the method may run on past that.
	req := proto.Clone(in)
	done := make(chan answer, 1)
	go func() {
		dec := func(m any) error {
			pm, ok := m.(proto.Message)
			if !ok {
				return status.Errorf(codes.Internal, "local connection: %s: request %T is no protobuf message", method, m)
			}
			proto.Merge(pm, req)
			return nil
		}
		rep, err := h(c.s, sctx, dec, nil)
		done <- answer{rep, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		// As a gRPC client whose context ends before the answer: the
		// method runs on (its context ended too) and its answer is lost.
		return status.FromContextError(ctx.Err()).Err()
	}
	st.deliver(opts)
	if a.err != nil {
		// What a gRPC server sends for a method's error, and its client
		// rebuilds: the status (code, message, details), or UNKNOWN (or
		// the context's code) for an error that is no status.
		s, ok := status.FromError(a.err)
		if !ok {
			s = status.FromContextError(a.err)
		}
		return status.FromProto(proto.Clone(s.Proto()).(*spb.Status)).Err()
	}
	rm, ok := a.rep.(proto.Message)
	if !ok || rm == nil {
		return status.Errorf(codes.Internal, "local connection: %s: reply %T is no protobuf message", method, a.rep)
	}
	proto.Reset(out)
	proto.Merge(out, rm)
	return nil
}

// NewStream implements grpc.ClientConnInterface: streams of other
// services go to the fallback connection; the Worker service's Calls
// stream is refused (UNIMPLEMENTED: a Client calls in process directly).
func (c *localConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if c.fallback == nil || strings.HasPrefix(method, "/"+workerv1.Worker_ServiceDesc.ServiceName+"/") {
		return nil, status.Errorf(codes.Unimplemented, "local connection: no stream %s", method)
	}
	return c.fallback.NewStream(ctx, desc, method, opts...)
}

// localStream is the server side of an in-process call as a method sees
// it (grpc.SetHeader, SendHeader, SetTrailer).
type localStream struct {
	method          string
	header, trailer metadata.MD
}

func (s *localStream) Method() string { return s.method }

func (s *localStream) SetHeader(md metadata.MD) error {
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *localStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

func (s *localStream) SetTrailer(md metadata.MD) error {
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}

// deliver hands the header and trailer to the call options that ask for
// them (grpc.Header, grpc.Trailer).
func (s *localStream) deliver(opts []grpc.CallOption) {
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			*o.HeaderAddr = s.header.Copy()
		case grpc.TrailerCallOption:
			*o.TrailerAddr = s.trailer.Copy()
		}
	}
}
