package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	collectivev1 "github.com/questrt/questrt/api/collective/v1"
	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/internal/testcert"
)

// guardedMethod is one method of the guarded services.
type guardedMethod struct {
	name   string // full name
	stream bool
	access access
}

// guardedMethods enumerates every method of the client API, the worker
// API and the collective transport from their generated descriptors, so
// that a method added to a .proto is covered without editing the test.
func guardedMethods(t *testing.T) []guardedMethod {
	var ms []guardedMethod
	for _, d := range []grpc.ServiceDesc{decodev1.Decode_ServiceDesc, workerv1.Worker_ServiceDesc, collectivev1.Collective_ServiceDesc} {
		want := nodesOnly
		if d.ServiceName == decodev1.Decode_ServiceDesc.ServiceName {
			want = clientsAndNodes
		}
		for _, m := range d.Methods {
			ms = append(ms, guardedMethod{"/" + d.ServiceName + "/" + m.MethodName, false, want})
		}
		for _, s := range d.Streams {
			ms = append(ms, guardedMethod{"/" + d.ServiceName + "/" + s.StreamName, true, want})
		}
	}
	for _, m := range ms {
		if got := methodAccess(m.name); got != m.access {
			t.Fatalf("methodAccess(%s) = %d, want %d", m.name, got, m.access)
		}
	}
	if len(ms) < 20 {
		t.Fatalf("only %d methods enumerated", len(ms))
	}
	return ms
}

// serveGuarded serves the three services (their Unimplemented stubs: a
// call the guard lets through answers UNIMPLEMENTED) and health behind a
// guard, with creds; it returns the address.
func serveGuarded(t *testing.T, creds credentials.TransportCredentials, g *guard) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(creds)}, g.serverOptions()...)...)
	decodev1.RegisterDecodeServer(srv, decodev1.UnimplementedDecodeServer{})
	workerv1.RegisterWorkerServer(srv, workerv1.UnimplementedWorkerServer{})
	collectivev1.RegisterCollectiveServer(srv, collectivev1.UnimplementedCollectiveServer{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(lis) })
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return lis.Addr().String()
}

// callMethod calls m with an empty request (fail fast) and returns the
// status code and message.
func callMethod(t *testing.T, cc *grpc.ClientConn, ctx context.Context, m guardedMethod) (codes.Code, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var err error
	if m.stream {
		var st grpc.ClientStream
		st, err = cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, m.name)
		if err == nil {
			st.CloseSend()
			err = st.RecvMsg(&emptypb.Empty{})
		}
	} else {
		err = cc.Invoke(ctx, m.name, &emptypb.Empty{}, &emptypb.Empty{})
	}
	s := status.Convert(err)
	return s.Code(), s.Message()
}

// TestGuardRoles: every method of the client API, the worker API and
// the collective streams, called under mutual TLS with each identity,
// answers the expected code: a node certificate reaches every one, a
// client certificate the client API only (PERMISSION_DENIED naming the
// role needed elsewhere), a certificate of another CA none (the
// handshake fails: UNAVAILABLE), a certificate without a role is a
// node's (one warning per certificate) unless roles are required, and
// one with a malformed role is refused. Health answers everyone who
// completes the handshake. (A caller without a certificate fails the
// handshake as another CA's does: TestTLSCluster.)
func TestGuardRoles(t *testing.T) {
	ca := testcert.NewCA(t, "questrt test CA")
	server := ca.MutualTLS(ca.IssueNode(t, "server"))
	const (
		allowed = codes.Unimplemented // past the guard, into the stub
		denied  = codes.PermissionDenied
	)
	type ident struct {
		name string
		cert tls.Certificate
		// want is the code for nodes-only and for client API methods.
		nodes, clients codes.Code
		health         codes.Code
	}
	idents := []ident{
		{"node", ca.IssueNode(t, "n1"), allowed, allowed, codes.OK},
		{"client", ca.IssueClient(t, "c1"), denied, allowed, codes.OK},
		{"another CA's node", testcert.NewCA(t, "rogue CA").IssueNode(t, "n1"), codes.Unavailable, codes.Unavailable, codes.Unavailable},
		{"legacy (no role)", ca.Issue(t, "old"), allowed, allowed, codes.OK},
	}
	methods := guardedMethods(t)
	for _, require := range []bool{false, true} {
		logs := &syncBuffer{b: &bytes.Buffer{}}
		g := newGuard("", require, slog.New(slog.NewTextHandler(logs, nil)))
		addr := serveGuarded(t, credentials.NewTLS(server), g)
		for _, id := range idents {
			if require && id.name == "legacy (no role)" {
				id.nodes, id.clients = denied, denied
			}
			t.Run(id.name+map[bool]string{false: "", true: " require-cert-roles"}[require], func(t *testing.T) {
				cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
					Certificates: []tls.Certificate{id.cert}, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13})))
				if err != nil {
					t.Fatal(err)
				}
				defer cc.Close()
				for _, m := range methods {
					want := id.nodes
					if m.access == clientsAndNodes {
						want = id.clients
					}
					code, msg := callMethod(t, cc, t.Context(), m)
					if code != want {
						t.Errorf("%s: %v %q, want %v", m.name, code, msg, want)
						continue
					}
					if code == denied {
						role := "node certificate"
						if m.access == clientsAndNodes {
							role = "client or node certificate"
						}
						if !strings.Contains(msg, "needs a "+role) || !strings.HasPrefix(msg, m.name) {
							t.Errorf("%s: message %q does not say it needs a %s", m.name, msg, role)
						}
					}
				}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
				if status.Code(err) != id.health {
					t.Errorf("health: %v, want %v", err, id.health)
				}
			})
		}
		warnings := strings.Count(logs.String(), "carries no questrt:// role")
		if want := map[bool]int{false: 1, true: 0}[require]; warnings != want {
			t.Errorf("require %v: %d warnings about the legacy certificate, want %d:\n%s", require, warnings, want, logs.String())
		}
	}
}

// TestGuardMalformedRole: a certificate whose questrt:// URI SAN does
// not parse is refused on every guarded method, roles required or not.
func TestGuardMalformedRole(t *testing.T) {
	ca := testcert.NewCA(t, "questrt test CA")
	bad := ca.IssueWithURIs(t, "odd", "questrt://admin/odd")
	addr := serveGuarded(t, credentials.NewTLS(ca.MutualTLS(ca.IssueNode(t, "server"))), newGuard("", false, slog.New(slog.DiscardHandler)))
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{bad}, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for _, m := range guardedMethods(t) {
		if code, msg := callMethod(t, cc, t.Context(), m); code != codes.PermissionDenied || !strings.Contains(msg, "malformed") {
			t.Errorf("%s: %v %q, want PERMISSION_DENIED (malformed)", m.name, code, msg)
		}
	}
}

// TestGuardTokenPlaintext: without TLS (--insecure) roles cannot be
// checked, and with a token every guarded method, of the worker API and
// the collective streams too, needs it (UNAUTHENTICATED); health does
// not. Without a token everything passes, as before roles.
func TestGuardTokenPlaintext(t *testing.T) {
	const token = "s3cret"
	methods := guardedMethods(t)
	for _, tc := range []struct {
		name, token string
		md          []string
		want        codes.Code
	}{
		{"no token set", "", nil, codes.Unimplemented},
		{"token, none sent", token, nil, codes.Unauthenticated},
		{"token, wrong sent", token, []string{"authorization", "Bearer nope"}, codes.Unauthenticated},
		{"token, right sent", token, []string{"authorization", "Bearer " + token}, codes.Unimplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveGuarded(t, insecure.NewCredentials(), newGuard(tc.token, true, slog.New(slog.DiscardHandler)))
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx := t.Context()
			if tc.md != nil {
				ctx = metadata.AppendToOutgoingContext(ctx, tc.md...)
			}
			for _, m := range methods {
				if code, msg := callMethod(t, cc, ctx, m); code != tc.want {
					t.Errorf("%s: %v %q, want %v", m.name, code, msg, tc.want)
				}
			}
			hctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if _, err := healthpb.NewHealthClient(cc).Check(hctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("health: %v", err)
			}
		})
	}
}

// TestTokenDial: the node's own calls of the worker API and the
// collective streams carry its token; its other calls (forwarded client
// API calls carry their caller's) do not get it added.
func TestTokenDial(t *testing.T) {
	const token = "s3cret"
	addr := serveGuarded(t, insecure.NewCredentials(), newGuard(token, false, slog.New(slog.DiscardHandler)))
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, tokenDial(token)...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for _, m := range guardedMethods(t) {
		want := codes.Unimplemented
		if m.access == clientsAndNodes {
			want = codes.Unauthenticated
		}
		if code, msg := callMethod(t, cc, t.Context(), m); code != want {
			t.Errorf("%s: %v %q, want %v", m.name, code, msg, want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
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
