package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
)

// The completions API's defences beyond the bearer token (http_auth.go):
// TLS from --http-tls-cert and --http-tls-key (reloaded on SIGHUP), the
// /admin endpoints kept to loopback clients when there is no token,
// cross-origin requests only from --allowed-origins, warnings at start
// when the API is reachable beyond loopback in plaintext or without a
// token, and secret files that other users can read refused.

// looseSecretBits are the permission bits a secret file (a key or a
// token) must not have: anything for other users, or write for the
// group. Group read is allowed, as Kubernetes mounts Secrets (0440 with
// fsGroup).
const looseSecretBits = 0o027

// checkSecretMode refuses a secret file that other users can read or
// change (or, for writing, its group): one line naming the mode and the
// fix.
func checkSecretMode(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if m := fi.Mode().Perm(); m&looseSecretBits != 0 {
		return fmt.Errorf("mode %04o lets other users read or change it: chmod 600 (or 640 or 440 for a group questd runs in)", m)
	}
	return nil
}

// httpCert serves the completions API's certificate, read from its files
// at start and again on reload (SIGHUP); a failed reload keeps the
// certificate in use.
type httpCert struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// newHTTPCert reads --http-tls-cert and --http-tls-key.
func newHTTPCert(certFile, keyFile string) (*httpCert, error) {
	c := &httpCert{certFile: certFile, keyFile: keyFile}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the files again.
func (c *httpCert) reload() error {
	if err := checkSecretMode(c.keyFile); err != nil {
		return &fileError{"http-tls-key", c.keyFile, unwrapPath(err)}
	}
	cert, err := loadKeyPair("http-tls-cert", c.certFile, "http-tls-key", c.keyFile)
	if err != nil {
		return err
	}
	c.cur.Store(&cert)
	return nil
}

// tlsConfig is the server's TLS configuration: TLS 1.2 and up, HTTP/2
// and HTTP/1.1, the current certificate at each handshake.
func (c *httpCert) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cur.Load(), nil
		},
	}
}

// loopbackHost reports whether addr (host:port) listens on loopback
// only: a loopback IP or "localhost". An empty host, 0.0.0.0 or [::]
// listen everywhere.
func loopbackHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// warnExposure logs, at start, what anyone who reaches the completions
// API beyond loopback could do: read every request in plaintext (no
// --http-tls-cert) and use the API and its /admin endpoints (no
// --token-file).
func warnExposure(addr string, tlsOn, token bool, log *slog.Logger) {
	if loopbackHost(addr) {
		return
	}
	if !tlsOn {
		log.Warn("the completions API serves plaintext HTTP beyond loopback: prompts, outputs and the bearer token cross the network readable; set --http-tls-cert and --http-tls-key", "http_addr", addr)
	}
	if !token {
		log.Warn("the completions API has no --token-file: anyone who reaches it can run requests (the /admin endpoints answer loopback clients only)", "http_addr", addr)
	}
}

// adminLoopback wraps the API so that, without a token, the /admin
// endpoints (recent prompts and outputs) answer loopback clients only:
// others get 403 in OpenAI's error shape. With a token, requireToken
// guards them and h is returned unchanged.
func adminLoopback(token string, h http.Handler) http.Handler {
	if token != "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/admin") && !remoteLoopback(r.RemoteAddr) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":{"message":"the /admin endpoints answer loopback clients only when questd has no --token-file","type":"invalid_request_error","param":null,"code":"forbidden"}}` + "\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func remoteLoopback(remote string) bool {
	ap, err := netip.ParseAddrPort(remote)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// corsHeaders are the request headers a cross-origin request may send:
// what the OpenAI clients send.
const corsHeaders = "Authorization, Content-Type, OpenAI-Organization, OpenAI-Project, X-Stainless-Arch, X-Stainless-Lang, X-Stainless-OS, X-Stainless-Package-Version, X-Stainless-Retry-Count, X-Stainless-Runtime, X-Stainless-Runtime-Version, X-Stainless-Timeout"

// allowOrigins wraps h for cross-origin requests from browsers: a
// request whose Origin is one of origins ("*": any) gets
// Access-Control-Allow-Origin, and its preflight (OPTIONS with
// Access-Control-Request-Method) is answered 204 here, before the token
// check (browsers send no credentials on a preflight). Other origins get
// no CORS headers (the browser then refuses the answer) and their
// preflights 403. No origins returns h unchanged.
func allowOrigins(origins []string, h http.Handler) http.Handler {
	if len(origins) == 0 {
		return h
	}
	all := slices.Contains(origins, "*")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Add("Vary", "Origin")
		ok := all || slices.Contains(origins, origin)
		preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
		if preflight {
			if !ok {
				w.WriteHeader(http.StatusForbidden)
				return
			}
			w.Header().Set("Access-Control-Allow-Origin", origin)
			w.Header().Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
			w.Header().Set("Access-Control-Allow-Headers", corsHeaders)
			w.Header().Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if ok {
			w.Header().Set("Access-Control-Allow-Origin", origin)
		}
		h.ServeHTTP(w, r)
	})
}

// checkOrigin accepts "*" or an origin as browsers send it:
// scheme://host[:port], http or https, nothing after.
func checkOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	switch {
	case err != nil:
		return fmt.Errorf("not an origin: %v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want an origin scheme://host[:port] with scheme http or https, or *")
	case u.Host == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return errors.New("want an origin scheme://host[:port] and nothing after it (no path), or *")
	}
	return nil
}

// unwrapPath drops the *fs.PathError around an error (the flag's message
// names the path already).
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
