package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/questrt/questrt/internal/identity"
)

// certReloader holds the mutual-TLS material of --tls-cert, --tls-key and
// --tls-ca and reads the files again on reload (SIGHUP). The tls.Config
// of config reads the current material on every handshake, so new
// connections, incoming and outgoing, use what the last successful
// reload read, and open ones go on with what they were made with. A
// reload that fails keeps the old material. Safe for concurrent use.
//
// What a reload changes: as server, the certificate presented and the
// CAs that client certificates are verified against (GetConfigForClient);
// as client (this node dialling another: the worker API, the collective
// streams), the certificate presented (GetClientCertificate) and the CAs
// that the server's certificate is verified against (VerifyConnection,
// see verifyServer). So a CA can be rotated without a restart: give every
// node a bundle of the old and the new CA in --tls-ca and SIGHUP them,
// then certificates of the new CA and SIGHUP, then the new CA alone and
// SIGHUP.
//
// The one check the client side gives up for that: crypto/tls verifies
// a server's chain against a fixed RootCAs, so the chain is verified
// here instead, and a verification callback does not see an IP address
// dialled (only a DNS name, which is checked). Nodes dial each other at
// IP addresses (--advertise), so a server's certificate is not checked
// against the address dialled: any certificate of the current CA for
// server authentication is accepted. Mutual TLS here already trusts every
// holder of a certificate of the CA as a member (incoming connections are
// checked against the CA only, and any member may call the worker API),
// so this binds no one that the CA did not already trust.
type certReloader struct {
	certFile, keyFile, caFile string
	// name is the node's --name: a node certificate must be its.
	name string
	cur  atomic.Pointer[tlsMaterial]
}

// tlsMaterial is what one load of the files read.
type tlsMaterial struct {
	cert tls.Certificate
	pool *x509.CertPool
}

// newCertReloader loads the three files once; an error (a *fileError)
// names the flag and the file.
func newCertReloader(name, certFile, keyFile, caFile string) (*certReloader, error) {
	r := &certReloader{name: name, certFile: certFile, keyFile: keyFile, caFile: caFile}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// reload reads the files again and, when all of them load, makes them
// the material of new handshakes; else it returns the error and keeps
// the old.
func (r *certReloader) reload() error {
	cert, err := loadKeyPair("tls-cert", r.certFile, "tls-key", r.keyFile)
	if err != nil {
		return err
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return &fileError{"tls-cert", r.certFile, err}
		}
	}
	if err := checkNodeRole(leaf, r.name); err != nil {
		return &fileError{"tls-cert", r.certFile, err}
	}
	pem, err := readPEMFile("tls-ca", r.caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return &fileError{"tls-ca", r.caFile, errors.New("no PEM certificate in it")}
	}
	r.cur.Store(&tlsMaterial{cert: cert, pool: pool})
	return nil
}

// checkNodeRole refuses a certificate that cannot be node name's: one
// whose questrt:// role URI SAN names a client or another node, or is
// malformed. Such a node would join the gossip layer and be refused by
// every peer (they check the role and name its gRPC server presents),
// so it is refused before it starts, and a SIGHUP that reads one keeps
// the old certificate. A certificate without a role passes (issued
// before roles; peers apply their --require-cert-roles).
func checkNodeRole(leaf *x509.Certificate, name string) error {
	id, err := identity.Of(leaf)
	if err != nil {
		return fmt.Errorf("its questrt:// role URI SAN is malformed: %w", err)
	}
	if id.Role == identity.Client {
		return fmt.Errorf("it is a client certificate (questrt://client/%s), and a node needs a node certificate (questrt://node/NAME; questctl tls node NAME issues one)", id.Name)
	}
	if id.Role == identity.Node && id.Name != name {
		return fmt.Errorf("it is node %q's certificate (questrt://node/%s), and this node is --name %q: its peers would refuse it as an impostor (questctl tls node %s issues its own)", id.Name, id.Name, name, name)
	}
	return nil
}

// leaf is the current certificate's leaf (for the log).
func (r *certReloader) leaf() *x509.Certificate { return r.cur.Load().cert.Leaf }

// config returns the node's tls.Config, as server and as client, reading
// the current material on each handshake.
func (r *certReloader) config() *tls.Config {
	start := r.cur.Load()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// As client: the current certificate, and the server's chain
		// verified against the current CAs by verifyServer, in place of
		// crypto/tls's check against fixed roots (see certReloader).
		InsecureSkipVerify: true,
		VerifyConnection:   r.verifyServer,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &r.cur.Load().cert, nil
		},
		// As server: the current certificate and client CAs.
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  start.pool,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := r.cur.Load()
			return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{m.cert},
				ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: m.pool}, nil
		},
	}
}

// verifyServer verifies, for this node as client, the server's
// certificate chain against the current CAs, for server authentication,
// and its name when one was dialled (an IP address is not seen here; see
// certReloader). Server handshakes never call it: GetConfigForClient's
// config has no VerifyConnection.
func (r *certReloader) verifyServer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the server presented no certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         r.cur.Load().pool,
		Intermediates: x509.NewCertPool(),
		DNSName:       cs.ServerName,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}
