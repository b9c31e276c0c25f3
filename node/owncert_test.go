package node_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/testcert"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// TestStartRefusesForeignCert: a node started through the library with a
// certificate its peers would refuse (a client's, another node's, a
// malformed role URI), whether the certificate is fixed or served by a
// callback as questd's reloader does, is refused by Start with the
// reason, before it joins anything; its own node certificate and one
// without a role start.
func TestStartRefusesForeignCert(t *testing.T) {
	ca := testcert.NewCA(t, "questrt test CA")
	ec := geometry(1, 1, plan.Exact)
	viaCallback := func(c *tls.Config) *tls.Config {
		cert := c.Certificates[0]
		c.Certificates = nil
		c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		return c
	}
	for _, c := range []struct {
		name string
		tls  *tls.Config
		want string // in Start's error; "" starts
	}{
		{"client", ca.MutualTLS(ca.IssueClient(t, "someone")), "client certificate"},
		{"client-callback", viaCallback(ca.MutualTLS(ca.IssueClient(t, "someone"))), "client certificate"},
		{"other-node", ca.MutualTLS(ca.IssueNode(t, "n1")), `node "n1"'s`},
		{"other-node-callback", viaCallback(ca.MutualTLS(ca.IssueNode(t, "n1"))), `node "n1"'s`},
		{"malformed", ca.MutualTLS(ca.IssueWithURIs(t, "x", "questrt://admin/x")), "malformed"},
		{"own", ca.MutualTLS(ca.IssueNode(t, "n0")), ""},
		{"own-callback", viaCallback(ca.MutualTLS(ca.IssueNode(t, "n0"))), ""},
		{"no-role", ca.MutualTLS(ca.Issue(t, "n0")), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := node.Config{GRPCAddr: "127.0.0.1:0", Member: nodetest.Member("n0"), Engine: ec, TLS: c.tls,
				MemoryLimit: memlimit.NoLimit, DrainTimeout: time.Second, Version: "test"}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			n, err := node.Start(ctx, cfg)
			cancel()
			if n != nil {
				defer func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					n.Stop(ctx)
					cancel()
				}()
			}
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Start: %v", err)
			case c.want != "" && err == nil:
				t.Fatalf("Start with a %s certificate started", c.name)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("Start: %v; want the reason %q", err, c.want)
			}
		})
	}
}
