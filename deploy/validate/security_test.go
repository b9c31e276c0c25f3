package validate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Every deployment ships secure: mutual TLS on gRPC, an encrypted gossip
// layer and a bearer token on the client API (issue 28 item 3), each from
// a secret file questd accepts. checkSecure checks a node's effective
// settings; the tests of each deployment then run questd with secret
// files of the modes the deployment gives them.

// looseSecretBits are the mode bits questd refuses on a secret file
// (cmd/questd/http_security.go: anything for other users, write for the
// group); TestSecretModeRule checks that the built questd agrees.
const looseSecretBits fs.FileMode = 0o027

// secretModeOK reports whether questd accepts a secret file of mode m.
func secretModeOK(m fs.FileMode) bool { return m&looseSecretBits == 0 }

// secretFlags are questd's flags that name a secret file (their modes
// are checked); tls-cert, tls-ca and http-tls-cert are public.
var secretFlags = []string{"tls-key", "gossip-key-file", "token-file", "http-tls-key"}

// fileFlags are questd's flags that name a TLS, gossip key or token file.
var fileFlags = []string{"tls-cert", "tls-key", "tls-ca", "gossip-key-file", "token-file", "http-tls-cert", "http-tls-key"}

// checkSecure fails when a node's settings (config keys and flags, flag
// names without "--") lack TLS, the gossip key or the token, run gRPC
// without TLS, or serve the completions API without HTTPS.
func checkSecure(t *testing.T, what string, cfg map[string]any) {
	t.Helper()
	for _, k := range []string{"insecure", "plaintext"} {
		if on, ok := cfg[k]; ok && on != false && on != "false" {
			t.Errorf("%s: %s=%v: gRPC must run mutual TLS", what, k, on)
		}
	}
	want := []string{"tls-cert", "tls-key", "tls-ca", "gossip-key-file", "token-file"}
	if v, _ := cfg["http-addr"].(string); v != "" {
		want = append(want, "http-tls-cert", "http-tls-key")
	}
	for _, k := range want {
		if v, _ := cfg[k].(string); v == "" {
			t.Errorf("%s: no %s: every deployment ships with TLS, a gossip key and a token", what, k)
		}
	}
}

// argsConfig reads --name=value and --name value flags as a config map
// (a flag without a value is true).
func argsConfig(args []string) map[string]any {
	cfg := map[string]any{}
	for i := 0; i < len(args); i++ {
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			continue
		}
		if k, v, ok := strings.Cut(name, "="); ok {
			cfg[k] = v
		} else if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			cfg[name] = args[i+1]
			i++
		} else {
			cfg[name] = true
		}
	}
	return cfg
}

// writeSecret copies the test file src to dst with mode (dst's directory
// is created).
func writeSecret(t *testing.T, src, dst string, mode fs.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil { // below the umask too
		t.Fatal(err)
	}
}

// TestSecretModeRule runs the built questd with a token file of modes
// secretModeOK refuses: questd must refuse each with exit status 2 and a
// line naming the mode, so the mode checks of the deployments test what
// questd does. (The accepted modes, 0600, 0440 and 0400, are what the
// deployments' tests start questd with.)
func TestSecretModeRule(t *testing.T) {
	files := newTestFiles(t)
	for _, mode := range []fs.FileMode{0o644, 0o604, 0o660, 0o620, 0o444} {
		t.Run(fmt.Sprintf("%04o", mode), func(t *testing.T) {
			if secretModeOK(mode) {
				t.Fatalf("secretModeOK(%04o): want false", mode)
			}
			tok := filepath.Join(t.TempDir(), "token")
			writeSecret(t, files.token, tok, mode)
			ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, questd(t), "--insecure", "--grpc-addr=127.0.0.1:0",
				"--gossip-addr=127.0.0.1:0", "--metrics-addr=", "--token-file="+tok)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("questd --token-file (mode %04o): %v, want exit status 2:\n%s", mode, err, lastLines(string(out), 5))
			}
			if want := fmt.Sprintf("%04o", mode); !strings.Contains(string(out), want) {
				t.Errorf("questd --token-file (mode %04o): the refusal does not name %s:\n%s", mode, want, lastLines(string(out), 5))
			}
		})
	}
	for _, mode := range []fs.FileMode{0o600, 0o640, 0o440, 0o400} {
		if !secretModeOK(mode) {
			t.Errorf("secretModeOK(%04o): want true", mode)
		}
	}
}
