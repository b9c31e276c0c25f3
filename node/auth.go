package node

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	collectivev1 "github.com/questrt/questrt/api/collective/v1"
	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/internal/identity"
)

// The full method names of each service start with these.
var (
	decodePrefix     = "/" + decodev1.Decode_ServiceDesc.ServiceName + "/"
	workerPrefix     = "/" + workerv1.Worker_ServiceDesc.ServiceName + "/"
	collectivePrefix = "/" + collectivev1.Collective_ServiceDesc.ServiceName + "/"
)

// access is who may call a method.
type access uint8

const (
	// anyone: the health service (and any other service but the three
	// below).
	anyone access = iota
	// nodesOnly: the worker API and the collective streams.
	nodesOnly
	// clientsAndNodes: the client API (nodes forward to each other).
	clientsAndNodes
)

// methodAccess is who may call the method of full name method.
func methodAccess(method string) access {
	switch {
	case strings.HasPrefix(method, workerPrefix), strings.HasPrefix(method, collectivePrefix):
		return nodesOnly
	case strings.HasPrefix(method, decodePrefix):
		return clientsAndNodes
	}
	return anyone
}

// maxWarned bounds the legacy certificates guard remembers having
// warned about.
const maxWarned = 4096

// guard authorizes every call of the node's gRPC servers (the client and
// worker APIs' and the hosted ranks' collective transports'):
//
//   - Under TLS, by the role of the caller's certificate
//     (internal/identity): the worker API and the collective streams
//     need a node certificate (URI SAN questrt://node/NAME), the client
//     API a client or a node certificate. A certificate without any
//     questrt:// URI SAN (issued before roles, or by hand) counts as a
//     node's, with a warning logged once per certificate, unless
//     requireRoles, which refuses it. Refusals are PERMISSION_DENIED.
//   - With a token (Config.Token), every call of the client API, the
//     worker API and the collective streams must carry
//     "authorization: Bearer <token>" (nodes send it on their own calls:
//     tokenDial), else UNAUTHENTICATED. Without TLS this is the only
//     check.
//
// The health service is never checked. Calls a node makes to its own
// worker in process (remote.Server.LocalConn) do not pass here.
type guard struct {
	want         []byte // "Bearer <token>"; nil: no token
	requireRoles bool
	log          *slog.Logger

	mu     sync.Mutex
	warned map[[sha256.Size]byte]bool
}

func newGuard(token string, requireRoles bool, log *slog.Logger) *guard {
	g := &guard{requireRoles: requireRoles, log: log, warned: map[[sha256.Size]byte]bool{}}
	if token != "" {
		g.want = []byte("Bearer " + token)
	}
	return g
}

// check returns nil when the caller of method (ctx a server call's) may
// call it, else a PERMISSION_DENIED or UNAUTHENTICATED status.
func (g *guard) check(ctx context.Context, method string) error {
	acc := methodAccess(method)
	if acc == anyone {
		return nil
	}
	if err := g.checkRole(ctx, method, acc); err != nil {
		return err
	}
	return g.checkToken(ctx)
}

// checkRole checks the role of the caller's certificate, when the call
// came over TLS.
func (g *guard) checkRole(ctx context.Context, method string, acc access) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil // plaintext (--insecure): no identity to check
	}
	needs := "a node certificate (URI SAN questrt://node/NAME): it is for cluster nodes only"
	if acc == clientsAndNodes {
		needs = "a client or node certificate (URI SAN questrt://client/NAME or questrt://node/NAME)"
	}
	deny := func(why string) error {
		return status.Errorf(codes.PermissionDenied, "%s needs %s; %s", method, needs, why)
	}
	if len(ti.State.PeerCertificates) == 0 {
		return deny("the caller presented no certificate")
	}
	cert := ti.State.PeerCertificates[0]
	id, err := identity.Of(cert)
	if err != nil {
		return deny("the caller's certificate has a malformed questrt:// URI SAN")
	}
	switch id.Role {
	case identity.None:
		if g.requireRoles {
			return deny("the caller's certificate carries no role and this node requires one (--require-cert-roles)")
		}
		g.warnLegacy(cert, p)
		return nil
	case identity.Client:
		if acc == nodesOnly {
			return deny("the caller presented a client certificate")
		}
	}
	return nil
}

// warnLegacy logs, once per certificate, that a certificate without a
// role was let in as a node's.
func (g *guard) warnLegacy(cert *x509.Certificate, p *peer.Peer) {
	sum := sha256.Sum256(cert.Raw)
	g.mu.Lock()
	seen := g.warned[sum]
	if !seen && len(g.warned) < maxWarned {
		g.warned[sum] = true
	}
	g.mu.Unlock()
	if seen {
		return
	}
	addr := ""
	if p.Addr != nil {
		addr = p.Addr.String()
	}
	g.log.Warn("a peer's certificate carries no questrt:// role: treated as a node's, with access to the worker API; issue node certificates with questrt://node/NAME and client certificates with questrt://client/NAME (questctl up does), then run with --require-cert-roles",
		"subject", cert.Subject.CommonName, "serial", fmt.Sprintf("%x", cert.SerialNumber), "peer", addr)
}

// checkToken checks the bearer token, when there is one. The comparison
// takes the same time whatever the value given.
func (g *guard) checkToken(ctx context.Context) error {
	if g.want == nil {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return status.Error(codes.Unauthenticated, "missing authorization: want the metadata \"authorization: Bearer <token>\"")
	}
	ok := 0
	for _, v := range vals {
		ok |= subtle.ConstantTimeCompare([]byte(v), g.want)
	}
	if ok != 1 {
		return status.Error(codes.Unauthenticated, "bad bearer token")
	}
	return nil
}

func (g *guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g *guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// serverOptions are the interceptors of every server the node runs.
func (g *guard) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.unary), grpc.ChainStreamInterceptor(g.stream)}
}

// tokenDial returns the dial options that add the node's token to its
// own calls of the worker API and the collective streams (forwarded
// client API calls carry their caller's: coord's passAuth); none when
// token is "".
func tokenDial(token string) []grpc.DialOption {
	if token == "" {
		return nil
	}
	add := func(ctx context.Context, method string) context.Context {
		if methodAccess(method) != nodesOnly {
			return ctx
		}
		if out, _ := metadata.FromOutgoingContext(ctx); len(out.Get("authorization")) > 0 {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(add(ctx, method), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(add(ctx, method), desc, cc, method, opts...)
		}),
	}
}
