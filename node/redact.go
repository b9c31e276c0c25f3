package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/internal/redact"
)

// redactor keeps the addresses of a cluster's nodes out of the answers of
// the client API (questrt.decode.v1.Decode), which clients with a client
// certificate reach: an error whose message names a network address is
// logged whole under a new request id, and the caller gets the same code
// and message with each address replaced (internal/redact) and the id
// appended.
// Node names stay (Status lists them anyway). The worker API's errors are
// redacted where they are made (worker/remote); the health service has no
// errors to redact.
type redactor struct{ log *slog.Logger }

// redact is err as the client API answers it.
func (r redactor) redact(method string, err error) error {
	if err == nil || !strings.HasPrefix(method, decodePrefix) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg, changed := redact.Addresses(st.Message())
	if !changed {
		return err
	}
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	id := hex.EncodeToString(b[:])
	r.log.Warn("client API error (answered without its addresses)", "method", method, "request", id, "code", st.Code().String(), "err", st.Message())
	return status.Error(st.Code(), msg+" (request "+id+"; the node's log has the addresses)")
}

func (r redactor) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	return resp, r.redact(info.FullMethod, err)
}

func (r redactor) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return r.redact(info.FullMethod, handler(srv, ss))
}

// serverOptions are the redactor's interceptors.
func (r redactor) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(r.unary), grpc.ChainStreamInterceptor(r.stream)}
}
