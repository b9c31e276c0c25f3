package node_test

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

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// syncBuffer is a bytes.Buffer safe for the node's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestClientAPIErrorsNameNoAddress: a member of the gossip layer whose
// advertised gRPC address refuses connections (a port listened on and
// closed) is placed on by a CP 2 create through n0; the create fails
// UNAVAILABLE, naming the member but neither its address nor its port,
// with a request id that the node's log carries beside the address.
func TestClientAPIErrorsNameNoAddress(t *testing.T) {
	var logs syncBuffer
	ec := geometry(2, 1, plan.Exact)
	nodes := nodetest.Start(t, "n", 1, ec, func(i int, c *node.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	_, port, _ := net.SplitHostPort(dead)
	lis.Close()

	mc := nodetest.Member("ghost")
	mc.Join = []string{nodes[0].GossipAddr()}
	mc.Meta = cluster.NodeMeta{GRPCAddr: dead, Version: "ghost", Backend: "cpu", Devices: 1, FreePages: 1 << 20, TotalPages: 1 << 20,
		Transport: cluster.TransportPlaintext}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	m, err := cluster.NewMembership(ctx, mc)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown() })
	nodetest.WaitUp(t, nodes, 2)

	c := dial(t, nodes[0])
	ctx, cancel = context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, _, err = c.Create(ctx, plan.Striped)
	if err == nil {
		t.Fatal("a create placed on a member that refuses connections succeeded")
	}
	st := status.Convert(err)
	msg := st.Message()
	if st.Code() != codes.Unavailable {
		t.Errorf("code %v (%q), want Unavailable", st.Code(), msg)
	}
	if strings.Contains(msg, dead) || strings.Contains(msg, ":"+port) || strings.Contains(msg, "127.0.0.1") {
		t.Errorf("the client's message %q discloses the address %s", msg, dead)
	}
	i := strings.Index(msg, "(request ")
	if i < 0 || !strings.Contains(msg, "ghost") {
		t.Fatalf("message %q: want the member named and a request id", msg)
	}
	id := strings.Fields(msg[i+len("(request "):])[0]
	id = strings.TrimSuffix(id, ";")
	found := false
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "request="+id) && strings.Contains(line, port) {
			found = true
		}
	}
	if !found {
		t.Errorf("no log line with request %s and the address %s:\n%s", id, dead, logs.String())
	}
}
