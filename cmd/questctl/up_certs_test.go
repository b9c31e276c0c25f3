package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/questrt/questrt/internal/certgen"
	"github.com/questrt/questrt/internal/identity"
)

// TestUpCertRoles: up issues its nodes node certificates
// (questrt://node/NAME) and its client a client certificate
// (questrt://client/client).
func TestUpCertRoles(t *testing.T) {
	dir := t.TempDir()
	if err := writeUpCerts(dir, "q", 2); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]identity.Identity{
		"q-0":        {Role: identity.Node, Name: "q-0"},
		"q-1":        {Role: identity.Node, Name: "q-1"},
		upClientName: {Role: identity.Client, Name: upClientName},
	} {
		b, err := os.ReadFile(filepath.Join(dir, certgen.CertFile(name)))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			t.Fatalf("%s: no PEM", name)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if id, err := identity.Of(c); err != nil || id != want {
			t.Errorf("%s: identity %+v (%v), want %+v", name, id, err, want)
		}
	}
}
