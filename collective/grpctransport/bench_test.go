package grpctransport

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/questrt/questrt/api/collective/v1"
)

const pingBytes = 1024

// reportLatency adds the p50 and p99 of one round trip, in microseconds.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(q(0.50), "p50-us")
	b.ReportMetric(q(0.99), "p99-us")
}

// BenchmarkRoundTrip is a 1 KB ping-pong between two members over
// loopback: rank 0 sends, rank 1 receives and sends it back, rank 0
// receives. One op is one round trip.
func BenchmarkRoundTrip(b *testing.B) {
	trs := newGroup(b, 2, nil)
	ctx := context.Background()
	stop := make(chan struct{})
	echoed := make(chan error, 1)
	go func() {
		for {
			msg, err := trs[1].Recv(ctx, 0, 1)
			if err != nil {
				select {
				case <-stop:
					err = nil
				default:
				}
				echoed <- err
				return
			}
			if err := trs[1].Send(ctx, 0, 1, msg); err != nil {
				echoed <- err
				return
			}
		}
	}()
	msg := make([]byte, pingBytes)
	lat := make([]time.Duration, 0, 1<<16)
	b.SetBytes(2 * pingBytes)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if err := trs[0].Send(ctx, 1, 1, msg); err != nil {
			b.Fatal(err)
		}
		got, err := trs[0].Recv(ctx, 1, 1)
		if err != nil || len(got) != pingBytes {
			b.Fatalf("recv: %d bytes, %v", len(got), err)
		}
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(start))
		}
	}
	b.StopTimer()
	reportLatency(b, lat)
	close(stop)
	trs[1].Close()
	if err := <-echoed; err != nil {
		b.Fatal(err)
	}
}

// echoServer answers every Frame on a stream with itself.
type echoServer struct {
	pb.UnimplementedCollectiveServer
}

func (echoServer) Stream(s grpc.BidiStreamingServer[pb.Frame, pb.Frame]) error {
	for {
		f, err := s.Recv()
		if err != nil {
			return nil
		}
		if err := s.Send(f); err != nil {
			return err
		}
	}
}

// BenchmarkRoundTripRawGRPC is the same ping-pong over a bare gRPC stream
// of the same service (an echo handler, no mailboxes, no sender goroutine):
// the floor BenchmarkRoundTrip is compared with.
func BenchmarkRoundTripRawGRPC(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterCollectiveServer(srv, echoServer{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	defer func() {
		srv.Stop()
		<-served
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := pb.NewCollectiveClient(conn).Stream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, pingBytes)
	lat := make([]time.Duration, 0, 1<<16)
	b.SetBytes(2 * pingBytes)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		f := &pb.Frame{Kind: &pb.Frame_Message{Message: &pb.Message{Tag: 1, Payload: msg}}}
		if err := stream.Send(f); err != nil {
			b.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			b.Fatal(err)
		}
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(start))
		}
	}
	b.StopTimer()
	reportLatency(b, lat)
	stream.CloseSend()
}
