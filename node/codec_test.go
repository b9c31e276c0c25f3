package node_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// rawCodec sends and receives messages as the bytes they are, so that a
// test can send encodings no proto.Marshal makes.
type rawCodec struct{}

type raw struct{ b []byte }

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*raw).b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*raw).b = data.Materialize()
	return nil
}

// emptyEntries is the encoding of a message whose repeated message field
// num holds entries empty entries (2 bytes each: tag, length 0), after
// prefix.
func emptyEntries(prefix []byte, num protowire.Number, entries int) []byte {
	b := append(make([]byte, 0, len(prefix)+2*entries), prefix...)
	for range entries {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendBytes(b, nil)
	}
	return b
}

// allocated is the bytes the whole process allocated while f ran
// (runtime.MemStats.TotalAlloc).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRequestCountsRefused sends a node requests of 64 MiB made of empty
// repeated entries (2 bytes each on the wire: 33 million entries), as a
// unary call of the worker API (BeginStep), of the client API (Step) and
// embedded in a Call of the worker's Calls stream: each is refused with
// RESOURCE_EXHAUSTED naming the node's limit
// (remote.MaxRequestElements), and the process allocates less than
// 4 x the message's bytes for the whole call, client included (gRPC
// receives the message in pooled buffers and copies it once to walk it).
// Decoding the entries, as gRPC's own codec does, allocates about 50 x
// the message's bytes. A request under the limit still works.
func TestRequestCountsRefused(t *testing.T) {
	nd := startCluster(t, 1, geometry(1, 1, plan.Exact))[0]
	limit := remote.MaxRequestElements(8 * geometry(1, 1, plan.Exact).CapacityPages)
	conn, err := grpc.NewClient(nd.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallSendMsgSize(128<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const size = 64 << 20
	const bound = 4 * size
	ref, err := proto.Marshal(&workerv1.BeginRequest{Ref: &workerv1.GridRef{Grid: "none", View: 1}, Step: 1})
	if err != nil {
		t.Fatal(err)
	}
	begin := emptyEntries(ref, 4, (size-len(ref))/2)           // BeginRequest.seqs
	step := emptyEntries([]byte{0x0a, 0x01, 'x'}, 2, size/2-2) // StepRequest.items, after id "x"
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	wantRefused := func(what string, st *status.Status) {
		t.Helper()
		if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), fmt.Sprintf("more than %d elements", limit)) {
			t.Errorf("%s: %v %q, want RESOURCE_EXHAUSTED naming the limit %d", what, st.Code(), st.Message(), limit)
		}
	}
	for _, tc := range []struct {
		name, method string
		req          []byte
	}{
		{"worker BeginStep", workerv1.Worker_BeginStep_FullMethodName, begin},
		{"client Step", decodev1.Decode_Step_FullMethodName, step},
	} {
		var err error
		a := allocated(func() { err = conn.Invoke(ctx, tc.method, &raw{tc.req}, &raw{}) })
		wantRefused(tc.name, status.Convert(err))
		t.Logf("%s: a %d MiB message of %d empty entries: %d MiB allocated (bound %d MiB)", tc.name, len(tc.req)>>20, len(tc.req)/2, a>>20, bound>>20)
		if a > bound {
			t.Errorf("%s: %d MiB allocated for a refused %d MiB message, want at most %d MiB", tc.name, a>>20, len(tc.req)>>20, bound>>20)
		}
	}

	// The Calls stream: the Call itself passes (one bytes field), its
	// embedded request is counted before it is decoded.
	call, err := proto.Marshal(&workerv1.Call{Method: workerv1.Worker_BeginStep_FullMethodName, Request: begin, Last: true})
	if err != nil {
		t.Fatal(err)
	}
	var answer workerv1.Answer
	a := allocated(func() {
		cs, err := conn.NewStream(ctx, &workerv1.Worker_ServiceDesc.Streams[0], workerv1.Worker_Calls_FullMethodName)
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.SendMsg(&raw{call}); err != nil {
			t.Fatal(err)
		}
		var r raw
		if err := cs.RecvMsg(&r); err != nil {
			t.Fatal(err)
		}
		if err := proto.Unmarshal(r.b, &answer); err != nil {
			t.Fatal(err)
		}
	})
	var sp spb.Status
	if err := proto.Unmarshal(answer.GetStatus(), &sp); err != nil {
		t.Fatal(err)
	}
	wantRefused("Calls", status.FromProto(&sp))
	t.Logf("Calls: a %d MiB request: %d MiB allocated (bound %d MiB)", len(begin)>>20, a>>20, bound>>20)
	if a > bound {
		t.Errorf("Calls: %d MiB allocated for a refused %d MiB request, want at most %d MiB", a>>20, len(begin)>>20, bound>>20)
	}

	// Under the limit a request decodes and is answered by its method.
	small := emptyEntries(ref, 4, limit)
	err = conn.Invoke(ctx, workerv1.Worker_BeginStep_FullMethodName, &raw{small}, &raw{})
	if c := status.Code(err); c == codes.ResourceExhausted || c == codes.Internal {
		t.Errorf("BeginStep of %d entries (the limit): %v, want the method's own answer", limit, err)
	}
	if _, err := decodev1.NewDecodeClient(dialPlain(t, nd)).Status(ctx, &decodev1.StatusRequest{}); err != nil {
		t.Errorf("status after the refusals: %v", err)
	}
}

func dialPlain(t *testing.T, nd interface{ Addr() string }) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(nd.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
