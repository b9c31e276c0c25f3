package remote

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/internal/identity"
)

// A node only for its own grids (Kubernetes' node authorizer): a grid's
// id starts with the name of the coordinator that opens it
// ("node/instance/number", gridOwner), and only the coordinator calls
// the worker API on it (the ranks' peers talk over the collective
// streams, not here). So a caller whose TLS certificate names a node
// (questrt://node/NAME, internal/identity) may open, connect, use and
// close only grids whose owner is NAME: another node can neither read a
// grid's keys, close it or step it, nor open a grid in another
// coordinator's name (which would recover that coordinator's persisted
// sequences, ServerConfig.DataDir). The same holds for the collective
// benchmark's ranks (OpenBench, RunBench, CloseBench), whose ids start
// with their coordinator's name (BenchID, benchOwner): another node or a
// client cannot make a node listen for, or run, a benchmark's streams.
//
// Calls without a node name are not checked here: in process
// (LocalConn: the node's own coordinator), over plaintext (no identity
// at all), or with a certificate carrying no role (accepted by the
// node's interceptors only without --require-cert-roles, with a
// warning). A client certificate never reaches this server over a
// node's gRPC server (its interceptors refuse it); here it is refused
// too.

// inProcessKey marks the context of a LocalConn call.
type inProcessKey struct{}

// inProcess returns ctx marked as an in-process call's.
func inProcess(ctx context.Context) context.Context {
	return context.WithValue(ctx, inProcessKey{}, true)
}

// authorize returns nil when the caller of ctx may call the worker
// method on the grid of id, else PERMISSION_DENIED naming the method
// only (neither the grid's owner nor whether the grid exists).
func authorize(ctx context.Context, id string) error {
	return authorizeOwner(ctx, gridOwner(id), "grids its own coordinator opened")
}

// authorizeBench is authorize for the collective benchmark's methods
// (OpenBench, RunBench, CloseBench) on the bench of id: a bench's id
// starts with the name of the coordinator that runs it (BenchID), and
// only that node may open, run or close its ranks. A client certificate
// never may: a client asks a coordinator (the client API's
// BenchCollective, as questctl bench collective --addr does), which
// calls the nodes with its own node certificate.
func authorizeBench(ctx context.Context, id string) error {
	return authorizeOwner(ctx, benchOwner(id), "benches its own coordinator runs")
}

// authorizeOwner returns nil when the caller of ctx is in process, has
// no identity (plaintext), has a certificate without a role, or has a
// node certificate naming owner; else PERMISSION_DENIED naming the
// method and what a node may call it on (whose).
func authorizeOwner(ctx context.Context, owner, whose string) error {
	if v, _ := ctx.Value(inProcessKey{}).(bool); v {
		return nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil // plaintext: no identity
	}
	deny := func() error {
		m, _ := grpc.Method(ctx)
		return status.Errorf(codes.PermissionDenied, "%s: a node may call it only on the %s", m, whose)
	}
	who, err := identity.Of(ti.State.PeerCertificates[0])
	switch {
	case err != nil:
		return deny()
	case who.Role == identity.None:
		return nil // no role: no name to check
	case who.Role != identity.Node || owner != who.Name:
		return deny()
	}
	return nil
}

// benchOwner is the name of the coordinator that runs the bench of id
// (BenchID: "NAME/RANDOM"): id up to its last '/', or id itself.
func benchOwner(id string) string {
	if i := strings.LastIndexByte(id, '/'); i > 0 {
		return id[:i]
	}
	return id
}
