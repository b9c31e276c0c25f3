package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	collectivev1 "github.com/questrt/questrt/api/collective/v1"
	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
)

// FuzzGuard: the guard's decision for any method name, any URI SANs of
// the caller's certificate, any authorization metadata and token, over
// TLS or not. Whatever it is, the guard does not panic, refuses only
// with PERMISSION_DENIED or UNAUTHENTICATED and never echoes the token,
// and what it lets through obeys the roles read from the URIs here (not
// through internal/identity): a call of the worker API or the
// collective streams over TLS passes only with a certificate whose
// questrt URIs all name the node role (or that has none, when roles
// are not required), the client API's with node or client roles; a
// guarded call passes a token only when it carries "Bearer <token>";
// and, over plaintext without a token, every call passes.
func FuzzGuard(f *testing.F) {
	worker := "/" + workerv1.Worker_ServiceDesc.ServiceName + "/"
	coll := "/" + collectivev1.Collective_ServiceDesc.ServiceName + "/"
	dec := "/" + decodev1.Decode_ServiceDesc.ServiceName + "/"
	for _, m := range []string{worker + "Layer", coll + "Exchange", dec + "Create", "/grpc.health.v1.Health/Check", "", worker} {
		for _, u := range []string{"questrt://node/a", "questrt://client/c", "QUESTRT://Node/a", "questrt://admin/x", "spiffe://x/y", "questrt:opaque", ""} {
			f.Add(m, u, "", "Bearer tok", "tok", false, true)
			f.Add(m, u, "questrt://client/a", "Bearer x", "tok", true, true)
			f.Add(m, u, "", "", "", false, false)
		}
	}
	g := newGuard("", false, slog.New(slog.DiscardHandler))
	f.Fuzz(func(t *testing.T, method, uri1, uri2, auth, token string, requireRoles, overTLS bool) {
		g.want, g.requireRoles = nil, requireRoles
		if token != "" {
			g.want = []byte("Bearer " + token)
		}
		cert := &x509.Certificate{Raw: []byte(uri1 + "\x00" + uri2)}
		for _, s := range []string{uri1, uri2} {
			if u, err := url.Parse(s); err == nil && s != "" {
				cert.URIs = append(cert.URIs, u)
			}
		}
		p := &peer.Peer{}
		if overTLS {
			p.AuthInfo = credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}}
		}
		ctx := peer.NewContext(context.Background(), p)
		if auth != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", auth))
		}
		err := g.check(ctx, method)

		nodesOnly := strings.HasPrefix(method, worker) || strings.HasPrefix(method, coll)
		clientAPI := strings.HasPrefix(method, dec)
		if err != nil {
			if c := status.Code(err); c != codes.PermissionDenied && c != codes.Unauthenticated {
				t.Fatalf("%s: code %v: %v", method, c, err)
			}
			if token != "" && len(token) > 3 && strings.Contains(status.Convert(err).Message(), token) {
				t.Fatalf("%s: the refusal echoes the token: %v", method, err)
			}
			if !nodesOnly && !clientAPI {
				t.Fatalf("%s (not guarded) refused: %v", method, err)
			}
		}
		if !overTLS && token == "" && err != nil {
			t.Fatalf("%s: plaintext without a token refused: %v", method, err)
		}
		if err != nil || (!nodesOnly && !clientAPI) {
			return
		}
		// Let through: check it against the roles the URIs name.
		if token != "" && auth != "Bearer "+token {
			t.Fatalf("%s let through with authorization %q, token %q", method, auth, token)
		}
		if !overTLS {
			return
		}
		roles := 0
		for _, u := range cert.URIs {
			if !strings.EqualFold(u.Scheme, "questrt") {
				continue
			}
			roles++
			host := strings.ToLower(u.Host)
			if nodesOnly && host != "node" {
				t.Fatalf("%s let through a certificate with URI %q", method, u)
			}
			if clientAPI && host != "node" && host != "client" {
				t.Fatalf("%s let through a certificate with URI %q", method, u)
			}
		}
		if roles == 0 && requireRoles {
			t.Fatalf("%s let through a certificate without a role although roles are required (URIs %q %q)", method, uri1, uri2)
		}
	})
}
