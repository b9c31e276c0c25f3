package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// certReloader holds the mutual-TLS material of --tls-cert, --tls-key and
// --tls-ca and reads the files again on reload (SIGHUP). The tls.Config
// of config reads the current material on every handshake, so new
// connections use what the last successful reload read, and open ones go
// on with what they were made with. A reload that fails keeps the old
// material. Safe for concurrent use.
//
// What a reload changes: as server, the certificate presented and the
// CAs that client certificates are verified against (GetConfigForClient);
// as client (this node dialling another), the certificate presented
// (GetClientCertificate). The roots this node verifies other nodes'
// server certificates against are those read at start: crypto/tls has no
// per-handshake hook for them that keeps the check of the peer's address
// (VerifyConnection does not see the IP dialled), so a new CA is trusted
// as client after a restart. Rotate a CA with a bundle holding the old
// and the new CA in --tls-ca before any node gets a certificate of the
// new one.
type certReloader struct {
	certFile, keyFile, caFile string
	cur                       atomic.Pointer[tlsMaterial]
}

// tlsMaterial is what one load of the files read.
type tlsMaterial struct {
	cert tls.Certificate
	pool *x509.CertPool
}

// newCertReloader loads the three files once; an error names the flag.
func newCertReloader(certFile, keyFile, caFile string) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, caFile: caFile}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// reload reads the files again and, when all of them load, makes them
// the material of new handshakes; else it returns the error and keeps
// the old.
func (r *certReloader) reload() error {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert %q, --tls-key %q: %w", r.certFile, r.keyFile, err)
	}
	pem, err := os.ReadFile(r.caFile)
	if err != nil {
		return fmt.Errorf("--tls-ca %q: %w", r.caFile, errors.Unwrap(err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("--tls-ca %q: no PEM certificate in it", r.caFile)
	}
	r.cur.Store(&tlsMaterial{cert: cert, pool: pool})
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
		// As client: the roots read at start (see certReloader), the
		// current certificate.
		RootCAs: start.pool,
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
