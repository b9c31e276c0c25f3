// Package testcert makes certificate authorities and leaf certificates
// in tests, over internal/certgen (ECDSA P-256; leaves for server and
// client authentication with the IP SAN 127.0.0.1 only), failing the
// test instead of returning errors. For tests only.
package testcert

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/questrt/questrt/internal/certgen"
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

// Issue signs a leaf certificate for name (server and client auth) and
// returns it with its key and parsed leaf.
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
