package remote

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
)

// lockedBuffer is a bytes.Buffer safe for a logger and a test reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestConnectGridErrorDisclosesNoPeer: a ConnectGrid whose peer cannot
// be reached, sent over gRPC as a remote caller does, fails with a
// status whose message names neither the peer's address nor its port
// (the membership view: what the node dialled), only the grid and a
// request id; the node's log has the address under that request id.
func TestConnectGridErrorDisclosesNoPeer(t *testing.T) {
	var logs lockedBuffer
	cfg := DefaultServerConfig()
	cfg.ConnectTimeout = time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	nodes := startNodes(t, 1, cfg)
	// A peer's address that refuses connections: a port listened on and
	// closed.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peer := lis.Addr().String()
	_, peerPort, _ := net.SplitHostPort(peer)
	lis.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gc, err := encodeConfig(workerConfig(engineConfig(2, 1, plan.Exact)))
	if err != nil {
		t.Fatal(err)
	}
	api := workerv1.NewWorkerClient(nodes[0].conn)
	ref := &workerv1.GridRef{Grid: "coord/1/7", View: 1}
	rep, err := api.OpenGrid(ctx, &workerv1.OpenGridRequest{Ref: ref, Config: gc, Ranks: []*workerv1.Rank{{Cp: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	// Rank 1 dials rank 0 at peer.
	_, err = api.ConnectGrid(ctx, &workerv1.ConnectGridRequest{Ref: ref, Peers: []string{peer, rep.GetAddrs()[0]}})
	if err == nil {
		t.Fatal("ConnectGrid to an unreachable peer succeeded")
	}
	st := status.Convert(err)
	msg := st.Message()
	if st.Code() == codes.OK || st.Code() == codes.Unknown {
		t.Errorf("code %v", st.Code())
	}
	for _, secret := range []string{peer, ":" + peerPort, rep.GetAddrs()[0]} {
		if strings.Contains(msg, secret) {
			t.Errorf("status message %q discloses %q", msg, secret)
		}
	}
	_, id, ok := strings.Cut(msg, "request ")
	id, _, _ = strings.Cut(id, ";")
	if !ok || id == "" || !strings.Contains(msg, ref.Grid) {
		t.Fatalf("status message %q: want the grid and a request id", msg)
	}
	// The log has the address under that request id.
	found := false
	for _, line := range strings.Split(logs.String(), "\n") {
		found = found || (strings.Contains(line, "request="+id) && strings.Contains(line, peerPort))
	}
	if !found {
		t.Errorf("no log line with request=%s and the peer's port %s:\n%s", id, peerPort, logs.String())
	}
}
