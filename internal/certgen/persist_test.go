package certgen

import (
	"bytes"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/identity"
)

// TestWriteLoadCA: a CA written by WriteCA and read back by LoadCA signs
// leaves that verify against the original CA certificate; its key file
// is 0600; a second write is refused without force and leaves the files
// as they were, and replaces them with force.
func TestWriteLoadCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	ca, err := NewCAFor("op CA", 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got := ca.Cert.NotAfter.Sub(ca.Cert.NotBefore); got < 30*24*time.Hour || got > 30*24*time.Hour+skew+time.Second {
		t.Errorf("CA valid %v, want 30 days", got)
	}
	if err := WriteCA(dir, ca, false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, CAKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: %v, %v; want mode 0600", fi.Mode(), err)
	}
	back, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Cert.Equal(ca.Cert) || !back.Key.Equal(ca.Key) {
		t.Fatal("LoadCA: not the CA written")
	}
	back.LeafValidity = 48 * time.Hour
	l, err := back.IssueRole(identity.Node, "n1", "n1.example")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Cert.NotAfter.Sub(l.Cert.NotBefore); got < 48*time.Hour || got > 48*time.Hour+skew+time.Second {
		t.Errorf("leaf valid %v, want 48h", got)
	}
	if _, err := l.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "n1.example"}); err != nil {
		t.Errorf("leaf of the loaded CA does not verify against the original: %v", err)
	}

	old, _ := os.ReadFile(filepath.Join(dir, CAFile))
	other, _ := NewCA("other")
	if err := WriteCA(dir, other, false); !errors.Is(err, ErrExists) {
		t.Fatalf("second WriteCA without force: %v, want ErrExists", err)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, CAFile)); !bytes.Equal(now, old) {
		t.Fatal("a refused WriteCA changed ca.pem")
	}
	if err := WriteCA(dir, other, true); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, CAFile)); !bytes.Equal(now, other.PEM) {
		t.Fatal("WriteCA with force did not replace ca.pem")
	}
}

// TestWriteLeaf: keys 0600, certificates 0644; refused without force if
// either file exists (the other then not created); the name "ca" and
// path-like names refused.
func TestWriteLeaf(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "c")
	l := issue(t, ca, "n")
	if err := WriteLeaf(dir, "n", l, false); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"n.pem": 0o644, "n.key": 0o600} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want %v", name, fi.Mode(), err, want)
		}
	}
	if err := WriteLeaf(dir, "n", l, false); !errors.Is(err, ErrExists) {
		t.Errorf("rewrite: %v, want ErrExists", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "m.key"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteLeaf(dir, "m", l, false); !errors.Is(err, ErrExists) {
		t.Errorf("key exists: %v, want ErrExists", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "m.pem")); err == nil {
		t.Error("a refused WriteLeaf wrote m.pem")
	}
	if err := WriteLeaf(dir, "n", l, true); err != nil {
		t.Errorf("force: %v", err)
	}
	for _, bad := range []string{"ca", "../x", ".hidden", "a/b", ""} {
		if err := WriteLeaf(dir, bad, l, true); err == nil {
			t.Errorf("WriteLeaf name %q accepted", bad)
		}
	}
}

// TestParseCARefuses: a leaf as a CA, a key that is not the
// certificate's, and garbage are refused with ErrBadCA.
func TestParseCARefuses(t *testing.T) {
	ca := newCA(t, "c")
	other := newCA(t, "o")
	l := issue(t, ca, "n")
	key, _ := ca.KeyPEM()
	otherKey, _ := other.KeyPEM()
	for name, tc := range map[string][2][]byte{
		"leaf":        {l.CertPEM, l.KeyPEM},
		"wrong key":   {ca.PEM, otherKey},
		"no cert":     {[]byte("x"), key},
		"no key":      {ca.PEM, []byte("x")},
		"cert as key": {ca.PEM, ca.PEM},
	} {
		if _, err := ParseCA(tc[0], tc[1]); !errors.Is(err, ErrBadCA) {
			t.Errorf("%s: %v, want ErrBadCA", name, err)
		}
	}
	if _, err := ParseCA(ca.PEM, key); err != nil {
		t.Errorf("good CA: %v", err)
	}
}
