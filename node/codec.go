package node

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/questrt/questrt/api/wire"
)

// countingCodec is the node server's codec: gRPC's proto codec, except
// that a request whose repeated fields hold more than limit elements
// (wire.CheckCounts, remote.MaxRequestElements) is not decoded: before
// proto.Unmarshal allocates for its entries, the codec keeps the refusal
// under the message it was to decode into and leaves that message empty.
// The handler wrappers of boundedRegistrar, through which every service
// of the server registers, take the refusal back right after the receive
// and answer RESOURCE_EXHAUSTED with its message. (A codec error would
// not do: gRPC's server stream answers it INTERNAL itself, with the
// error's text only, before the handler sees it.)
type countingCodec struct {
	base  encoding.CodecV2
	limit int
	// refused maps the message a refused request was to be decoded into
	// to the refusal; entries live from the codec's Unmarshal to the
	// wrapper's look-up on the same call.
	refused sync.Map
}

func newCountingCodec(limit int) *countingCodec {
	return &countingCodec{base: encoding.GetCodecV2(protoenc.Name), limit: limit}
}

func (c *countingCodec) Name() string { return protoenc.Name }

func (c *countingCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c *countingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	refused, err := unmarshalBounded(c.base, data, v, c.limit)
	if refused != nil {
		c.refused.Store(v, fmt.Errorf("request refused before decoding: %w", refused))
		return nil
	}
	return err
}

// unmarshalBounded decodes data into v with base, unless v is a proto
// message whose repeated fields in data hold more than limit elements
// (wire.CheckCounts, counted before anything is decoded): then v is left
// alone and refused is the reason. err is the decoding's error.
func unmarshalBounded(base encoding.CodecV2, data mem.BufferSlice, v any, limit int) (refused, err error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if err := wire.CheckCounts(b, m.ProtoReflect().Descriptor(), limit); err != nil {
		return err, nil
	}
	return nil, proto.Unmarshal(b, m)
}

// refusal returns the error of receiving m: err, or the refusal the
// codec kept for m (forgotten then) as RESOURCE_EXHAUSTED.
func (c *countingCodec) refusal(m any, err error) error {
	if err != nil {
		return err
	}
	if r, ok := c.refused.LoadAndDelete(m); ok {
		return status.Error(codes.ResourceExhausted, r.(error).Error())
	}
	return nil
}

// boundedRegistrar registers services with every receive of a request
// going through codec's refusal, so that a request the codec refused
// answers RESOURCE_EXHAUSTED and never reaches the method. Every service
// of the node's server must register through it: a service registered
// directly would get a refused request as an empty message.
type boundedRegistrar struct {
	srv   *grpc.Server
	codec *countingCodec
}

func (r boundedRegistrar) RegisterService(sd *grpc.ServiceDesc, impl any) {
	d := *sd
	d.Methods = make([]grpc.MethodDesc, len(sd.Methods))
	for i, md := range sd.Methods {
		h := md.Handler
		md.Handler = func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(m any) error { return r.codec.refusal(m, dec(m)) }, icpt)
		}
		d.Methods[i] = md
	}
	d.Streams = make([]grpc.StreamDesc, len(sd.Streams))
	for i, st := range sd.Streams {
		h := st.Handler
		st.Handler = func(srv any, ss grpc.ServerStream) error {
			return h(srv, &boundedStream{ServerStream: ss, codec: r.codec})
		}
		d.Streams[i] = st
	}
	r.srv.RegisterService(&d, impl)
}

// boundedStream is a server stream whose RecvMsg answers the codec's
// refusals as RESOURCE_EXHAUSTED.
type boundedStream struct {
	grpc.ServerStream
	codec *countingCodec
}

func (s *boundedStream) RecvMsg(m any) error { return s.codec.refusal(m, s.ServerStream.RecvMsg(m)) }

// replyCodec is the codec of the node's outgoing connections (the worker
// API of other nodes, the Calls streams, the collective streams): gRPC's
// proto codec, except that a reply whose repeated fields hold more than
// limit elements (wire.CheckCounts) is not decoded. gRPC answers the
// error as INTERNAL "failed to unmarshal the received message", with
// the refusal's text.
type replyCodec struct {
	base  encoding.CodecV2
	limit int
}

func (c replyCodec) Name() string { return protoenc.Name }

func (c replyCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c replyCodec) Unmarshal(data mem.BufferSlice, v any) error {
	refused, err := unmarshalBounded(c.base, data, v, c.limit)
	if refused != nil {
		return fmt.Errorf("reply refused before decoding: %w", refused)
	}
	return err
}

// replyDial is the dial option that bounds the repeated elements of
// every reply the node receives to limit (replyCodec).
func replyDial(limit int) grpc.DialOption {
	return grpc.WithDefaultCallOptions(grpc.ForceCodecV2(replyCodec{base: encoding.GetCodecV2(protoenc.Name), limit: limit}))
}
