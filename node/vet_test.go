package node

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/internal/testcert"
)

// TestCheckIdentity: the certificate a member's gRPC server presents is
// admitted only when it is the node certificate of the member's gossip
// name (or, unless roles are required, a certificate without a role);
// a client certificate, another node's, or a malformed role is refused
// with the reason.
func TestCheckIdentity(t *testing.T) {
	ca := testcert.NewCA(t, "vet CA")
	for _, tc := range []struct {
		name    string
		cert    tls.Certificate
		require bool
		refused string // "" admitted; else a piece of the reason
	}{
		{"its node certificate", ca.IssueNode(t, "n1"), false, ""},
		{"its node certificate, roles required", ca.IssueNode(t, "n1"), true, ""},
		{"another node's certificate", ca.IssueNode(t, "n0"), false, `node "n0"'s`},
		{"a name that only starts the same", ca.IssueNode(t, "n10"), false, `node "n10"'s`},
		{"a client certificate named as the node", ca.IssueClient(t, "n1"), false, "client certificate"},
		{"a client certificate, roles required", ca.IssueClient(t, "c"), true, "client certificate"},
		{"no role", ca.Issue(t, "n1"), false, ""},
		{"no role, roles required", ca.Issue(t, "n1"), true, "--require-cert-roles"},
		{"a malformed role", ca.IssueWithURIs(t, "n1", "questrt://admin/n1"), false, "malformed"},
		{"two roles", ca.IssueWithURIs(t, "n1", "questrt://node/n1", "questrt://client/n1"), false, "malformed"},
		{"a role and another scheme", ca.IssueWithURIs(t, "n1", "spiffe://x/y", "questrt://node/n1"), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkIdentity("n1", tc.cert.Leaf, tc.require)
			switch {
			case tc.refused == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refused != "" && (!errors.Is(err, ErrRefusedMember) || !strings.Contains(err.Error(), tc.refused)):
				t.Errorf("error %v: want ErrRefusedMember saying %q", err, tc.refused)
			}
		})
	}
}

// tlsServer serves TLS with cert on 127.0.0.1 (the handshake only) and
// counts the connections it accepts; stop closes it.
func tlsServer(t *testing.T, ca *testcert.CA, cert *tls.Certificate) (addr string, accepts *atomic.Int64) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepts = new(atomic.Int64)
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(2 * time.Second))
				if cert == nil { // a plaintext server: answer HTTP/2's preface with garbage
					c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
					return
				}
				tc := tls.Server(c, ca.MutualTLS(*cert))
				tc.Handshake()
				buf := make([]byte, 1)
				tc.Read(buf) // until the client closes
			})
		}
	})
	return lis.Addr().String(), accepts
}

func member(name, addr string, instance uint64) cluster.Member {
	return cluster.Member{Name: name, Instance: instance, State: cluster.StateAlive, Meta: cluster.NodeMeta{GRPCAddr: addr}}
}

// TestVetterDials: the vetter dials each member's gRPC address under the
// node's TLS and admits only the one whose server presents its own node
// certificate; a plaintext server and a server of another CA are
// refused as unreachable under TLS. Verdicts are kept (no second dial)
// for one instance and address, a new address or instance is checked
// again, a refusal is checked again once it has stood for the retry
// interval, and this node and a plaintext cluster are never dialled.
func TestVetterDials(t *testing.T) {
	ca := testcert.NewCA(t, "vet CA")
	honest, client, other := ca.IssueNode(t, "n1"), ca.IssueClient(t, "n1"), testcert.NewCA(t, "rogue CA").IssueNode(t, "n1")
	self := ca.MutualTLS(ca.IssueNode(t, "n0"))

	hAddr, hAccepts := tlsServer(t, ca, &honest)
	cAddr, cAccepts := tlsServer(t, ca, &client)
	oAddr, _ := tlsServer(t, ca, &other)
	pAddr, _ := tlsServer(t, ca, nil)

	v := newVetter("n0", self, false, slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	v.now = func() time.Time { return now }
	ctx := t.Context()
	for _, tc := range []struct {
		what, addr, refused string
	}{
		{"its own node certificate", hAddr, ""},
		{"a client certificate", cAddr, "client certificate"},
		{"another CA's node certificate", oAddr, "cannot reach its gRPC address " + oAddr + " under TLS"},
		{"plaintext", pAddr, "cannot reach its gRPC address " + pAddr + " under TLS"},
		{"no address", "", "no gRPC address"},
	} {
		err := v.vet(ctx, member("n1", tc.addr, 1))
		if tc.refused == "" && err != nil || tc.refused != "" && (!errors.Is(err, ErrRefusedMember) || !strings.Contains(err.Error(), tc.refused)) {
			t.Errorf("%s: %v, want refused %q", tc.what, err, tc.refused)
		}
	}

	// Kept: the honest member's verdict stands without a dial.
	before := hAccepts.Load()
	for range 3 {
		if err := v.vet(ctx, member("n1", hAddr, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if got := hAccepts.Load() - before; got != 1 {
		t.Errorf("%d dials for 3 vets of one instance and address (the address changed in between: 1)", got)
	}
	// A new instance at the same address: checked again.
	if err := v.vet(ctx, member("n1", hAddr, 2)); err != nil || hAccepts.Load()-before != 2 {
		t.Errorf("new instance: %v, %d dials, want 2", err, hAccepts.Load()-before)
	}

	// A refusal stands for the retry interval, then is checked again;
	// refusals lists it for that instance and address only.
	cm := member("n1", cAddr, 3)
	if err := v.vet(ctx, cm); err == nil {
		t.Fatal("client certificate admitted")
	}
	view := cluster.View{Members: []cluster.Member{member("n0", "x", 9), cm}}
	if r := v.refusals(view); len(r) != 1 || !strings.Contains(r["n1"], "client certificate") {
		t.Errorf("refusals %v", r)
	}
	if r := v.refusals(cluster.View{Members: []cluster.Member{member("n1", cAddr, 4)}}); len(r) != 0 {
		t.Errorf("refusals of another instance: %v", r)
	}
	dialled := cAccepts.Load()
	now = now.Add(v.retry - time.Millisecond)
	if err := v.vet(ctx, cm); err == nil || !strings.Contains(err.Error(), "client certificate") || cAccepts.Load() != dialled {
		t.Errorf("within the retry interval: %v, %d new dials, want the kept refusal", err, cAccepts.Load()-dialled)
	}
	now = now.Add(2 * time.Millisecond)
	if err := v.vet(ctx, cm); err == nil || cAccepts.Load() != dialled+1 {
		t.Errorf("after the retry interval: %v, %d new dials, want a fresh check that refuses", err, cAccepts.Load()-dialled)
	}

	// This node and a plaintext cluster: admitted, nothing dialled.
	if err := v.vet(ctx, member("n0", pAddr, 1)); err != nil {
		t.Errorf("self: %v", err)
	}
	plain := newVetter("n0", nil, true, slog.New(slog.DiscardHandler))
	if err := plain.vet(ctx, member("n1", pAddr, 1)); err != nil {
		t.Errorf("plaintext cluster: %v", err)
	}

	// forget drops the members gone from the view.
	v.forget(cluster.View{Members: []cluster.Member{member("n0", "x", 9)}})
	if r := v.refusals(view); len(r) != 0 {
		t.Errorf("after forget: %v", r)
	}
}

// TestVetterDeclaredTransport: a TLS node refuses a member whose gossip
// metadata declares a plaintext gRPC server without dialling it (even
// at an address that would pass the handshake), saying so; a member that
// declares TLS, or declares nothing (a node older than the field), is
// dialled and admitted when its server presents its node certificate.
func TestVetterDeclaredTransport(t *testing.T) {
	ca := testcert.NewCA(t, "vet CA")
	honest := ca.IssueNode(t, "n1")
	addr, accepts := tlsServer(t, ca, &honest)
	v := newVetter("n0", ca.MutualTLS(ca.IssueNode(t, "n0")), false, slog.New(slog.DiscardHandler))
	ctx := t.Context()

	m := member("n1", addr, 1)
	m.Meta.Transport = cluster.TransportPlaintext
	err := v.vet(ctx, m)
	if !errors.Is(err, ErrRefusedMember) || !strings.Contains(err.Error(), "serves gRPC in plaintext") {
		t.Errorf("declared plaintext: %v, want refused as plaintext", err)
	}
	if n := accepts.Load(); n != 0 {
		t.Errorf("declared plaintext: %d dials, want none", n)
	}
	if r := v.refusals(cluster.View{Members: []cluster.Member{m}}); !strings.Contains(r["n1"], "plaintext") {
		t.Errorf("refusals %v, want n1 refused as plaintext", r)
	}
	for i, tr := range []cluster.Transport{cluster.TransportTLS, cluster.TransportUnknown} {
		m := member("n1", addr, uint64(2+i))
		m.Meta.Transport = tr
		if err := v.vet(ctx, m); err != nil {
			t.Errorf("declared %v: %v, want admitted", tr, err)
		}
		if n := accepts.Load(); n != int64(i+1) {
			t.Errorf("declared %v: %d dials in all, want %d", tr, n, i+1)
		}
	}
}

// TestVetterPlaintextNode: a plaintext node (no TLS config) refuses a
// member whose metadata declares a TLS gRPC server, without dialling it
// (none of its connections could reach that server), and says so in its
// refusals; members that declare plaintext, or nothing (older than the
// field), are admitted without a dial, as is the node itself.
func TestVetterPlaintextNode(t *testing.T) {
	ca := testcert.NewCA(t, "vet CA")
	honest := ca.IssueNode(t, "n1")
	addr, accepts := tlsServer(t, ca, &honest)
	v := newVetter("n0", nil, false, slog.New(slog.DiscardHandler))
	ctx := t.Context()

	m := member("n1", addr, 1)
	m.Meta.Transport = cluster.TransportTLS
	err := v.vet(ctx, m)
	if !errors.Is(err, ErrRefusedMember) || !strings.Contains(err.Error(), "serves gRPC over TLS") || !strings.Contains(err.Error(), "runs plaintext") {
		t.Errorf("declared TLS to a plaintext node: %v, want refused as TLS", err)
	}
	if r := v.refusals(cluster.View{Members: []cluster.Member{m}}); !strings.Contains(r["n1"], "over TLS") {
		t.Errorf("refusals %v, want n1 refused as TLS", r)
	}
	for i, tr := range []cluster.Transport{cluster.TransportPlaintext, cluster.TransportUnknown} {
		m := member("n1", addr, uint64(2+i))
		m.Meta.Transport = tr
		if err := v.vet(ctx, m); err != nil {
			t.Errorf("declared %v to a plaintext node: %v, want admitted", tr, err)
		}
		if r := v.refusals(cluster.View{Members: []cluster.Member{m}}); len(r) != 0 {
			t.Errorf("declared %v: refusals %v, want none", tr, r)
		}
	}
	self := member("n0", addr, 9)
	self.Meta.Transport = cluster.TransportTLS
	if err := v.vet(ctx, self); err != nil {
		t.Errorf("the node itself: %v, want admitted", err)
	}
	if n := accepts.Load(); n != 0 {
		t.Errorf("%d dials, want none", n)
	}
}
