package certgen

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/questrt/questrt/internal/readlimit"
)

// CAKeyFile is the name of the CA key's file that WriteCA writes (an
// operator's CA, questctl tls ca; WriteFiles never writes a CA key).
const CAKeyFile = "ca.key"

// ErrExists means a file WriteCA or WriteLeaf would write is already
// there and force was not given: nothing was written.
var ErrExists = errors.New("certgen: file exists")

// ErrBadCA means a CA certificate or key that LoadCA read is not a CA
// this package can sign with: no PEM block, not a CA certificate, not an
// ECDSA key, or a key that is not the certificate's.
var ErrBadCA = errors.New("certgen: bad CA")

// NewCAFor is NewCA with the CA valid for validity (positive) instead of
// Validity. Leaves it issues are valid for ca.LeafValidity.
func NewCAFor(name string, validity time.Duration) (*CA, error) {
	if validity <= 0 {
		return nil, fmt.Errorf("certgen: CA validity %v: want a positive duration", validity)
	}
	return makeCA(name, validity)
}

// KeyPEM is the CA's private key as a PEM "PRIVATE KEY" (PKCS #8). Who
// holds it can sign certificates the cluster trusts.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA key: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

// ParseCA reads a CA from its certificate and key in PEM (as WriteCA
// writes them): the certificate must be a CA's, the key an ECDSA key
// (PKCS #8, or SEC 1 "EC PRIVATE KEY" as openssl writes) matching it.
// Errors wrap ErrBadCA.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	blk, _ := pem.Decode(certPEM)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: no PEM certificate", ErrBadCA)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: certificate: %v", ErrBadCA, err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%w: certificate %q is not a CA's (no CA basic constraint or no certificate-signing key usage)", ErrBadCA, cert.Subject.CommonName)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("%w: no PEM key", ErrBadCA)
	}
	var key *ecdsa.PrivateKey
	switch kb.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: key: %v", ErrBadCA, err)
		}
		var ok bool
		if key, ok = k.(*ecdsa.PrivateKey); !ok {
			return nil, fmt.Errorf("%w: key is %T, want ECDSA", ErrBadCA, k)
		}
	case "EC PRIVATE KEY":
		if key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
			return nil, fmt.Errorf("%w: key: %v", ErrBadCA, err)
		}
	default:
		return nil, fmt.Errorf("%w: key PEM block %q, want PRIVATE KEY or EC PRIVATE KEY", ErrBadCA, kb.Type)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("%w: the key is not the certificate's", ErrBadCA)
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(blk), Key: key}, nil
}

// LoadCA reads dir/CAFile and dir/CAKeyFile with ParseCA.
func LoadCA(dir string) (*CA, error) {
	c, err := readlimit.ReadFile(filepath.Join(dir, CAFile), readlimit.MaxPEMFile)
	if err != nil {
		return nil, fmt.Errorf("certgen: %w", err)
	}
	k, err := readlimit.ReadFile(filepath.Join(dir, CAKeyFile), readlimit.MaxPEMFile)
	if err != nil {
		return nil, fmt.Errorf("certgen: %w", err)
	}
	ca, err := ParseCA(c, k)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, dir)
	}
	return ca, nil
}

// WriteCA writes ca's certificate as dir/CAFile (mode 0644) and its key
// as dir/CAKeyFile (0600), creating dir (0700) if needed. Unless force,
// it refuses (ErrExists, nothing written) when either file exists.
func WriteCA(dir string, ca *CA, force bool) error {
	key, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	return writeSet(dir, []file{{CAFile, ca.PEM, 0o644}, {CAKeyFile, key, 0o600}}, force)
}

// WriteLeaf writes leaf name as dir/CertFile(name) (0644) and
// dir/KeyFile(name) (0600), creating dir (0700) if needed. Unless
// force, it refuses (ErrExists, nothing written) when either file
// exists. name must be a file name, and not "ca" (whose files are the
// CA's).
func WriteLeaf(dir, name string, l *Leaf, force bool) error {
	if !validFileName(name) || name == "ca" {
		return fmt.Errorf("certgen: certificate name %q: want a file name (no path separators, not starting with '.', not \"ca\")", name)
	}
	return writeSet(dir, []file{{CertFile(name), l.CertPEM, 0o644}, {KeyFile(name), l.KeyPEM, 0o600}}, force)
}

// file is one file of a set writeSet writes.
type file struct {
	name string
	data []byte
	perm os.FileMode
}

// writeSet writes files in dir, each atomically. Unless force it first
// checks that none exists, and writes each without replacing (a file
// that appears meanwhile fails the write with ErrExists).
func writeSet(dir string, files []file, force bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	if !force {
		for _, f := range files {
			p := filepath.Join(dir, f.name)
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("%w: %s (give --force to replace it)", ErrExists, p)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("certgen: %w", err)
			}
		}
	}
	for _, f := range files {
		if err := writeFileMode(dir, f.name, f.data, f.perm, force); err != nil {
			return err
		}
	}
	return nil
}
