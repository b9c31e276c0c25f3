package node

import (
	"context"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
)

// decodePrefix starts the full method name of every call of the client
// API, the only service the bearer token guards.
var decodePrefix = "/" + decodev1.Decode_ServiceDesc.ServiceName + "/"

// tokenAuth checks the bearer token of the client API (Config.Token):
// every call of questrt.decode.v1.Decode must carry the metadata
// "authorization: Bearer <token>". The worker API (called by other
// nodes, under mutual TLS) and the health service are not checked.
type tokenAuth struct {
	want []byte // "Bearer <token>"
}

func newTokenAuth(token string) *tokenAuth {
	return &tokenAuth{want: []byte("Bearer " + token)}
}

// check returns nil when method is not of the client API or ctx carries
// the token, else an UNAUTHENTICATED status. The comparison takes the
// same time whatever the value given.
func (a *tokenAuth) check(ctx context.Context, method string) error {
	if !strings.HasPrefix(method, decodePrefix) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return status.Error(codes.Unauthenticated, "missing authorization: want the metadata \"authorization: Bearer <token>\"")
	}
	ok := 0
	for _, v := range vals {
		ok |= subtle.ConstantTimeCompare([]byte(v), a.want)
	}
	if ok != 1 {
		return status.Error(codes.Unauthenticated, "bad bearer token")
	}
	return nil
}

func (a *tokenAuth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *tokenAuth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
