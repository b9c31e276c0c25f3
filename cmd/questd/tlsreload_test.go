//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/internal/testcert"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// tlsFiles are the paths of --tls-cert, --tls-key and --tls-ca.
type tlsFiles struct{ cert, key, ca string }

func newTLSFiles(t *testing.T) tlsFiles {
	d := t.TempDir()
	return tlsFiles{cert: filepath.Join(d, "node.pem"), key: filepath.Join(d, "node.key"), ca: filepath.Join(d, "ca.pem")}
}

// write puts a certificate called name of ca, and the CA bundle cas, in
// the files.
func (f tlsFiles) write(t *testing.T, ca *testcert.CA, name string, cas ...*testcert.CA) {
	t.Helper()
	c, k := ca.IssuePEM(t, name)
	var bundle []byte
	for _, a := range cas {
		bundle = append(bundle, a.PEM...)
	}
	for path, b := range map[string][]byte{f.cert: c, f.key: k, f.ca: bundle} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// handshake runs one TLS handshake between server and client configs
// over a loopback connection, and returns the common names each side saw
// of the other (and the first error).
func handshake(t *testing.T, server, client *tls.Config) (serverCN, clientCN string, err error) {
	t.Helper()
	return handshakeName(t, server, client, "127.0.0.1")
}

// handshakeName is handshake with the client dialling serverName (as
// gRPC sets it: the host of the address dialled).
func handshakeName(t *testing.T, server, client *tls.Config, serverName string) (serverCN, clientCN string, err error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	type side struct {
		cn  string
		err error
	}
	srv := make(chan side, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			srv <- side{err: err}
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			srv <- side{err: err}
			return
		}
		// Under TLS 1.3 the client learns of a refused client
		// certificate on its first read: answer one byte.
		tc.Write([]byte{1})
		cs := tc.ConnectionState()
		srv <- side{cn: cs.PeerCertificates[0].Subject.CommonName}
	}()
	cc := client.Clone()
	cc.ServerName = serverName
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", lis.Addr().String(), cc)
	if err == nil {
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		if err == nil {
			serverCN = conn.ConnectionState().PeerCertificates[0].Subject.CommonName
		}
	}
	s := <-srv
	if err == nil {
		err = s.err
	}
	return serverCN, s.cn, err
}

// TestCertReloader: the reloading tls.Config presents, as server and as
// client, the certificate of the last successful reload, and verifies
// clients against its CA; a reload from bad files fails and keeps the
// old material; new handshakes see each change.
func TestCertReloader(t *testing.T) {
	ca := testcert.NewCA(t, "ca-1")
	files := newTLSFiles(t)
	files.write(t, ca, "v1", ca)
	rl, err := newCertReloader("node", files.cert, files.key, files.ca)
	if err != nil {
		t.Fatal(err)
	}
	node := rl.config()
	// A peer with a fixed certificate of ca, trusting ca.
	pc, pk := ca.IssuePEM(t, "peer")
	peerCert, err := tls.X509KeyPair(pc, pk)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	peer := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{peerCert}, RootCAs: pool,
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}

	check := func(step, want string) {
		t.Helper()
		// The node as server.
		srvCN, cliCN, err := handshake(t, node, peer)
		if err != nil || srvCN != want || cliCN != "peer" {
			t.Errorf("%s: node as server presents %q (peer %q, %v), want %q", step, srvCN, cliCN, err, want)
		}
		// The node as client.
		srvCN, cliCN, err = handshake(t, peer, node)
		if err != nil || cliCN != want || srvCN != "peer" {
			t.Errorf("%s: node as client presents %q (peer %q, %v), want %q", step, cliCN, srvCN, err, want)
		}
	}
	check("start", "v1")

	files.write(t, ca, "v2", ca)
	check("files changed, no reload", "v1")
	if err := rl.reload(); err != nil {
		t.Fatal(err)
	}
	check("reloaded", "v2")

	// Bad files: the reload fails, naming the flag, and the node keeps v2.
	for _, bad := range []struct {
		name, path, text, want string
	}{
		{"garbage certificate", files.cert, "not PEM\n", "--tls-cert"},
		{"missing key", files.key, "", "--tls-key"},
		{"empty CA", files.ca, "", "--tls-ca"},
	} {
		files.write(t, ca, "v3", ca)
		if bad.text == "" && bad.path == files.key {
			os.Remove(bad.path)
		} else if err := os.WriteFile(bad.path, []byte(bad.text), 0o600); err != nil {
			t.Fatal(err)
		}
		err := rl.reload()
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: reload: %v, want an error naming %s", bad.name, err, bad.want)
		}
		check(bad.name+": old material kept", "v2")
	}

	// A new CA: after the reload the node as server accepts a client
	// certificate of it, and refuses it before.
	ca2 := testcert.NewCA(t, "ca-2")
	c2, k2 := ca2.IssuePEM(t, "peer2")
	peer2Cert, err := tls.X509KeyPair(c2, k2)
	if err != nil {
		t.Fatal(err)
	}
	peer2 := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{peer2Cert}, RootCAs: pool}
	if _, _, err := handshake(t, node, peer2); err == nil {
		t.Error("a client of ca-2 accepted before the reload")
	}
	files.write(t, ca, "v4", ca, ca2)
	if err := rl.reload(); err != nil {
		t.Fatal(err)
	}
	if srvCN, cliCN, err := handshake(t, node, peer2); err != nil || srvCN != "v4" || cliCN != "peer2" {
		t.Errorf("a client of ca-2 after the reload: %q %q %v", srvCN, cliCN, err)
	}
	check("new CA bundle", "v4")
}

// TestSIGHUPReloads runs questd (run) with mutual TLS: SIGHUP reloads the
// certificates and logs it, a SIGHUP with a bad file logs the error, and
// neither stops the daemon; the end of ctx then drains and run returns 0.
func TestSIGHUPReloads(t *testing.T) {
	ca := testcert.NewCA(t, "ca")
	files := newTLSFiles(t)
	files.write(t, ca, "v1", ca)
	args := append([]string{"--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca, "--metrics-addr", ""}, smallNode[1:]...)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, args, envOf(nil), pw, &stderr)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	if err != nil || !strings.Contains(line, `"event":"ready"`) {
		cancel()
		t.Fatalf("ready line %q, %v (exit %d); stderr:\n%s", line, err, <-done, stderr.String())
	}
	waitLog := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(stderr.String(), what) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log:\n%s", what, stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	files.write(t, ca, "v2", ca)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("reloaded TLS certificates")
	waitLog("CN=v2")
	// A new gRPC connection gets the new certificate.
	var ready struct{ GRPC string }
	if err := json.Unmarshal([]byte(line), &ready); err != nil {
		t.Fatal(err)
	}
	cc, ck := ca.IssuePEM(t, "client")
	cert, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	var seen *x509.Certificate
	creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool,
		VerifyConnection: func(cs tls.ConnectionState) error { seen = cs.PeerCertificates[0]; return nil }})
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	c, err := client.Dial(dctx, ready.GRPC, client.Options{Creds: creds})
	dcancel()
	if err != nil {
		t.Fatalf("dial after the reload: %v", err)
	}
	c.Close()
	if seen == nil || seen.Subject.CommonName != "v2" {
		t.Errorf("after the reload the node presents %v, want v2", seen)
	}
	if err := os.WriteFile(files.cert, []byte("bad"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("keeping the old ones")
	select {
	case code := <-done:
		t.Fatalf("questd exited %d after SIGHUP", code)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCertReloaderOutgoingCA: as client, the node verifies servers
// against the CA of the last reload, not the one it started with: a peer
// with a certificate of a new CA is refused before the reload that
// brings the new CA (and the node's certificate of it) and accepted
// after, while a peer of the old CA, no longer in --tls-ca, is refused;
// a DNS name dialled is still checked against the peer's certificate.
func TestCertReloaderOutgoingCA(t *testing.T) {
	ca1, ca2 := testcert.NewCA(t, "ca-1"), testcert.NewCA(t, "ca-2")
	files := newTLSFiles(t)
	files.write(t, ca1, "v1", ca1)
	rl, err := newCertReloader("node", files.cert, files.key, files.ca)
	if err != nil {
		t.Fatal(err)
	}
	node := rl.config()
	// Servers that check their clients against their own CA (the old
	// peer against both).
	both := x509.NewCertPool()
	both.AddCert(ca1.Cert)
	both.AddCert(ca2.Cert)
	newPeer := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{ca2.Issue(t, "peer-2")},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca2.Pool}
	oldPeer := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{ca1.Issue(t, "peer-1")},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: both}

	if _, _, err := handshake(t, newPeer, node); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("before the reload: dialling a peer of ca-2: %v, want unknown authority", err)
	}
	if srvCN, cliCN, err := handshake(t, oldPeer, node); err != nil || srvCN != "peer-1" || cliCN != "v1" {
		t.Errorf("before the reload: dialling a peer of ca-1: %q %q %v", srvCN, cliCN, err)
	}

	files.write(t, ca2, "v2", ca2)
	if err := rl.reload(); err != nil {
		t.Fatal(err)
	}
	if srvCN, cliCN, err := handshake(t, newPeer, node); err != nil || srvCN != "peer-2" || cliCN != "v2" {
		t.Errorf("after the reload: dialling a peer of ca-2: server %q, node presents %q, %v; want peer-2, v2", srvCN, cliCN, err)
	}
	if _, _, err := handshake(t, oldPeer, node); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("after the reload: dialling a peer of ca-1 (no longer trusted): %v, want unknown authority", err)
	}
	// The peer's certificate names 127.0.0.1 only.
	if _, _, err := handshakeName(t, newPeer, node, "localhost"); err == nil || !strings.Contains(err.Error(), "localhost") {
		t.Errorf("dialling localhost, a name the peer's certificate lacks: %v, want a name mismatch", err)
	}
	// A client certificate is not a server's: a peer presenting a leaf
	// without server authentication is refused.
	clientOnly := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{issueClientOnly(t, ca2, "client-only")}}
	if _, _, err := handshake(t, clientOnly, node); err == nil || !strings.Contains(err.Error(), "key usage") {
		t.Errorf("a server certificate without server authentication: %v, want a key usage error", err)
	}
}

// issueClientOnly signs a leaf of ca for client authentication only.
func issueClientOnly(t *testing.T, ca *testcert.CA, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestReloadedCAOutgoingCluster: a node started with a certificate and
// CA of ca-1, then reloaded with a certificate and CA of ca-2, works with
// a node of ca-2 alone: CP 2 sequences created through either node (so
// each dials the other's worker API, and each hosts a rank that dials
// the other's collective listener) append and step.
func TestReloadedCAOutgoingCluster(t *testing.T) {
	ca1, ca2 := testcert.NewCA(t, "ca-1"), testcert.NewCA(t, "ca-2")
	files := newTLSFiles(t)
	files.write(t, ca1, "a-1", ca1)
	rl, err := newCertReloader("node", files.cert, files.key, files.ca)
	if err != nil {
		t.Fatal(err)
	}
	nodes := nodetest.Start(t, "rot", 2, nodetest.Geometry(2, 1, plan.Exact), func(i int, c *node.Config) {
		c.Plaintext, c.TLS = false, rl.config()
		if i == 1 {
			c.TLS = ca2.MutualTLS(ca2.Issue(t, "b"))
		}
	})
	files.write(t, ca2, "a-2", ca2)
	if err := rl.reload(); err != nil {
		t.Fatal(err)
	}

	creds := credentials.NewTLS(ca2.MutualTLS(ca2.Issue(t, "client")))
	for _, via := range nodes {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		c, err := client.Dial(ctx, via.Addr(), client.Options{Creds: creds})
		if err != nil {
			cancel()
			t.Fatalf("dial %s: %v", via.Name(), err)
		}
		// Each node refused the other while their CAs differed (before
		// the reload); a refusal is checked again after the vetter's
		// retry interval (5 s), so placement may keep both ranks on the
		// node asked until then.
		var id string
		var on []string
		for {
			id, on, err = c.Create(ctx, plan.Striped)
			if err != nil {
				c.Close()
				cancel()
				t.Fatalf("create through %s: %v", via.Name(), err)
			}
			if len(on) == 2 && on[0] != on[1] || ctx.Err() != nil {
				break
			}
			if err := c.Release(ctx, id); err != nil {
				t.Fatalf("release through %s: %v", via.Name(), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if len(on) != 2 || on[0] == on[1] {
			t.Errorf("create through %s: ranks on %v, want both nodes", via.Name(), on)
		}
		g := c.Geometry()
		kv, qd := g.KVHeads*g.HeadDim, g.QHeads*g.HeadDim
		const tokens = 20
		for l := range g.Layers {
			if err := c.Append(ctx, id, l, make([]float32, tokens*kv), make([]float32, tokens*kv)); err != nil {
				t.Fatalf("append through %s: %v", via.Name(), err)
			}
		}
		for l := range g.Layers {
			res, err := c.Step(ctx, l, []client.Item{{Seq: id, Q: ones(qd), K: ones(kv), V: ones(kv)}}, client.StepOptions{})
			if err != nil {
				t.Fatalf("step through %s, layer %d: %v", via.Name(), l, err)
			}
			if len(res.O) != qd {
				t.Fatalf("step through %s, layer %d: %d outputs, want %d", via.Name(), l, len(res.O), qd)
			}
		}
		if err := c.Release(ctx, id); err != nil {
			t.Errorf("release through %s: %v", via.Name(), err)
		}
		c.Close()
		cancel()
	}
}

func ones(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	return v
}
