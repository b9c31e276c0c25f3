package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/questrt/questrt/internal/readlimit"
)

// fileError is a flag's file that questd cannot use: missing,
// unreadable, too large, or not what the flag wants. Its message names
// the flag and the file, `--tls-cert "node.pem": why`; run answers it
// with exit status 2 before anything starts (checkTLSFiles).
type fileError struct {
	flag, path string
	err        error
}

func (e *fileError) Error() string { return fmt.Sprintf("--%s %q: %v", e.flag, e.path, e.err) }

func (e *fileError) Unwrap() error { return e.err }

// readPEMFile reads the file of flag (at most readlimit.MaxPEMFile
// bytes); an error is a *fileError.
func readPEMFile(flag, path string) ([]byte, error) {
	b, err := readlimit.ReadFile(path, readlimit.MaxPEMFile)
	if err != nil {
		return nil, &fileError{flag, path, unwrapPath(err)}
	}
	return b, nil
}

// parseCertPEM checks that b holds a PEM certificate and that the first
// one parses.
func parseCertPEM(b []byte) error {
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			return errors.New("no PEM certificate in it")
		}
		if blk.Type == "CERTIFICATE" {
			if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
				return fmt.Errorf("its first certificate does not parse: %w", err)
			}
			return nil
		}
	}
}

// loadKeyPair is tls.LoadX509KeyPair of the files of certFlag and
// keyFlag, each read under readlimit.MaxPEMFile, with an error (a
// *fileError) that names the one flag and file at fault: the
// certificate's when it is missing, unreadable or holds no certificate
// that parses; else the key's (missing, unreadable, not a key, or not
// the certificate's).
func loadKeyPair(certFlag, certFile, keyFlag, keyFile string) (tls.Certificate, error) {
	certPEM, err := readPEMFile(certFlag, certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := parseCertPEM(certPEM); err != nil {
		return tls.Certificate{}, &fileError{certFlag, certFile, err}
	}
	keyPEM, err := readPEMFile(keyFlag, keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, &fileError{keyFlag, keyFile, fmt.Errorf("%w (the key of --%s %q)", err, certFlag, certFile)}
	}
	return cert, nil
}

// checkTLSFiles reads the TLS files of cfg once, before anything starts
// (serve reads them again), so that a missing, unreadable or invalid
// certificate, key or CA is a configuration error (exit 2, one line
// naming the flag and the file) rather than a failure to serve.
func checkTLSFiles(cfg Config) error {
	if !cfg.Security.Plaintext {
		if _, err := newCertReloader(cfg.Node.Name, cfg.Security.TLSCert, cfg.Security.TLSKey, cfg.Security.TLSCA); err != nil {
			return err
		}
	}
	if cfg.Serve.TLSCert != "" {
		if _, err := newHTTPCert(cfg.Serve.TLSCert, cfg.Serve.TLSKey); err != nil {
			return err
		}
	}
	return nil
}
