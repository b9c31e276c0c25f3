package validate

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// repoRoot is the main module's root, relative to this package.
const repoRoot = "../.."

// readyTimeout bounds the wait for questd's ready line.
const readyTimeout = 10 * time.Second

var (
	buildOnce sync.Once
	questdBin string
	buildErr  error
)

// questd returns the path of a questd built once from this checkout.
func questd(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "questd-validate-")
		if err != nil {
			buildErr = err
			return
		}
		questdBin = filepath.Join(dir, "questd")
		cmd := exec.Command("go", "build", "-o", questdBin, "./cmd/questd")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/questd: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return questdBin
}

var (
	questctlOnce sync.Once
	questctlBin  string
	questctlErr  error
)

// questctl returns the path of a questctl built once from this checkout
// (beside questd).
func questctl(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(questd(t))
	questctlOnce.Do(func() {
		questctlBin = filepath.Join(dir, "questctl")
		cmd := exec.Command("go", "build", "-o", questctlBin, "./cmd/questctl")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			questctlErr = fmt.Errorf("go build ./cmd/questctl: %v\n%s", err, out)
		}
	})
	if questctlErr != nil {
		t.Fatal(questctlErr)
	}
	return questctlBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if questdBin != "" {
		os.RemoveAll(filepath.Dir(questdBin))
	}
	os.Exit(code)
}

// runQuestd starts questd with args and env (on top of a clean
// environment: no QUESTRT_* from the caller), waits for its ready line,
// then sends SIGTERM to its PID and waits for exit status 0. A config
// questd refuses exits 2 before the ready line, with the key or flag
// named on stderr: that is the failure reported.
func runQuestd(t *testing.T, args []string, env map[string]string) {
	t.Helper()
	runQuestdThen(t, args, env, nil)
}

// runQuestdThen is runQuestd that calls then, when not nil, with the
// ready line's fields while questd runs (before the SIGTERM).
func runQuestdThen(t *testing.T, args []string, env map[string]string, then func(ready map[string]string)) {
	t.Helper()
	cmd := exec.Command(questd(t), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUESTRT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"event":"ready"`) {
				ready <- sc.Text()
			}
		}
		close(ready)
	}()
	select {
	case line, ok := <-ready:
		if !ok {
			err := cmd.Wait()
			t.Fatalf("questd %s: exited before its ready line (%v):\n%s", strings.Join(args, " "), err, stderr.String())
		}
		var ev map[string]string
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev["grpc"] == "" || ev["gossip"] == "" {
			t.Errorf("questd: ready line %q: want grpc and gossip addresses", line)
		}
		t.Logf("questd ready: %s", line)
		if then != nil {
			then(ev)
		}
	case <-time.After(readyTimeout):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("questd %s: no ready line within %v:\n%s", strings.Join(args, " "), readyTimeout, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("questd after SIGTERM: %v:\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Errorf("questd: still running 20s after SIGTERM:\n%s", stderr.String())
	}
}

// checkFlags runs `questd ARGS --help`: the flag package parses every
// flag before --help, so an unknown flag or a value that does not parse
// exits 2. It does not run questd's cross checks (runQuestd does).
func checkFlags(t *testing.T, args []string) {
	t.Helper()
	cmd := exec.Command(questd(t), append(append([]string{}, args...), "--help")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("questd %s --help: %v:\n%s", strings.Join(args, " "), err, lastLines(string(out), 5))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// testFiles are a CA, a node certificate and key for 127.0.0.1 signed by
// it, a gossip key file and a token file, written to a test's directory
// with mode 0600.
type testFiles struct {
	cert, key, ca, gossipKey, token string
}

// byKey returns the file that a Secret or credential key names: the
// names of deploy/README.md (cert-manager's tls.crt, tls.key, ca.crt;
// gossip.key, token) and questctl up's (ca.pem, NAME.pem, NAME.key), or
// "" for a name it does not know.
func (f testFiles) byKey(name string) string {
	switch {
	case name == "tls.crt":
		return f.cert
	case name == "tls.key":
		return f.key
	case name == "ca.crt" || name == "ca.pem":
		return f.ca
	case name == "gossip.key":
		return f.gossipKey
	case name == "token":
		return f.token
	case strings.HasSuffix(name, ".pem"):
		return f.cert
	case strings.HasSuffix(name, ".key"):
		return f.key
	}
	return ""
}

func newTestFiles(t *testing.T) testFiles {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "questrt-validate-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	nodeKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	nodeTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "questd"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	nodeDER, err := x509.CreateCertificate(rand.Reader, nodeTmpl, caTmpl, &nodeKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	f := testFiles{
		cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"),
		ca: filepath.Join(dir, "ca.crt"), gossipKey: filepath.Join(dir, "gossip.key"),
		token: filepath.Join(dir, "token"),
	}
	gk := make([]byte, 32)
	rand.Read(gk)
	tok := make([]byte, 32)
	rand.Read(tok)
	for path, b := range map[string][]byte{
		f.cert:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: nodeDER}),
		f.key:       pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		f.ca:        pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		f.gossipKey: []byte(base64.StdEncoding.EncodeToString(gk) + "\n"),
		f.token:     []byte(fmt.Sprintf("%x\n", tok)),
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// localPort returns addr (host:port) with port 0, keeping the host: the
// file's listen host is what is tested, on a free port.
func localPort(t *testing.T, flag, addr string) string {
	t.Helper()
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--%s %q: %v", flag, addr, err)
	}
	return net.JoinHostPort(h, "0")
}

// localOverrides are the command-line flags that make a questd config
// meant for a cluster run alone on this machine: the listen addresses on
// free ports (same hosts), no join, and the files (TLS, gossip key, ready
// file) replaced by test ones. cfg is the config's keys and values; keys
// not named here keep the file's values.
func localOverrides(t *testing.T, cfg map[string]any) []string {
	t.Helper()
	files := newTestFiles(t)
	args := listenOverrides(t, cfg)
	if p, _ := cfg["plaintext"].(bool); !p {
		args = append(args, "--tls-cert="+files.cert, "--tls-key="+files.key, "--tls-ca="+files.ca)
	}
	if _, ok := cfg["gossip-key-file"]; ok {
		args = append(args, "--gossip-key-file="+files.gossipKey)
	}
	if _, ok := cfg["token-file"]; ok {
		args = append(args, "--token-file="+files.token)
	}
	if _, ok := cfg["http-tls-cert"]; ok {
		args = append(args, "--http-tls-cert="+files.cert, "--http-tls-key="+files.key)
	}
	return args
}

// listenOverrides are the part of localOverrides that keeps the files:
// the listen addresses on free ports (same hosts), no join, and the
// ready file and data dir in test directories.
func listenOverrides(t *testing.T, cfg map[string]any) []string {
	t.Helper()
	var args []string
	for _, flag := range []string{"grpc-addr", "gossip-addr", "metrics-addr", "http-addr"} {
		if v, ok := cfg[flag].(string); ok && v != "" {
			args = append(args, "--"+flag+"="+localPort(t, flag, v))
		}
	}
	// An empty --join on the command line replaces the file's list.
	args = append(args, "--join=")
	if _, ok := cfg["ready-file"]; ok {
		args = append(args, "--ready-file="+filepath.Join(t.TempDir(), "ready"))
	}
	if _, ok := cfg["data-dir"]; ok {
		args = append(args, "--data-dir="+filepath.Join(t.TempDir(), "data"))
	}
	return args
}

// errSkip marks a missing tool.
var errSkip = errors.New("tool missing")

func lookTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed: %v (%v)", name, errSkip, err)
	}
	return p
}
