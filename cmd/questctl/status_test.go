package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// fakeDecode is a Decode server whose Status answers reply().
type fakeDecode struct {
	decodev1.UnimplementedDecodeServer
	reply func() *decodev1.StatusReply
}

func (f *fakeDecode) Status(context.Context, *decodev1.StatusRequest) (*decodev1.StatusReply, error) {
	return f.reply(), nil
}

// serveFakeDecode serves a fakeDecode on 127.0.0.1 for the test's
// duration and returns its address.
func serveFakeDecode(t *testing.T, reply func() *decodev1.StatusReply) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	decodev1.RegisterDecodeServer(srv, &fakeDecode{reply: reply})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// syncBuffer is a bytes.Buffer that a running command may write while the
// test reads it.
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

func sampleStatus() *decodev1.StatusReply {
	return &decodev1.StatusReply{
		Node: "node-1", View: 7, Version: "v0.3.0", Sequences: 2, Grids: 1,
		Members: []*decodev1.Member{
			{Name: "node-2", State: "suspect", GrpcAddr: "127.0.0.1:7002", Version: "v0.3.0", FreePages: 10, TotalPages: 64},
			{Name: "node-0", State: "alive", GrpcAddr: "127.0.0.1:7000", Version: "v0.3.0", FreePages: 60, TotalPages: 64},
			{Name: "node-1", State: "alive", GrpcAddr: "127.0.0.1:7001", Version: "v0.3.0", FreePages: 32, TotalPages: 64},
			{Name: "rogue", State: "alive", GrpcAddr: "127.0.0.1:7009", Version: "v0.3.0", FreePages: 64, TotalPages: 64,
				Refused: "it presents a client certificate\n(questrt://client/client), not a node certificate"},
		},
		Devices: []*decodev1.Device{{Kind: "cpu", Name: "host", MemoryBytes: 8 << 30}},
		Config: &workerv1.GridConfig{
			Layers: 4, QHeads: 8, KvHeads: 2, HeadDim: 64, PageSize: 16, Cp: 3, Tp: 1, CapacityPages: 64, Mode: "exact",
			Policy: &workerv1.Policy{PageSize: 16, BudgetTokens: 256, SinkPages: 1, LocalPages: 2, DenseLayers: 1, Gqa: "group_max", Selector: "quest",
				LayerBudget: map[uint32]uint32{3: 128, 2: 512}},
		},
	}
}

// TestStatusPrintsReply: the text form shows every part of the reply, the
// members sorted by name; --json is the reply itself.
func TestStatusPrintsReply(t *testing.T) {
	addr := serveFakeDecode(t, sampleStatus)
	code, out, stderr := runCLI(t, "status", "--addr", addr)
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{
		"node node-1  version v0.3.0  view 7\n",
		"members: 4 (3 alive, 1 suspect)\n",
		"refused: rogue: it presents a client certificate (questrt://client/client), not a node certificate (never placed on)\n",
		"grid: cp 3 x tp 1, layers 4, q-heads 8, kv-heads 2, head-dim 64, page-size 16, capacity 64 pages per rank, selection exact\n",
		"policy: selector quest, gqa group_max, budget 256 tokens, sink 1 pages, local 2 pages, dense layers 1, layer budgets 2:512,3:128\n",
		"devices: 1\n  cpu  host  8.0 GiB\n",
		"sequences 2, grids 1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "refused:"); n != 1 {
		t.Errorf("%d refused lines, want 1 (rogue's):\n%s", n, out)
	}
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 5 && strings.HasPrefix(f[0], "node-") {
			rows = append(rows, strings.Join(f, " "))
		}
	}
	want := []string{
		"node-0 alive 127.0.0.1:7000 60/64 v0.3.0",
		"node-1 alive 127.0.0.1:7001 32/64 v0.3.0",
		"node-2 suspect 127.0.0.1:7002 10/64 v0.3.0",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("member rows %q, want %q:\n%s", rows, want, out)
	}

	code, out, stderr = runCLI(t, "status", "--addr", addr, "--json")
	if code != 0 || stderr != "" || strings.Count(out, "\n") != 1 {
		t.Fatalf("--json: exit %d, stderr %q, stdout %q", code, stderr, out)
	}
	var got decodev1.StatusReply
	if err := protojson.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, sampleStatus()) {
		t.Errorf("--json gives %v, want %v", &got, sampleStatus())
	}
	if !strings.Contains(out, `"grpc_addr"`) {
		t.Errorf("--json does not use the proto field names: %s", out)
	}
}

// TestStatusEmptyReply: a node that knows nothing yet still prints.
func TestStatusEmptyReply(t *testing.T) {
	addr := serveFakeDecode(t, func() *decodev1.StatusReply { return &decodev1.StatusReply{} })
	code, out, stderr := runCLI(t, "status", "--addr", addr)
	if code != 0 || !strings.Contains(out, "members: 0\n") || !strings.Contains(out, "grid: not configured") || !strings.Contains(out, "devices: none") {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, stderr, out)
	}
}

// TestStatusUnreachable: a closed port, and a port that accepts but never
// answers, are one-line errors (exit 1) within --timeout.
func TestStatusUnreachable(t *testing.T) {
	closed := closedAddr(t)

	silent := silentAddr(t)

	for _, c := range []struct {
		addr, timeout, want string
	}{
		{closed, "3s", "cannot reach questd at " + closed + ": dial tcp " + closed + ": connect: connection refused\n"},
		{silent, "300ms", "did not answer within 300ms"},
	} {
		start := time.Now()
		code, stdout, stderr := runCLI(t, "status", "--addr", c.addr, "--timeout", c.timeout)
		took := time.Since(start)
		limit, _ := time.ParseDuration(c.timeout)
		if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "questctl status: ") || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", c.addr, code, stdout, stderr)
		}
		if took > limit+time.Second {
			t.Errorf("%s: took %v with --timeout %s", c.addr, took, c.timeout)
		}
	}
}

func TestStatusUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"status"},
		{"status", "--addr", "localhost"},
		{"status", "--addr", "127.0.0.1:http2x"},
		{"status", "--addr", "127.0.0.1:1", "--timeout", "0s"},
		{"status", "--addr", "127.0.0.1:1", "--ca", "ca.pem"},
		{"status", "--addr", "127.0.0.1:1", "extra"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// TestUpStatusConventions applies TestHelpAndErrorStreams's checks to up
// and status: --help on stdout, an unknown flag one line on stderr.
func TestUpStatusConventions(t *testing.T) {
	for _, cmd := range []string{"up", "status"} {
		code, stdout, stderr := runCLI(t, cmd, "--help")
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: questctl "+cmd) || !strings.Contains(stdout, "Flags:") {
			t.Errorf("%s --help: exit %d, stderr %q, stdout starts %.60q", cmd, code, stderr, stdout)
		}
		code, stdout, stderr = runCLI(t, cmd, "--no-such-flag")
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no-such-flag") {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q", cmd, code, stdout, stderr)
		}
	}
	code, stdout, _ := runCLI(t, "help")
	if code != 0 || !strings.Contains(stdout, "questctl up ") || !strings.Contains(stdout, "questctl status ") {
		t.Errorf("help does not list up and status:\n%s", stdout)
	}
}
