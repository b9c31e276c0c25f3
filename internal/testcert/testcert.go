// Package testcert makes certificate authorities and leaf certificates
// in tests, over internal/certgen (ECDSA P-256; leaves for server and
// client authentication with the IP SAN 127.0.0.1 only), failing the
// test instead of returning errors. For tests only.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/certgen"
	"github.com/questrt/questrt/internal/identity"
)

// CA is a certificate authority made in a test.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// Pool holds Cert; PEM is Cert PEM-encoded.
	Pool *x509.CertPool
	PEM  []byte
	ca   *certgen.CA
}

// NewCA returns a fresh CA whose subject is name.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	ca, err := certgen.NewCA(name)
	if err != nil {
		tb.Fatal(err)
	}
	return &CA{Cert: ca.Cert, Key: ca.Key, Pool: ca.Pool(), PEM: ca.PEM, ca: ca}
}

// Issue signs a leaf certificate for name (server and client auth), with
// no role URI SAN (as certificates issued before roles), and returns it
// with its key and parsed leaf.
func (ca *CA) Issue(tb testing.TB, name string) tls.Certificate {
	tb.Helper()
	return ca.issue(tb, name).TLSCertificate()
}

// IssuePEM is Issue as PEM files' contents: the certificate and the
// private key.
func (ca *CA) IssuePEM(tb testing.TB, name string) (certPEM, keyPEM []byte) {
	tb.Helper()
	l := ca.issue(tb, name)
	return l.CertPEM, l.KeyPEM
}

// IssueNode is Issue with the role URI SAN questrt://node/NAME.
func (ca *CA) IssueNode(tb testing.TB, name string) tls.Certificate {
	tb.Helper()
	return ca.issueRole(tb, identity.Node, name).TLSCertificate()
}

// IssueClient is Issue with the role URI SAN questrt://client/NAME.
func (ca *CA) IssueClient(tb testing.TB, name string) tls.Certificate {
	tb.Helper()
	return ca.issueRole(tb, identity.Client, name).TLSCertificate()
}

func (ca *CA) issueRole(tb testing.TB, role identity.Role, name string) *certgen.Leaf {
	l, err := ca.ca.IssueRole(role, name, "127.0.0.1")
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

func (ca *CA) issue(tb testing.TB, name string) *certgen.Leaf {
	l, err := ca.ca.IssueFor(name, "127.0.0.1")
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// MutualTLS is the mutual-TLS config of a member holding cert, as questd
// makes it: this CA's pool as roots and client CAs, client certificates
// required, TLS 1.3.
func (ca *CA) MutualTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool, ClientCAs: ca.Pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
}

// IssueWithURIs is Issue with the URI SANs uris, whatever they say (to
// test how malformed role URIs are refused).
func (ca *CA) IssueWithURIs(tb testing.TB, name string, uris ...string) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			tb.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		tb.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}
