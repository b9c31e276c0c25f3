package validate

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnit runs systemd-analyze verify on the unit. verify also
// checks that ExecStart's binary exists and is executable, and
// /usr/local/bin/questd is not installed here: the test verifies a copy
// whose ExecStart names the questd just built, the one change. verify
// exits 0 on unknown keys and bad values (it only warns), so any output
// at all fails the test.
func TestSystemdUnit(t *testing.T) {
	analyze := lookTool(t, "systemd-analyze")
	const unit = "../systemd/questd.service"
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	const bin = "ExecStart=/usr/local/bin/questd "
	if !strings.Contains(string(b), bin) {
		t.Fatalf("%s: no %q", unit, bin)
	}
	for _, want := range []string{
		"DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes", "NoNewPrivileges=yes",
		"PrivateTmp=yes", "RestrictAddressFamilies=", "CapabilityBoundingSet=\n",
		"MemoryDenyWriteExecute=yes", "StateDirectory=questd", "--config /etc/questd/questd.yaml",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s: no %q", unit, strings.TrimSpace(want))
		}
	}
	copyPath := filepath.Join(t.TempDir(), "questd.service")
	s := strings.Replace(string(b), bin, "ExecStart="+questd(t)+" ", 1)
	if err := os.WriteFile(copyPath, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", copyPath).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify %s (ExecStart pointed at the built questd): %v\n%s", unit, err, out)
	}
}

// TestSystemdExecStart checks the unit's questd command line: its flags
// parse, and with the example config (deploy/config/questd.yaml, the file
// the unit installs as /etc/questd/questd.yaml) questd starts.
func TestSystemdExecStart(t *testing.T) {
	b, err := os.ReadFile("../systemd/questd.service")
	if err != nil {
		t.Fatal(err)
	}
	var line string
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "ExecStart=") {
			line = strings.TrimPrefix(lines[i], "ExecStart=")
			for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
				i++
				line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(lines[i])
			}
			break
		}
	}
	args := strings.Fields(line)[1:]
	cfg := readConfig(t, mustRead(t, "../config/questd.yaml"))
	for k, v := range argsConfig(args) {
		cfg[k] = v // flags take precedence over the file
	}
	checkSecure(t, "questd.service with ../config/questd.yaml", cfg)
	// Every file flag reads a credential (%d/NAME) that a LoadCredential=
	// line loads: the files stay root-only in /etc/questd.
	creds := map[string]bool{}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "LoadCredential="); ok {
			name, _, _ := strings.Cut(v, ":")
			creds[name] = true
		}
	}
	for _, flag := range fileFlags {
		v, _ := cfg[flag].(string)
		if v == "" {
			continue
		}
		name, ok := strings.CutPrefix(v, "%d/")
		if !ok {
			t.Errorf("ExecStart --%s %s: want a credential, %%d/NAME (DynamicUser cannot read root-only files)", flag, v)
		} else if !creds[name] {
			t.Errorf("ExecStart --%s %s: no LoadCredential=%s:...", flag, v, name)
		}
	}
	// The specifiers: %d the credentials directory, %t the runtime root.
	// systemd writes credentials mode 0400, owned by the service's user.
	files := newTestFiles(t)
	dir := t.TempDir()
	for name := range creds {
		src := files.byKey(name)
		if src == "" {
			t.Errorf("LoadCredential=%s: no test file for that name", name)
			continue
		}
		writeSecret(t, src, filepath.Join(dir, name), 0o400)
	}
	runtime := t.TempDir()
	os.Mkdir(filepath.Join(runtime, "questd"), 0o755)
	for i, a := range args {
		a = strings.ReplaceAll(a, "%d", dir)
		a = strings.ReplaceAll(a, "%t", runtime)
		if a == "/etc/questd/questd.yaml" {
			a = "../config/questd.yaml"
		}
		args[i] = a
	}
	checkFlags(t, args)
	var local []string
	for _, flag := range []string{"grpc-addr", "gossip-addr", "metrics-addr"} {
		if v, ok := cfg[flag].(string); ok && v != "" {
			local = append(local, "--"+flag+"="+localPort(t, flag, v))
		}
	}
	runQuestd(t, append(append(args, local...), "--join="), nil)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
