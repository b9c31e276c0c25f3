package main

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
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

// TestUpGossipKey: the gossip key up writes is a base64 line that
// decodes to 32 random bytes (an AES-256 memberlist key), in a file only
// its owner reads; a second key differs from the first, and replaces it.
func TestUpGossipKey(t *testing.T) {
	dir := t.TempDir()
	read := func() []byte {
		t.Helper()
		path, err := writeGossipKey(dir)
		if err != nil {
			t.Fatal(err)
		}
		if path != filepath.Join(dir, "gossip.key") {
			t.Errorf("path %s", path)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v, %v: want 0600", fi.Mode(), err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(b), "\n") || strings.Count(string(b), "\n") != 1 {
			t.Errorf("want one line: %q", b)
		}
		k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(k) != 32 {
			t.Fatalf("key %q: %d bytes, %v: want 32", b, len(k), err)
		}
		return k
	}
	a, b := read(), read()
	if bytes.Equal(a, b) {
		t.Errorf("two keys are equal: %x", a)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files left behind: %v", ents)
	}
}
