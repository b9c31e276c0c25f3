package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/questrt/questrt/internal/certgen"
)

// TestSecretModes: secret files other users can read or change, or
// whose group can write them, are refused at start with one line naming
// the flag, the file and its mode; owner-only and group-read files are
// taken. Missing files are reported where they are read, as before.
func TestSecretModes(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o400, true}, {0o640, true}, {0o440, true}, {0o644, false}, {0o604, false}, {0o620, false}, {0o666, false}} {
		p := filepath.Join(dir, "token-"+c.mode.String())
		if err := os.WriteFile(p, []byte("secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		_, err := load(t, nil, "--plaintext", "--token-file", p)
		switch {
		case c.ok && err != nil:
			t.Errorf("mode %04o refused: %v", c.mode, err)
		case !c.ok && err == nil:
			t.Errorf("mode %04o accepted", c.mode)
		case !c.ok:
			msg := err.Error()
			if !strings.Contains(msg, "--token-file") || !strings.Contains(msg, p) || !strings.Contains(msg, "chmod 600") || strings.Contains(msg, "\n") {
				t.Errorf("mode %04o: %q: want one line naming --token-file, the file and chmod 600", c.mode, msg)
			}
		}
	}
	gk := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(gk, []byte("AAAAAAAAAAAAAAAAAAAAAA==\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := load(t, nil, "--plaintext", "--gossip-key-file", gk); err == nil || !strings.Contains(err.Error(), "--gossip-key-file") {
		t.Errorf("a world-readable gossip key: %v", err)
	}
	if _, err := load(t, nil, "--plaintext", "--token-file", filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a missing token file: %v", err)
	}
}

// TestHTTPSecurityFlags: the HTTPS and CORS flags' refusals.
func TestHTTPSecurityFlags(t *testing.T) {
	m := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-tls-cert", "c.pem"}, "--http-tls-cert"},
		{[]string{"--http-tls-key", "k.pem", "--http-tls-cert", "c.pem"}, "needs --http-addr"},
		{[]string{"--allowed-origins", "https://a.example"}, "needs --http-addr"},
		{[]string{"--model", m, "--http-addr", "127.0.0.1:0", "--allowed-origins", "a.example"}, "--allowed-origins"},
		{[]string{"--model", m, "--http-addr", "127.0.0.1:0", "--allowed-origins", "https://a.example/path"}, "no path"},
		{[]string{"--model", m, "--http-addr", "127.0.0.1:0", "--allowed-origins", "ftp://a.example"}, "http or https"},
	} {
		_, err := load(t, nil, append([]string{"--plaintext"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.want)
		}
	}
	c, err := load(t, nil, "--plaintext", "--model", m, "--http-addr", "127.0.0.1:0", "--allowed-origins", "https://a.example,http://localhost:3000", "--allowed-origins", "*")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Serve.AllowedOrigins, " "); got != "https://a.example http://localhost:3000 *" {
		t.Errorf("origins %q", got)
	}
}

// TestCORS: preflights from an allowed origin are answered before the
// token check, with the methods and the OpenAI clients' headers; other
// origins' preflights get 403 and their requests no CORS header; a
// request without Origin passes as before.
func TestCORS(t *testing.T) {
	reached := 0
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++; w.WriteHeader(http.StatusOK) })
	h := allowOrigins([]string{"https://app.example"}, requireToken("tok", api))
	do := func(method, origin, auth string, preflight bool) *http.Response {
		r := httptest.NewRequest(method, "/v1/completions", nil)
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		if preflight {
			r.Header.Set("Access-Control-Request-Method", "POST")
			r.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
	res := do(http.MethodOptions, "https://app.example", "", true)
	if res.StatusCode != http.StatusNoContent || res.Header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(res.Header.Get("Access-Control-Allow-Headers"), "Authorization") || !strings.Contains(res.Header.Get("Access-Control-Allow-Methods"), "POST") {
		t.Errorf("allowed preflight: %d %v", res.StatusCode, res.Header)
	}
	if res := do(http.MethodOptions, "https://evil.example", "", true); res.StatusCode != http.StatusForbidden || res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("other origin's preflight: %d %v", res.StatusCode, res.Header)
	}
	if res := do(http.MethodPost, "https://app.example", "tok", false); res.StatusCode != http.StatusOK || res.Header.Get("Access-Control-Allow-Origin") != "https://app.example" || res.Header.Get("Vary") != "Origin" {
		t.Errorf("allowed request: %d %v", res.StatusCode, res.Header)
	}
	if res := do(http.MethodPost, "https://app.example", "", false); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("allowed origin without the token: %d", res.StatusCode)
	}
	if res := do(http.MethodPost, "https://evil.example", "tok", false); res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("other origin got %v", res.Header)
	}
	before := reached
	if res := do(http.MethodPost, "", "tok", false); res.StatusCode != http.StatusOK || reached != before+1 || res.Header.Get("Vary") != "" {
		t.Errorf("no origin: %d %v", res.StatusCode, res.Header)
	}
	if res := allowOrigins([]string{"*"}, api); true {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
		r.Header.Set("Origin", "https://any.example")
		res.ServeHTTP(w, r)
		if w.Result().Header.Get("Access-Control-Allow-Origin") != "https://any.example" {
			t.Errorf("* did not allow %v", w.Result().Header)
		}
	}
}

// TestAdminLoopback: without a token the /admin endpoints answer
// loopback clients only; the rest of the API anyone.
func TestAdminLoopback(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, c := range []struct {
		token, remote, path string
		want                int
	}{
		{"", "10.1.2.3:5000", "/admin/requests", http.StatusForbidden},
		{"", "10.1.2.3:5000", "/admin/requests/abc", http.StatusForbidden},
		{"", "127.0.0.1:5000", "/admin/requests", http.StatusOK},
		{"", "[::1]:5000", "/admin/requests", http.StatusOK},
		{"", "[::ffff:127.0.0.1]:5000", "/admin/requests", http.StatusOK},
		{"", "10.1.2.3:5000", "/v1/completions", http.StatusOK},
		{"tok", "10.1.2.3:5000", "/admin/requests", http.StatusOK}, // the token guards it (requireToken)
	} {
		r := httptest.NewRequest(http.MethodGet, c.path, nil)
		r.RemoteAddr = c.remote
		w := httptest.NewRecorder()
		adminLoopback(c.token, api).ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("token %q from %s %s: %d, want %d", c.token, c.remote, c.path, w.Code, c.want)
		}
	}
}

// TestExposureWarnings: beyond loopback, plaintext and a missing token
// are each warned about at start; on loopback, nothing.
func TestExposureWarnings(t *testing.T) {
	for _, c := range []struct {
		addr         string
		tls, token   bool
		plain, noTok bool
	}{
		{"0.0.0.0:8000", false, false, true, true},
		{"[::]:8000", true, false, false, true},
		{"10.0.0.5:8000", false, true, true, false},
		{"10.0.0.5:8000", true, true, false, false},
		{"127.0.0.1:8000", false, false, false, false},
		{"localhost:8000", false, false, false, false},
		{"[::1]:8000", false, false, false, false},
	} {
		var buf bytes.Buffer
		warnExposure(c.addr, c.tls, c.token, slog.New(slog.NewTextHandler(&buf, nil)))
		out := buf.String()
		if got := strings.Contains(out, "plaintext"); got != c.plain {
			t.Errorf("%s tls=%v: plaintext warning %v, want %v: %s", c.addr, c.tls, got, c.plain, out)
		}
		if got := strings.Contains(out, "no --token-file"); got != c.noTok {
			t.Errorf("%s token=%v: token warning %v, want %v: %s", c.addr, c.token, got, c.noTok, out)
		}
	}
}

// TestHTTPS serves a handler over HTTPS from certificate files, as
// --http-tls-cert and --http-tls-key do: a client that trusts the CA gets
// its answer over HTTP/2, a plaintext request gets no answer, and a
// reload after the files changed presents the new certificate to the
// next handshake.
func TestHTTPS(t *testing.T) {
	dir := t.TempDir()
	ca, err := certgen.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string) (string, string) {
		leaf, err := ca.Issue(name)
		if err != nil {
			t.Fatal(err)
		}
		c, k := filepath.Join(dir, "api.pem"), filepath.Join(dir, "api.key")
		if err := os.WriteFile(c, leaf.CertPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(k, leaf.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	certFile, keyFile := write("first")
	cert, err := newHTTPCert(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	hc := defaultHTTPServerConfig()
	hc.TLS = cert.tlsConfig()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := startHTTP("completions", "http-addr", "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}), hc, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.shutdown(ctx)
	}()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}, ForceAttemptHTTP2: true,
	}}
	get := func() (string, string) {
		t.Helper()
		res, err := client.Get("https://" + s.addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b), res.TLS.PeerCertificates[0].Subject.CommonName
	}
	if proto, cn := get(); proto != "HTTP/2.0" || cn != "first" {
		t.Errorf("got %s from %q, want HTTP/2.0 from first", proto, cn)
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	if res, err := plain.Get("http://" + s.addr + "/"); err == nil {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusOK && strings.HasPrefix(string(b), "HTTP/") {
			t.Errorf("plaintext request answered: %d %q", res.StatusCode, b)
		}
	}
	write("second")
	if err := cert.reload(); err != nil {
		t.Fatal(err)
	}
	client.CloseIdleConnections()
	if _, cn := get(); cn != "second" {
		t.Errorf("after reload the server presents %q, want second", cn)
	}
	// A reload that fails keeps the certificate in use.
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cert.reload(); err == nil {
		t.Error("a broken key reloaded")
	}
	client.CloseIdleConnections()
	if _, cn := get(); cn != "second" {
		t.Errorf("after a failed reload the server presents %q, want second", cn)
	}
}
