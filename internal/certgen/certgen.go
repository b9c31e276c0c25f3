package certgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/questrt/questrt/internal/identity"
)

// Validity is how long the CA and every leaf are valid.
const Validity = 7 * 24 * time.Hour

// skew is how far before now certificates become valid.
const skew = 5 * time.Minute

// CAFile is the name of the CA certificate's file in a directory that
// WriteFiles wrote.
const CAFile = "ca.pem"

// CertFile and KeyFile are the names of leaf name's certificate and key
// files in a directory that WriteFiles wrote.
func CertFile(name string) string { return name + ".pem" }
func KeyFile(name string) string  { return name + ".key" }

// DefaultHosts are the subject alternative names of every leaf.
var DefaultHosts = []string{"127.0.0.1", "::1", "localhost"}

// CA is a certificate authority; its key never leaves memory
// (WriteFiles does not write it).
type CA struct {
	// Cert is the CA's self-signed certificate; PEM is Cert PEM-encoded.
	Cert *x509.Certificate
	PEM  []byte
	// Key signs the leaves.
	Key *ecdsa.PrivateKey
	// LeafValidity is how long the leaves it issues are valid (never
	// after the CA itself); zero means Validity.
	LeafValidity time.Duration
}

// Leaf is a certificate that a CA issued, with its key.
type Leaf struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// CertPEM is Cert PEM-encoded; KeyPEM is Key as a PEM "PRIVATE KEY"
	// (PKCS #8).
	CertPEM, KeyPEM []byte
}

// NewCA makes a CA whose subject's common name is name, valid for
// Validity.
func NewCA(name string) (*CA, error) {
	return makeCA(name, Validity)
}

// makeCA makes a CA named name valid for validity.
func makeCA(name string, validity time.Duration) (*CA, error) {
	if name == "" {
		return nil, errors.New("certgen: empty CA name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-skew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true, // leaves only
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA certificate: %w", err)
	}
	return &CA{Cert: cert, PEM: pemBlock("CERTIFICATE", der), Key: key}, nil
}

// Pool is a certificate pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue makes a leaf certificate whose subject's common name is name, for
// server and client authentication, with the subject alternative names
// DefaultHosts and hosts (each an IP address or a DNS name), and no role
// (IssueNode and IssueClient add one). It is valid for ca.LeafValidity
// (Validity unless set), and not after the CA.
func (ca *CA) Issue(name string, hosts ...string) (*Leaf, error) {
	return ca.IssueFor(name, append(append([]string(nil), DefaultHosts...), hosts...)...)
}

// IssueNode is Issue for a node of the cluster: the certificate also
// carries the URI SAN questrt://node/NAME (internal/identity), which
// lets it call the worker API and the collective streams.
func (ca *CA) IssueNode(name string, hosts ...string) (*Leaf, error) {
	return ca.IssueRole(identity.Node, name, append(append([]string(nil), DefaultHosts...), hosts...)...)
}

// IssueClient is Issue for a client: the certificate also carries the
// URI SAN questrt://client/NAME, which lets it call the client API only.
func (ca *CA) IssueClient(name string, hosts ...string) (*Leaf, error) {
	return ca.IssueRole(identity.Client, name, append(append([]string(nil), DefaultHosts...), hosts...)...)
}

// IssueRole is IssueFor with the role URI SAN questrt://ROLE/NAME
// (identity.URI); role is identity.Node or identity.Client.
func (ca *CA) IssueRole(role identity.Role, name string, hosts ...string) (*Leaf, error) {
	u, err := identity.URI(role, name)
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: %w", name, err)
	}
	return ca.issue(name, []*url.URL{u}, hosts)
}

// IssueFor is Issue with exactly the subject alternative names hosts
// (DefaultHosts not added). The certificate carries no role: servers
// that accept such certificates treat them as nodes' (node).
func (ca *CA) IssueFor(name string, hosts ...string) (*Leaf, error) {
	return ca.issue(name, nil, hosts)
}

// issue makes a leaf for name with the SANs hosts and uris.
func (ca *CA) issue(name string, uris []*url.URL, hosts []string) (*Leaf, error) {
	if name == "" {
		return nil, errors.New("certgen: empty certificate name")
	}
	var ips []net.IP
	var dns []string
	seen := map[string]bool{}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, fmt.Errorf("certgen: %s: empty host name", name)
		}
		if a, err := netip.ParseAddr(h); err == nil {
			a = a.Unmap().WithZone("")
			if seen[a.String()] {
				continue
			}
			seen[a.String()] = true
			ips = append(ips, net.IP(a.AsSlice()))
			continue
		}
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		if !validDNSName(h) {
			return nil, fmt.Errorf("certgen: %s: host %q is neither an IP address nor a DNS name", name, h)
		}
		if seen[h] {
			continue
		}
		seen[h] = true
		dns = append(dns, h)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: key: %w", name, err)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	validity := ca.LeafValidity
	if validity <= 0 {
		validity = Validity
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-skew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IPAddresses:           ips,
		DNSNames:              dns,
		URIs:                  uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: certificate: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: certificate: %w", name, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certgen: %s: key: %w", name, err)
	}
	return &Leaf{Cert: cert, Key: key, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", kder)}, nil
}

// TLSCertificate is the leaf as a tls.Certificate.
func (l *Leaf) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{l.Cert.Raw}, PrivateKey: l.Key, Leaf: l.Cert}
}

// WriteFiles writes ca's certificate as dir/CAFile and each leaf as
// dir/CertFile(name) and dir/KeyFile(name), creating dir (mode 0700) if
// it does not exist. Key files get mode 0600, certificates 0644; each
// file is replaced atomically.
func WriteFiles(dir string, ca *CA, leaves map[string]*Leaf) error {
	for name := range leaves {
		if !validFileName(name) {
			return fmt.Errorf("certgen: certificate name %q: want a file name (no path separators, not starting with '.')", name)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	if ca != nil {
		if err := writeFile(dir, CAFile, ca.PEM, 0o644); err != nil {
			return err
		}
	}
	for name, l := range leaves {
		if err := writeFile(dir, CertFile(name), l.CertPEM, 0o644); err != nil {
			return err
		}
		if err := writeFile(dir, KeyFile(name), l.KeyPEM, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes data as dir/name with mode perm: under a temporary
// name (created 0600), then renamed over name.
func writeFile(dir, name string, data []byte, perm os.FileMode) error {
	return writeFileMode(dir, name, data, perm, true)
}

// writeFileMode is writeFile, which replaces an existing dir/name only
// if replace: else the temporary file is hard-linked as name (which
// fails with ErrExists if name exists) and removed.
func writeFileMode(dir, name string, data []byte, perm os.FileMode, replace bool) (err error) {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && replace {
		err = os.Rename(tmp, filepath.Join(dir, name))
	} else if err == nil {
		if err = os.Link(tmp, filepath.Join(dir, name)); errors.Is(err, fs.ErrExist) {
			err = ErrExists
		}
		os.Remove(tmp)
	}
	if err != nil {
		return fmt.Errorf("certgen: write %s: %w", filepath.Join(dir, name), err)
	}
	return nil
}

// serial is a random positive 128-bit serial number.
func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certgen: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil // never 0
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// validDNSName reports whether s is a DNS name of letters, digits and
// hyphens in dot-separated labels (a leading "*." allowed).
func validDNSName(s string) bool {
	s = strings.TrimPrefix(s, "*.")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// validFileName reports whether name can be a file name in a directory.
func validFileName(name string) bool {
	return name != "" && !strings.HasPrefix(name, ".") && !strings.ContainsAny(name, `/\`) && name == filepath.Base(name)
}
