package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// ownCertificate refuses a node's TLS whose certificate every peer's
// vetter would refuse for name (checkIdentity): a client certificate,
// another node's, or a malformed questrt:// role URI. Such a node would
// join the gossip layer and never be placed on, or, under a role check
// that lets it in, serve as someone it is not; questd refuses the same
// files at start and on reload (cmd/questd checkNodeRole), and Start
// refuses them for every other user of the library. A certificate
// without a role passes (issued before roles: peers apply their
// RequireCertRoles). The certificate is the one the node serves:
// Certificates[0], else GetCertificate's, else GetClientCertificate's;
// one that none of them yields is left to the handshakes.
func ownCertificate(name string, cfg *tls.Config) error {
	var cert *tls.Certificate
	switch {
	case len(cfg.Certificates) > 0:
		cert = &cfg.Certificates[0]
	case cfg.GetCertificate != nil:
		c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			return fmt.Errorf("node: its TLS certificate: %w", err)
		}
		cert = c
	case cfg.GetClientCertificate != nil:
		c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			return fmt.Errorf("node: its TLS certificate: %w", err)
		}
		cert = c
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return nil
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("node: its TLS certificate: %w", err)
		}
	}
	if err := checkIdentity(name, leaf, false); err != nil {
		why := strings.TrimPrefix(err.Error(), ErrRefusedMember.Error()+": ")
		if errors.Is(err, ErrRefusedMember) {
			return fmt.Errorf("node %q: every peer would refuse it: %s", name, why)
		}
		return fmt.Errorf("node %q: %w", name, err)
	}
	return nil
}
