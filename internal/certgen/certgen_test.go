package certgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/identity"
)

func newCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *CA, name string, hosts ...string) *Leaf {
	t.Helper()
	l, err := ca.Issue(name, hosts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestIssue: a leaf verifies against its CA for server and client
// authentication, names the SANs asked for (the defaults always), is
// valid for Validity and not after the CA, and does not verify against
// another CA; the CA is P-256 and signs leaves only.
func TestIssue(t *testing.T) {
	ca := newCA(t, "test CA")
	l := issue(t, ca, "node-0", "10.1.2.3", "Node-0.Example.com.", "::1", "127.0.0.1")

	for _, c := range []*x509.Certificate{ca.Cert, l.Cert} {
		k, ok := c.PublicKey.(*ecdsa.PublicKey)
		if !ok || k.Curve != elliptic.P256() {
			t.Errorf("%s: key %T, want ECDSA P-256", c.Subject.CommonName, c.PublicKey)
		}
		if got := c.NotAfter.Sub(c.NotBefore); got > Validity+skew+time.Second || got < Validity-time.Minute {
			t.Errorf("%s: valid %v (%v .. %v), want about %v", c.Subject.CommonName, got, c.NotBefore, c.NotAfter, Validity)
		}
		if time.Now().Before(c.NotBefore) {
			t.Errorf("%s: not valid yet", c.Subject.CommonName)
		}
	}
	if !ca.Cert.IsCA || ca.Cert.MaxPathLen != 0 || !ca.Cert.MaxPathLenZero || ca.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA: IsCA %v, MaxPathLen %d (zero %v), key usage %v", ca.Cert.IsCA, ca.Cert.MaxPathLen, ca.Cert.MaxPathLenZero, ca.Cert.KeyUsage)
	}
	if l.Cert.IsCA || l.Cert.NotAfter.After(ca.Cert.NotAfter) || l.Cert.Subject.CommonName != "node-0" {
		t.Errorf("leaf: IsCA %v, not after %v (CA %v), CN %q", l.Cert.IsCA, l.Cert.NotAfter, ca.Cert.NotAfter, l.Cert.Subject.CommonName)
	}

	var ips []string
	for _, ip := range l.Cert.IPAddresses {
		ips = append(ips, ip.String())
	}
	if want := []string{"127.0.0.1", "::1", "10.1.2.3"}; !slices.Equal(ips, want) {
		t.Errorf("IP SANs %q, want %q", ips, want)
	}
	if want := []string{"localhost", "node-0.example.com"}; !slices.Equal(l.Cert.DNSNames, want) {
		t.Errorf("DNS SANs %q, want %q", l.Cert.DNSNames, want)
	}

	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, host := range []string{"", "127.0.0.1", "::1", "localhost", "10.1.2.3", "node-0.example.com"} {
			if _, err := l.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: host}); err != nil {
				t.Errorf("usage %v, host %q: %v", usage, host, err)
			}
		}
	}
	if _, err := l.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "10.9.9.9"}); err == nil {
		t.Error("the leaf verifies for an address it does not name")
	}
	if _, err := l.Cert.Verify(x509.VerifyOptions{Roots: newCA(t, "other CA").Pool()}); err == nil {
		t.Error("the leaf verifies against another CA")
	}
	// Serial numbers are random and positive.
	other := issue(t, ca, "other")
	if other.Cert.SerialNumber.Cmp(l.Cert.SerialNumber) == 0 || other.Cert.SerialNumber.Sign() <= 0 {
		t.Errorf("serial numbers %v and %v", l.Cert.SerialNumber, other.Cert.SerialNumber)
	}
	if _, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		t.Errorf("PEM pair: %v", err)
	}
}

func TestIssueBadHosts(t *testing.T) {
	ca := newCA(t, "test CA")
	for _, h := range []string{"", "a b", "under_score", "-lead.example", "x/y"} {
		if _, err := ca.Issue("n", h); err == nil {
			t.Errorf("host %q accepted", h)
		}
	}
	if _, err := ca.Issue(""); err == nil {
		t.Error("empty name accepted")
	}
	if _, err := NewCA(""); err == nil {
		t.Error("empty CA name accepted")
	}
}

// TestWriteFiles: the files load as a key pair and a CA pool; keys are
// 0600 (also when they replace an older, wider file), certificates 0644,
// a new directory 0700, and no temporary file is left.
func TestWriteFiles(t *testing.T) {
	ca := newCA(t, "test CA")
	dir := filepath.Join(t.TempDir(), "tls")
	leaves := map[string]*Leaf{"node-0": issue(t, ca, "node-0"), "client": issue(t, ca, "client")}
	if err := WriteFiles(dir, ca, leaves); err != nil {
		t.Fatal(err)
	}
	// An older key file with a wide mode is replaced by a 0600 one.
	if err := os.Chmod(filepath.Join(dir, KeyFile("client")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(dir, ca, leaves); err != nil {
		t.Fatal(err)
	}
	mode := func(p string) os.FileMode {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	if runtime.GOOS != "windows" {
		if m := mode(dir); m != 0o700 {
			t.Errorf("directory mode %v, want 0700", m)
		}
		for name := range leaves {
			if m := mode(filepath.Join(dir, KeyFile(name))); m != 0o600 {
				t.Errorf("%s: key mode %v, want 0600", name, m)
			}
			if m := mode(filepath.Join(dir, CertFile(name))); m != 0o644 {
				t.Errorf("%s: certificate mode %v, want 0644", name, m)
			}
		}
		if m := mode(filepath.Join(dir, CAFile)); m != 0o644 {
			t.Errorf("CA mode %v, want 0644", m)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"ca.pem", "client.key", "client.pem", "node-0.key", "node-0.pem"}; !slices.Equal(names, want) {
		t.Errorf("files %q, want %q", names, want)
	}
	for name := range leaves {
		if _, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile(name)), filepath.Join(dir, KeyFile(name))); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	if p := x509.NewCertPool(); !p.AppendCertsFromPEM(b) || strings.Contains(string(b), "PRIVATE KEY") {
		t.Errorf("ca.pem: %q", b)
	}
	for _, bad := range []string{"", ".hidden", "a/b", "../x"} {
		if err := WriteFiles(dir, nil, map[string]*Leaf{bad: leaves["client"]}); err == nil {
			t.Errorf("leaf name %q accepted", bad)
		}
	}
}

// TestHandshake: over a real TLS listener on loopback, a server and a
// client with leaves of one CA complete a mutual handshake (each sees
// the other's certificate) on 127.0.0.1, ::1 and localhost; a client
// with a leaf of a foreign CA is refused by the server, and a client
// that trusts only a foreign CA refuses the server.
func TestHandshake(t *testing.T) {
	ca, foreign := newCA(t, "cluster CA"), newCA(t, "foreign CA")
	srvCert := issue(t, ca, "server").TLSCertificate()
	cliCert := issue(t, ca, "client").TLSCertificate()
	rogue := issue(t, foreign, "rogue").TLSCertificate()
	server := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srvCert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
	client := func(cert tls.Certificate, roots *CA, name string) *tls.Config {
		// GetClientCertificate presents cert whatever CAs the server
		// asks for (with Certificates, a client sends none that the
		// server's CAs did not sign).
		return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots.Pool(), ServerName: name,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
	}

	for _, host := range []string{"127.0.0.1", "::1", "localhost"} {
		network := "tcp4"
		if host == "::1" {
			network = "tcp6"
		}
		srvCN, cliCN, err := handshake(t, network, server, client(cliCert, ca, host))
		if err != nil && host == "::1" && strings.Contains(err.Error(), "listen") {
			t.Logf("no IPv6 loopback: %v", err)
			continue
		}
		if err != nil || srvCN != "server" || cliCN != "client" {
			t.Errorf("%s: mutual handshake: server %q, client %q, %v", host, srvCN, cliCN, err)
		}
	}
	if _, _, err := handshake(t, "tcp4", server, client(rogue, ca, "127.0.0.1")); err == nil {
		t.Error("the server accepted a client certificate of a foreign CA")
	} else if !strings.Contains(err.Error(), "unknown certificate authority") {
		t.Errorf("client certificate of a foreign CA: %v, want an unknown certificate authority", err)
	}
	if _, _, err := handshake(t, "tcp4", server, client(cliCert, foreign, "127.0.0.1")); err == nil {
		t.Error("a client trusting only a foreign CA accepted the server")
	} else if !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("client trusting a foreign CA: %v, want an unknown authority", err)
	}
	if _, _, err := handshake(t, "tcp4", server, client(cliCert, ca, "other.example")); err == nil {
		t.Error("the client accepted the server for a name it does not hold")
	}
}

// handshake runs a TLS handshake between server and client over a
// loopback connection of network (tcp4, tcp6) and returns the common
// names each side saw of the other, or the first error.
func handshake(t *testing.T, network string, server, client *tls.Config) (serverCN, clientCN string, err error) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "tcp6" {
		addr = "[::1]:0"
	}
	lis, err := tls.Listen(network, addr, server)
	if err != nil {
		return "", "", err
	}
	defer lis.Close()
	type side struct {
		cn  string
		err error
	}
	srv := make(chan side, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			srv <- side{err: err}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			srv <- side{err: err}
			return
		}
		// Under TLS 1.3 the client learns of a refused certificate on
		// its first read: answer one byte.
		tc.Write([]byte{1})
		srv <- side{cn: tc.ConnectionState().PeerCertificates[0].Subject.CommonName}
	}()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, network, lis.Addr().String(), client)
	if err == nil {
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err = conn.Read(make([]byte, 1)); err == nil {
			serverCN = conn.ConnectionState().PeerCertificates[0].Subject.CommonName
		}
	} else {
		lis.Close() // the server's Accept returns
	}
	s := <-srv
	if err == nil {
		err = s.err
	}
	return serverCN, s.cn, err
}

// TestIssueRole: IssueNode and IssueClient add the role URI SAN
// (questrt://node/NAME, questrt://client/NAME) and keep the DNS and IP
// SANs; Issue adds none; a name that cannot be a role URI's is refused.
func TestIssueRole(t *testing.T) {
	ca := newCA(t, "test CA")
	for _, tc := range []struct {
		issue func(string, ...string) (*Leaf, error)
		role  identity.Role
		uri   string
	}{
		{ca.IssueNode, identity.Node, "questrt://node/n-0"},
		{ca.IssueClient, identity.Client, "questrt://client/n-0"},
		{ca.Issue, identity.None, ""},
	} {
		l, err := tc.issue("n-0", "10.1.2.3", "n0.example.com")
		if err != nil {
			t.Fatal(err)
		}
		id, err := identity.Of(l.Cert)
		if err != nil || id.Role != tc.role || (tc.role != identity.None && id.Name != "n-0") {
			t.Errorf("%s: identity %+v, %v", tc.role, id, err)
		}
		var uris []string
		for _, u := range l.Cert.URIs {
			uris = append(uris, u.String())
		}
		if want := []string{tc.uri}; tc.uri != "" && !slices.Equal(uris, want) || tc.uri == "" && len(uris) != 0 {
			t.Errorf("%s: URIs %q, want %q", tc.role, uris, tc.uri)
		}
		if !slices.Contains(l.Cert.DNSNames, "n0.example.com") || !slices.Contains(l.Cert.DNSNames, "localhost") || len(l.Cert.IPAddresses) != 3 {
			t.Errorf("%s: DNS %q IP %v", tc.role, l.Cert.DNSNames, l.Cert.IPAddresses)
		}
	}
	if _, err := ca.IssueNode("a b"); !errors.Is(err, identity.ErrMalformed) {
		t.Errorf("IssueNode(\"a b\"): %v, want ErrMalformed", err)
	}
}
