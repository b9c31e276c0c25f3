package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// FuzzAuthorizeGrid: the worker API's grid check for any grid id and
// any URI SANs of the caller's certificate. It does not panic, refuses
// only with PERMISSION_DENIED and never names the grid, and it lets a
// TLS caller with a questrt role through only when every questrt URI
// of its certificate is questrt://node/OWNER, OWNER the grid's
// coordinator as the id names it (the id up to its first '/'; read
// here, not through gridOwner), or when the certificate has no questrt
// URI at all (no role: no name to check).
func FuzzAuthorizeGrid(f *testing.F) {
	for _, id := range []string{"a/1/1", "b/2/3", "a", "", "/x", "a/b/c/d"} {
		for _, u := range []string{"questrt://node/a", "questrt://node/b", "questrt://client/a", "QUESTRT://NODE/a", "questrt://node/a/1", "spiffe://a", ""} {
			f.Add(id, u, "")
			f.Add(id, u, "questrt://node/b")
		}
	}
	f.Fuzz(func(t *testing.T, id, uri1, uri2 string) {
		cert := &x509.Certificate{}
		for _, s := range []string{uri1, uri2} {
			if u, err := url.Parse(s); err == nil && s != "" {
				cert.URIs = append(cert.URIs, u)
			}
		}
		ctx := peer.NewContext(context.Background(), &peer.Peer{
			AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}}})
		err := authorize(ctx, id)
		if err != nil {
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("grid %q: code %v: %v", id, status.Code(err), err)
			}
			if len(id) > 3 && strings.Contains(status.Convert(err).Message(), id) {
				t.Fatalf("the refusal names the grid %q: %v", id, err)
			}
			return
		}
		owner, _, _ := strings.Cut(id, "/")
		for _, u := range cert.URIs {
			if !strings.EqualFold(u.Scheme, "questrt") {
				continue
			}
			if !strings.EqualFold(u.Host, "node") || u.Path != "/"+owner {
				t.Fatalf("grid %q (owner %q) let through a certificate with URI %q", id, owner, u)
			}
		}
		// In process, every call passes.
		if err := authorize(inProcess(ctx), id); err != nil {
			t.Fatalf("grid %q in process: %v", id, err)
		}
	})
}
