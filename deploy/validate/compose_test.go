package validate

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The compose file's fields that deploy/compose uses (the Compose
// Specification's names); anything else in the file fails the strict
// decode, so a typo such as ipv4_adress cannot pass unnoticed.
type composeFile struct {
	Name     string                     `json:"name"`
	Services map[string]composeService  `json:"services"`
	Networks map[string]composeNetwork  `json:"networks"`
	Volumes  map[string]json.RawMessage `json:"volumes"` // named volumes (null: the defaults)
}

type composeService struct {
	Build           *composeBuild                   `json:"build"`
	Image           string                          `json:"image"`
	Hostname        string                          `json:"hostname"`
	Entrypoint      []string                        `json:"entrypoint"`
	Command         []string                        `json:"command"`
	NetworkMode     string                          `json:"network_mode"`
	Environment     map[string]string               `json:"environment"`
	Ports           []string                        `json:"ports"`
	Volumes         []string                        `json:"volumes"`
	Restart         string                          `json:"restart"`
	StopGracePeriod string                          `json:"stop_grace_period"`
	Healthcheck     *composeHealthcheck             `json:"healthcheck"`
	DependsOn       json.RawMessage                 `json:"depends_on"` // a list, or a map of conditions
	Networks        json.RawMessage                 `json:"networks"`   // a list, or a map of attachments
	networks        map[string]*composeAttachment   // Networks, decoded
	dependsOn       map[string]composeDependsOnWhen // DependsOn, decoded
}

type composeBuild struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile"`
	Target     string `json:"target"`
}

type composeHealthcheck struct {
	Test          []string `json:"test"`
	Interval      string   `json:"interval"`
	Timeout       string   `json:"timeout"`
	Retries       int      `json:"retries"`
	StartPeriod   string   `json:"start_period"`
	StartInterval string   `json:"start_interval"`
}

type composeAttachment struct {
	IPv4Address string `json:"ipv4_address"`
}

type composeDependsOnWhen struct {
	Condition string `json:"condition"`
}

type composeNetwork struct {
	IPAM struct {
		Config []struct {
			Subnet  string `json:"subnet"`
			IPRange string `json:"ip_range"`
		} `json:"config"`
	} `json:"ipam"`
}

func strictJSON(t *testing.T, what string, js []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: strict decode: %v", what, err)
	}
}

const composeDir = "../compose"

// readCompose strict-decodes the compose file. Top-level x- keys
// (extension fields, the source of YAML anchors) are dropped first; merge
// keys (<<) are resolved by the YAML decoder.
func readCompose(t *testing.T) composeFile {
	t.Helper()
	b := mustRead(t, filepath.Join(composeDir, "docker-compose.yml"))
	js, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		t.Fatal(err)
	}
	for k := range top {
		if strings.HasPrefix(k, "x-") {
			delete(top, k)
		}
	}
	js, _ = json.Marshal(top)
	var f composeFile
	strictJSON(t, "docker-compose.yml", js, &f)
	for name, s := range f.Services {
		if len(s.Networks) > 0 {
			var list []string
			if json.Unmarshal(s.Networks, &list) == nil {
				s.networks = map[string]*composeAttachment{}
				for _, n := range list {
					s.networks[n] = nil
				}
			} else {
				strictJSON(t, "services."+name+".networks", s.Networks, &s.networks)
			}
		}
		if len(s.DependsOn) > 0 {
			var list []string
			if json.Unmarshal(s.DependsOn, &list) == nil {
				s.dependsOn = map[string]composeDependsOnWhen{}
				for _, n := range list {
					s.dependsOn[n] = composeDependsOnWhen{Condition: "service_started"}
				}
			} else {
				strictJSON(t, "services."+name+".depends_on", s.DependsOn, &s.dependsOn)
			}
		}
		f.Services[name] = s
	}
	return f
}

// flagValue returns the value of --name=V in args ("" if absent).
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func TestCompose(t *testing.T) {
	f := readCompose(t)
	var questds []string
	for name, s := range f.Services {
		if strings.HasPrefix(name, "questd-") {
			questds = append(questds, name)
		}
		for dep := range s.dependsOn {
			if _, ok := f.Services[dep]; !ok {
				t.Errorf("%s depends_on %s: no such service", name, dep)
			}
		}
		for n := range s.networks {
			if _, ok := f.Networks[n]; !ok {
				t.Errorf("%s: network %s not defined", name, n)
			}
		}
		if s.Build != nil {
			ctx := filepath.Join(composeDir, s.Build.Context)
			if _, err := os.Stat(filepath.Join(ctx, s.Build.Dockerfile)); err != nil {
				t.Errorf("%s: build dockerfile: %v", name, err)
			}
			if _, err := os.Stat(filepath.Join(ctx, "go.mod")); err != nil {
				t.Errorf("%s: build context %s is not the repository root: %v", name, s.Build.Context, err)
			}
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			switch {
			case strings.HasPrefix(src, "."):
				if _, err := os.Stat(filepath.Join(composeDir, src)); err != nil {
					t.Errorf("%s: volume %s: %v", name, v, err)
				}
			case !strings.HasPrefix(src, "/"):
				if _, ok := f.Volumes[src]; !ok {
					t.Errorf("%s: volume %s: no top-level volume %q", name, v, src)
				}
			}
		}
	}
	slices.Sort(questds)
	if !slices.Equal(questds, []string{"questd-0", "questd-1", "questd-2"}) {
		t.Fatalf("questd services %v: want questd-0..2", questds)
	}

	// Static addresses: in the subnet, outside the dynamic ip_range,
	// distinct, and each node's --advertise.
	var subnet, dynamic netip.Prefix
	for _, n := range f.Networks {
		for _, c := range n.IPAM.Config {
			subnet, _ = netip.ParsePrefix(c.Subnet)
			dynamic, _ = netip.ParsePrefix(c.IPRange)
		}
	}
	if !subnet.IsValid() {
		t.Fatal("no network with an ipam subnet: questd's --advertise needs a static IP per node")
	}
	seen := map[netip.Addr]string{}
	for _, name := range questds {
		s := f.Services[name]
		if s.Build == nil || s.Healthcheck == nil || s.Image == "" {
			t.Errorf("%s: want build, image and healthcheck (from the x-questd anchor)", name)
		}
		if s.Hostname != name || flagValue(s.Command, "name") != name {
			t.Errorf("%s: hostname %q, --name %q: want both %q", name, s.Hostname, flagValue(s.Command, "name"), name)
		}
		var ip netip.Addr
		for _, a := range s.networks {
			if a != nil {
				ip, _ = netip.ParseAddr(a.IPv4Address)
			}
		}
		switch {
		case !ip.IsValid():
			t.Errorf("%s: no ipv4_address", name)
		case !subnet.Contains(ip):
			t.Errorf("%s: %v outside the subnet %v", name, ip, subnet)
		case dynamic.IsValid() && dynamic.Contains(ip):
			t.Errorf("%s: %v inside ip_range %v, where other containers get addresses", name, ip, dynamic)
		case seen[ip] != "":
			t.Errorf("%s: %v also %s's", name, ip, seen[ip])
		}
		seen[ip] = name
		if adv := flagValue(s.Command, "advertise"); adv != ip.String() {
			t.Errorf("%s: --advertise %q, ipv4_address %v", name, adv, ip)
		}
		checkSecure(t, name, argsConfig(s.Command))
		if m := flagValue(s.Command, "metrics-addr"); m != "0.0.0.0:9464" {
			t.Errorf("%s: --metrics-addr %q: want 0.0.0.0:9464 (Prometheus scrapes it)", name, m)
		}
		join := strings.Split(flagValue(s.Command, "join"), ",")
		if !slices.Contains(join, "questd-0:7946") {
			t.Errorf("%s: --join %v: want questd-0:7946 (the seed)", name, join)
		}
		for _, j := range join {
			host, _, _ := strings.Cut(j, ":")
			if _, ok := f.Services[host]; !ok {
				t.Errorf("%s: --join %s: no such service", name, j)
			}
			if host == name && name != "questd-0" {
				t.Errorf("%s: --join lists itself: only the seed may (a node that reaches only itself starts a cluster of its own)", name)
			}
		}
	}

	// Prometheus scrapes every node's metrics port.
	var prom struct {
		Global        map[string]string `json:"global"`
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			MetricsPath   string `json:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	pjs, err := yaml.YAMLToJSON(mustRead(t, filepath.Join(composeDir, "prometheus.yml")))
	if err != nil {
		t.Fatal(err)
	}
	strictJSON(t, "prometheus.yml", pjs, &prom)
	var targets []string
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	for _, name := range questds {
		if !slices.Contains(targets, name+":9464") {
			t.Errorf("prometheus.yml: no target %s:9464", name)
		}
	}

	// The secrets: made by the one-shot service that runs gen-secrets.sh
	// into a named volume, before any node starts; every node mounts the
	// volume read-only where its secret flags point.
	secretsDir, secretsVol := checkComposeSecrets(t, f, questds)
	gen := t.TempDir()
	genSecrets(t, gen)

	// Every node's command line parses, and runs: alone (without --join,
	// whose names resolve only on the compose network), on free ports of
	// the same hosts, with its real --advertise and the files
	// gen-secrets.sh made (their modes as it sets them); its healthcheck's
	// questctl (the client certificate, the token) must pass against it.
	for _, name := range questds {
		t.Run(name, func(t *testing.T) {
			s := f.Services[name]
			if !slices.Contains(s.Volumes, secretsVol+":"+secretsDir+":ro") {
				t.Errorf("%s: volumes %v: want %s:%s:ro (the secrets, read-only)", name, s.Volumes, secretsVol, secretsDir)
			}
			local := func(a string) string {
				if a == secretsDir {
					return gen
				}
				return strings.ReplaceAll(a, secretsDir+"/", gen+"/")
			}
			args := s.Command
			for _, flag := range fileFlags {
				if v := flagValue(args, flag); v != "" && !strings.HasPrefix(v, secretsDir+"/") {
					t.Errorf("%s: --%s=%s: not in the secrets volume's %s", name, flag, v, secretsDir)
				}
			}
			checkFlags(t, args)
			// Its certificate names it: the others place ranks on a
			// member only when its gRPC certificate carries
			// questrt://node/NAME for its gossip name.
			if v := flagValue(args, "tls-cert"); v != "" {
				if uris, want := certURIs(t, local(v)), "questrt://node/"+flagValue(args, "name"); !slices.Equal(uris, []string{want}) {
					t.Errorf("%s: --tls-cert=%s carries the URI SANs %q, want [%s]", name, v, uris, want)
				}
			}
			var run []string
			for _, a := range args {
				if !strings.HasPrefix(a, "--join=") {
					run = append(run, local(a))
				}
			}
			for _, flag := range []string{"grpc-addr", "gossip-addr", "metrics-addr"} {
				if v := flagValue(args, flag); v != "" {
					run = append(run, "--"+flag+"="+localPort(t, flag, v))
				}
			}
			runQuestdThen(t, run, nil, func(ready map[string]string) {
				hc := s.Healthcheck.Test
				if len(hc) < 2 || hc[0] != "CMD" || hc[1] != "/usr/local/bin/questctl" {
					t.Fatalf("%s: healthcheck %q: want [CMD /usr/local/bin/questctl ...]", name, hc)
				}
				_, port, _ := net.SplitHostPort(ready["grpc"])
				var hargs []string
				for _, a := range hc[2:] {
					if a == "127.0.0.1:7070" {
						a = net.JoinHostPort("127.0.0.1", port)
					}
					hargs = append(hargs, local(a))
				}
				out, err := exec.Command(questctl(t), hargs...).CombinedOutput()
				if err != nil {
					t.Errorf("%s: healthcheck questctl %s: %v\n%s", name, strings.Join(hargs, " "), err, lastLines(string(out), 5))
				}
			})
		})
	}
}

// checkComposeSecrets finds the service that runs gen-secrets.sh and the
// named volume it writes, and checks that every node waits for it to
// complete. It returns the path the nodes mount the volume at (where
// their secret flags point) and the volume's name.
func checkComposeSecrets(t *testing.T, f composeFile, questds []string) (dir, vol string) {
	t.Helper()
	var gen string
	for name, s := range f.Services {
		if slices.ContainsFunc(s.Volumes, func(v string) bool { return strings.HasPrefix(v, "./gen-secrets.sh:") }) {
			gen = name
		}
	}
	if gen == "" {
		t.Fatal("no service mounts ./gen-secrets.sh: the nodes' TLS files, gossip key and token have no maker")
	}
	s := f.Services[gen]
	cmd := append(append([]string{}, s.Entrypoint...), s.Command...)
	var out string
	for i, a := range cmd {
		if strings.HasSuffix(a, "gen-secrets.sh") && i+1 < len(cmd) {
			out = cmd[i+1]
		}
	}
	for _, v := range s.Volumes {
		src, dst, _ := strings.Cut(v, ":")
		if dst == out && !strings.HasPrefix(src, ".") && !strings.HasPrefix(src, "/") {
			vol = src
		}
	}
	if vol == "" {
		t.Fatalf("%s: %q writes to %q, which is no named volume's mount (volumes %v)", gen, cmd, out, s.Volumes)
	}
	checkGenSecretsQuestctl(t, gen, s)
	if s.Environment["SECRETS_OWNER"] != "65532:65532" {
		t.Errorf("%s: SECRETS_OWNER %q: want 65532:65532, the image's user (questd reads the 0400 keys as their owner)", gen, s.Environment["SECRETS_OWNER"])
	}
	for _, name := range questds {
		n := f.Services[name]
		if n.dependsOn[gen].Condition != "service_completed_successfully" {
			t.Errorf("%s: depends_on %s: %q, want service_completed_successfully (the secrets exist before the node starts)", name, gen, n.dependsOn[gen].Condition)
		}
		for _, v := range n.Volumes {
			if src, rest, _ := strings.Cut(v, ":"); src == vol {
				dir, _, _ = strings.Cut(rest, ":")
			}
		}
	}
	if dir == "" {
		t.Fatalf("no node mounts the volume %s", vol)
	}
	return dir, vol
}

// checkGenSecretsQuestctl: the service gen (s) that runs gen-secrets.sh
// gives it a questctl its image holds: QUESTCTL names a file the stage
// it builds (build.target of the Dockerfile) writes with go build -o.
func checkGenSecretsQuestctl(t *testing.T, gen string, s composeService) {
	t.Helper()
	q := s.Environment["QUESTCTL"]
	if s.Build == nil || s.Build.Target == "" || q == "" {
		t.Errorf("%s: build target %v, QUESTCTL %q: want the image's build stage and its questctl (gen-secrets.sh makes the certificates with questctl tls)", gen, s.Build, q)
		return
	}
	df := mustRead(t, filepath.Join(composeDir, s.Build.Context, s.Build.Dockerfile))
	var stage, out string
	for _, line := range strings.Split(string(df), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && strings.EqualFold(f[0], "FROM") && strings.EqualFold(f[2], "AS") {
			stage = f[3]
		}
		if stage == s.Build.Target && slices.Contains(f, "-o") && slices.Contains(f, "./cmd/questctl") {
			out = f[slices.Index(f, "-o")+1]
		}
	}
	if out == "" || (q != out && q != strings.TrimSuffix(out, "/")+"/questctl") {
		t.Errorf("%s: QUESTCTL %q: stage %q of %s builds questctl into %q", gen, q, s.Build.Target, s.Build.Dockerfile, out)
	}
}

// genSecrets runs gen-secrets.sh into dir (without SECRETS_OWNER: the
// files stay the test's) with this checkout's questctl and an openssl
// on PATH that fails (it needs none), and checks the modes of what it
// wrote, the certificates' roles and the gossip key; a second run keeps
// them.
func genSecrets(t *testing.T, dir string) {
	t.Helper()
	sh := lookTool(t, "sh")
	fake := t.TempDir()
	if err := os.WriteFile(filepath.Join(fake, "openssl"), []byte("#!/bin/sh\necho gen-secrets.sh ran openssl >&2\nexit 97\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	q := questctl(t)
	run := func() {
		cmd := exec.Command(sh, filepath.Join(composeDir, "gen-secrets.sh"), dir)
		cmd.Env = append(os.Environ(), "SECRETS_OWNER=", "QUESTCTL="+q, "PATH="+fake+string(os.PathListSeparator)+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gen-secrets.sh: %v\n%s", err, out)
		}
	}
	run()
	before := mustRead(t, filepath.Join(dir, "token"))
	for _, name := range []string{"ca.pem", "questd-0.pem", "questd-0.key", "questd-1.pem", "questd-1.key", "questd-2.pem", "questd-2.key", "client.pem", "client.key", "gossip.key", "token"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("gen-secrets.sh: %v", err)
		}
		if strings.HasSuffix(name, ".key") || name == "token" {
			if !secretModeOK(fi.Mode().Perm()) {
				t.Errorf("gen-secrets.sh: %s mode %04o: questd refuses it", name, fi.Mode().Perm())
			}
		}
	}
	if uris := certURIs(t, filepath.Join(dir, "client.pem")); !slices.Equal(uris, []string{"questrt://client/client"}) {
		t.Errorf("gen-secrets.sh: client.pem carries the URI SANs %q, want [questrt://client/client] (the client API only)", uris)
	}
	for i := range 3 {
		name := fmt.Sprintf("questd-%d", i)
		if uris := certURIs(t, filepath.Join(dir, name+".pem")); !slices.Equal(uris, []string{"questrt://node/" + name}) {
			t.Errorf("gen-secrets.sh: %s.pem carries the URI SANs %q, want [questrt://node/%s]", name, uris, name)
		}
	}
	if key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(mustRead(t, filepath.Join(dir, "gossip.key"))))); err != nil || len(key) != 32 {
		t.Errorf("gen-secrets.sh: gossip.key: %d bytes (%v), want base64 of 32", len(key), err)
	}
	run()
	if !bytes.Equal(before, mustRead(t, filepath.Join(dir, "token"))) {
		t.Error("gen-secrets.sh: a second run replaced the token: a restart must keep the cluster's secrets")
	}
}

// certURIs returns the URI SANs of the PEM certificate in file.
func certURIs(t *testing.T, file string) []string {
	t.Helper()
	blk, _ := pem.Decode(mustRead(t, file))
	if blk == nil {
		t.Fatalf("%s: no PEM block", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []string
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	return out
}
