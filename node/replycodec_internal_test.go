package node

import (
	"context"
	"fmt"
	"math"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// rawServerCodec answers with the bytes it is given (a fake node that
// sends encodings no honest node makes).
type rawServerCodec struct{}

type rawMsg struct{ b []byte }

func (rawServerCodec) Name() string { return "proto" }
func (rawServerCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*rawMsg).b)}, nil
}
func (rawServerCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*rawMsg).b = data.Materialize()
	return nil
}

// TestReplyCountsRefused: a fake node answers the worker API's Layer
// with a 4 MiB LayerReply of 2 million empty RankOutput entries (2
// bytes each on the wire). Through the node's dial option (replyDial,
// as its pool and collective streams dial) with a limit below that, the
// call fails with a clear error naming the limit, and the process
// allocates less than 4 x the reply's bytes for the call; the same call
// with no bound (limit MaxInt) decodes the entries and allocates more
// than 10 x. A reply at the limit decodes.
func TestReplyCountsRefused(t *testing.T) {
	defer goleak.VerifyNone(t)
	const size = 4 << 20
	var reply []byte
	for range size / 2 {
		reply = protowire.AppendTag(reply, 1, protowire.BytesType) // LayerReply.ranks
		reply = protowire.AppendBytes(reply, nil)
	}
	const limit = 1 << 16
	atLimit := reply[:2*limit]

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var answer atomic.Pointer[[]byte]
	answer.Store(&reply)
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawServerCodec{}), grpc.MaxSendMsgSize(64<<20))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: workerv1.Worker_ServiceDesc.ServiceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Layer", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in rawMsg
			if err := dec(&in); err != nil {
				return nil, err
			}
			return &rawMsg{*answer.Load()}, nil
		}}},
	}, struct{}{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() { srv.Stop(); <-served }()

	var conns []*grpc.ClientConn
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	dial := func(limit int) *grpc.ClientConn {
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes)), replyDial(limit))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, cc)
		return cc
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	call := func(cc *grpc.ClientConn) (*workerv1.LayerReply, error, uint64) {
		var out workerv1.LayerReply
		var err error
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err = cc.Invoke(ctx, workerv1.Worker_Layer_FullMethodName, &workerv1.LayerRequest{}, &out)
		runtime.ReadMemStats(&after)
		return &out, err, after.TotalAlloc - before.TotalAlloc
	}

	bounded, unbounded := dial(limit), dial(math.MaxInt)
	call(bounded) // warm the connection up: its first call allocates for the connection too
	_, err, a := call(bounded)
	st := status.Convert(err)
	if st.Code() != codes.Internal || !strings.Contains(st.Message(), "reply refused before decoding") || !strings.Contains(st.Message(), fmt.Sprintf("more than %d elements", limit)) {
		t.Errorf("oversized reply: %v %q, want an error naming the refusal and the limit %d", st.Code(), st.Message(), limit)
	}
	call(unbounded)
	out, err, u := call(unbounded)
	if err != nil || len(out.GetRanks()) != size/2 {
		t.Fatalf("unbounded: %d entries, %v", len(out.GetRanks()), err)
	}
	t.Logf("a %d MiB reply of %d empty entries: %.1f MiB allocated refused, %.1f MiB decoded without the bound", size>>20, size/2, float64(a)/(1<<20), float64(u)/(1<<20))
	if a > 4*size {
		t.Errorf("refused: %d bytes allocated, want at most 4 x %d", a, size)
	}
	if u < 10*size {
		t.Errorf("decoded: %d bytes allocated, want more than 10 x %d (the bound's reason)", u, size)
	}

	answer.Store(&atLimit)
	if out, err, _ := call(bounded); err != nil || len(out.GetRanks()) != limit {
		t.Errorf("a reply at the limit: %d entries, %v; want %d", len(out.GetRanks()), err, limit)
	}
}
