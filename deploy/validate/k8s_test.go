package validate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// manifests are the objects of one kustomize build, decoded.
type manifests struct {
	statefulSets []*appsv1.StatefulSet
	services     []*corev1.Service
	configMaps   []*corev1.ConfigMap
	pdbs         []*policyv1.PodDisruptionBudget
	monitors     []map[string]any
}

// kustomize runs kubectl kustomize on dir and strict-decodes every object.
func kustomize(t *testing.T, dir string) manifests {
	t.Helper()
	kubectl := lookTool(t, "kubectl")
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	var m manifests
	for i, doc := range splitDocs(out) {
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var tm struct{ APIVersion, Kind string }
		if err := json.Unmarshal(js, &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 StatefulSet":
			o := new(appsv1.StatefulSet)
			m.statefulSets, obj = append(m.statefulSets, o), o
		case "v1 Service":
			o := new(corev1.Service)
			m.services, obj = append(m.services, o), o
		case "v1 ConfigMap":
			o := new(corev1.ConfigMap)
			m.configMaps, obj = append(m.configMaps, o), o
		case "policy/v1 PodDisruptionBudget":
			o := new(policyv1.PodDisruptionBudget)
			m.pdbs, obj = append(m.pdbs, o), o
		case "monitoring.coreos.com/v1 ServiceMonitor":
			// A CRD: no Go type in k8s.io/api; checked by checkMonitor.
			var o map[string]any
			if err := json.Unmarshal(js, &o); err != nil {
				t.Fatal(err)
			}
			m.monitors = append(m.monitors, o)
			continue
		default:
			t.Errorf("document %d: %s %s: no type to check it against (add one to the test)", i, tm.APIVersion, tm.Kind)
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			t.Errorf("document %d (%s): strict decode: %v", i, tm.Kind, err)
		}
	}
	return m
}

// splitDocs splits a multi-document YAML stream on its --- lines.
func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func TestKustomizeBase(t *testing.T) {
	m := kustomize(t, "../k8s")
	checkCluster(t, m, false)
}

// TestKustomizeGPU builds an overlay of the base with the gpu component,
// as deploy/README.md tells users to (in a temporary directory: kustomize
// refuses an overlay inside its base).
func TestKustomizeGPU(t *testing.T) {
	dir := t.TempDir()
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(dir, a)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := fmt.Sprintf("resources:\n  - %s\ncomponents:\n  - %s\n", abs("../k8s"), abs("../k8s/gpu"))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	m := kustomize(t, dir)
	checkCluster(t, m, true)
}

// checkCluster checks the objects against each other and runs the pod's
// questd command line with the ConfigMap's config.
func checkCluster(t *testing.T, m manifests, gpu bool) {
	t.Helper()
	if len(m.statefulSets) != 1 || len(m.configMaps) != 1 || len(m.pdbs) != 1 || len(m.monitors) != 1 || len(m.services) != 2 {
		t.Fatalf("want 1 StatefulSet, 1 ConfigMap, 1 PDB, 1 ServiceMonitor, 2 Services; got %d, %d, %d, %d, %d",
			len(m.statefulSets), len(m.configMaps), len(m.pdbs), len(m.monitors), len(m.services))
	}
	ss, cm := m.statefulSets[0], m.configMaps[0]
	spec := ss.Spec.Template.Spec
	podLabels := labels.Set(ss.Spec.Template.Labels)
	if sel := labels.SelectorFromSet(ss.Spec.Selector.MatchLabels); !sel.Matches(podLabels) {
		t.Errorf("StatefulSet selector %v does not match its pod labels %v", sel, podLabels)
	}
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 3 {
		t.Errorf("StatefulSet replicas %v: want 3", ss.Spec.Replicas)
	}
	if ss.Spec.PodManagementPolicy != appsv1.OrderedReadyPodManagement {
		t.Errorf("podManagementPolicy %q: the join list relies on OrderedReady", ss.Spec.PodManagementPolicy)
	}

	// The headless Service names the pods for --join.
	var headless, metricsSvc *corev1.Service
	for _, s := range m.services {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless = s
		} else {
			metricsSvc = s
		}
	}
	if headless == nil || metricsSvc == nil {
		t.Fatal("want a headless Service and a metrics Service")
	}
	if ss.Spec.ServiceName != headless.Name {
		t.Errorf("StatefulSet serviceName %q: want the headless Service %q", ss.Spec.ServiceName, headless.Name)
	}
	if !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("headless Service %s: publishNotReadyAddresses must be true (a pod joins before it is ready)", headless.Name)
	}
	for _, s := range m.services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			t.Errorf("Service %s: selector %v does not select the pods", s.Name, s.Spec.Selector)
		}
	}
	if sel := labels.SelectorFromSet(m.pdbs[0].Spec.Selector.MatchLabels); !sel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget selector %v does not select the pods", sel)
	}

	if len(spec.Containers) != 1 {
		t.Fatalf("want 1 container, got %d", len(spec.Containers))
	}
	c := spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, s := range m.services {
		for _, p := range s.Spec.Ports {
			if _, ok := ports[p.TargetPort.String()]; !ok {
				t.Errorf("Service %s port %s: targetPort %s is no container port", s.Name, p.Name, p.TargetPort.String())
			}
		}
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		switch {
		case p == nil:
			t.Errorf("no %s probe", name)
		case p.HTTPGet != nil:
			if ports[p.HTTPGet.Port.String()] != 9464 {
				t.Errorf("%s probe on port %s: want the metrics port 9464", name, p.HTTPGet.Port.String())
			}
		case p.GRPC != nil:
		default:
			t.Errorf("%s probe: want httpGet (/healthz, /readyz) or grpc", name)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe path %q: want /readyz", c.ReadinessProbe.HTTPGet.Path)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("container: want cpu and memory requests")
	}
	gpus := c.Resources.Limits["nvidia.com/gpu"]
	if gpu != !gpus.IsZero() {
		t.Errorf("nvidia.com/gpu limit %v in the gpu=%v build", gpus.String(), gpu)
	}
	if gpu != strings.Contains(c.Image, "cuda") {
		t.Errorf("image %q in the gpu=%v build", c.Image, gpu)
	}

	// Env: the pod's IP as --advertise, its name as --name.
	env := map[string]string{}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "QUESTRT_") {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
				t.Errorf("env %s: want a downward-API fieldRef", e.Name)
				continue
			}
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["QUESTRT_ADVERTISE"] != "status.podIP" || env["QUESTRT_NAME"] != "metadata.name" {
		t.Errorf("env: want QUESTRT_ADVERTISE from status.podIP and QUESTRT_NAME from metadata.name, got %v", env)
	}

	// The config volume: the generated ConfigMap, mounted where --config
	// points; the Secrets where the config's file flags point; the node
	// certificate in the emptyDir that an init container writes.
	var configPath string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			configPath = v
		}
	}
	if configPath == "" {
		t.Fatalf("container args %q: no --config=FILE", c.Args)
	}
	mounts := mountsByVolume(c)
	vols := map[string]corev1.Volume{}
	var configKey string
	for _, v := range spec.Volumes {
		vols[v.Name] = v
		if v.ConfigMap != nil {
			if v.ConfigMap.Name != cm.Name {
				t.Errorf("volume %s: ConfigMap %q, want the generated %q", v.Name, v.ConfigMap.Name, cm.Name)
			}
			vm := mounts[v.Name]
			if vm.MountPath != configPath {
				t.Errorf("volume %s mounted at %q, --config is %q", v.Name, vm.MountPath, configPath)
			}
			configKey = vm.SubPath
		}
	}
	for _, pvc := range ss.Spec.VolumeClaimTemplates {
		vols[pvc.Name] = corev1.Volume{Name: pvc.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}}
	}
	secretMounts := checkSecretMounts(t, "questd", c, vols, spec.SecurityContext)
	checkNoCAKey(t, c, vols)
	if len(spec.InitContainers) != 1 {
		t.Fatalf("want 1 init container (the node certificate's), got %d", len(spec.InitContainers))
	}
	ic := spec.InitContainers[0]
	initSecrets := checkSecretMounts(t, "init container "+ic.Name, ic, vols, spec.SecurityContext)
	if gpu && strings.Contains(ic.Image, "cuda") {
		t.Errorf("init container %s: image %q: the CUDA image's questctl needs a GPU, which the init container has not", ic.Name, ic.Image)
	}
	text, ok := cm.Data[configKey]
	if !ok {
		t.Fatalf("ConfigMap %s: no key %q", cm.Name, configKey)
	}
	cfg := readConfig(t, []byte(text))
	checkSecure(t, "ConfigMap "+cm.Name, cfg)
	if v, _ := cfg["require-cert-roles"].(bool); !v {
		t.Errorf("config require-cert-roles %v: every pod has a role certificate, so refuse callers without one", cfg["require-cert-roles"])
	}
	// tls-cert and tls-key: files of the emptyDir the init container
	// writes and questd mounts read-only.
	certDir := ""
	for _, flag := range []string{"tls-cert", "tls-key"} {
		path, _ := cfg[flag].(string)
		dir := filepath.Dir(path)
		var vol string
		for name, vm := range mounts {
			if vm.MountPath == dir {
				vol = name
				if !vm.ReadOnly {
					t.Errorf("config %s %q: volume %s is mounted writable into questd; want readOnly", flag, path, name)
				}
			}
		}
		if v, ok := vols[vol]; !ok || v.EmptyDir == nil {
			t.Errorf("config %s %q: want a file of an emptyDir volume (the init container's node certificate), got volume %q", flag, path, vol)
			continue
		}
		initWrites := false
		for _, vm := range ic.VolumeMounts {
			initWrites = initWrites || (vm.Name == vol && !vm.ReadOnly)
		}
		if !initWrites {
			t.Errorf("config %s %q: the init container %s does not mount volume %s writable", flag, path, ic.Name, vol)
		}
		certDir = dir
	}
	for _, flag := range []string{"tls-ca", "gossip-key-file", "token-file"} {
		path, _ := cfg[flag].(string)
		want := flagSecretKey[flag]
		dir, key := filepath.Dir(path), filepath.Base(path)
		ok := false
		for _, sm := range secretMounts {
			ok = ok || (sm.dir == dir && key == want && sm.files[key] == want)
		}
		if !ok {
			t.Errorf("config %s %q: want the key %s of a Secret mounted at %s (mounts %v)", flag, path, want, dir, secretMounts)
		}
	}
	// --data-dir: a mount of one of the StatefulSet's claim templates
	// (each pod keeps its own claim across restarts), writable by the
	// pod's user (fsGroup).
	if dir, ok := cfg["data-dir"].(string); ok && dir != "" {
		var claim string
		for name, vm := range mounts {
			if vm.MountPath == dir && !vm.ReadOnly {
				claim = name
			}
		}
		found := false
		for _, pvc := range ss.Spec.VolumeClaimTemplates {
			found = found || (pvc.Name == claim && claim != "")
		}
		if !found {
			t.Errorf("config data-dir %q: not a writable mount of a volumeClaimTemplate (mounts %v)", dir, mounts)
		}
		if sc := spec.SecurityContext; sc == nil || sc.FSGroup == nil || sc.RunAsUser == nil || *sc.FSGroup != *sc.RunAsUser {
			t.Error("data-dir: the pod's fsGroup must be its user's, so that the claim is writable")
		}
	}
	join, _ := cfg["join"].([]any)
	var wantJoin []any
	for i := range int(*ss.Spec.Replicas) {
		wantJoin = append(wantJoin, fmt.Sprintf("%s-%d.%s:7946", ss.Name, i, headless.Name))
	}
	if !slices.Equal(join, wantJoin) {
		t.Errorf("config join %v: want every pod, %v", join, wantJoin)
	}

	// Every pod, run: under a test root standing for its /, the Secrets'
	// files as the kubelet writes them (the volume's keys or items, its
	// mode; the CA made with questctl tls ca), the init container's
	// command with the downward API's values (10.0.0.N standing for the
	// pod IP), then questd with the ConfigMap's file as --config, its env
	// likewise, on free ports of the same hosts. The certificate the init
	// container wrote must name the node questd says it runs as.
	caDir := t.TempDir()
	if out, err := exec.Command(questctl(t), "tls", "ca", "--dir", caDir).CombinedOutput(); err != nil {
		t.Fatalf("questctl tls ca: %v\n%s", err, out)
	}
	files := newTestFiles(t)
	src := func(secret, key string) string {
		if secret == "questd-ca" {
			return filepath.Join(caDir, key)
		}
		return files.byKey(key)
	}
	for i := range int(*ss.Spec.Replicas) {
		pod := map[string]string{
			"metadata.name": fmt.Sprintf("%s-%d", ss.Name, i), "metadata.namespace": "questrt",
			"status.podIP": fmt.Sprintf("10.0.0.%d", 5+i),
		}
		root := t.TempDir()
		for _, sm := range append(slices.Clone(initSecrets), secretMounts...) {
			for path, key := range sm.files {
				writeSecret(t, src(sm.secret, key), filepath.Join(root, sm.dir, path), sm.mode)
			}
		}
		ienv := podEnv(t, ic, pod)
		iargs := slices.Clone(ic.Args)
		for j, a := range iargs {
			a = expandEnv(a, ienv)
			for _, d := range []string{"--dir=", "--out="} {
				if v, ok := strings.CutPrefix(a, d); ok {
					a = d + filepath.Join(root, v)
				}
			}
			iargs[j] = a
		}
		if len(ic.Command) != 1 || filepath.Base(ic.Command[0]) != "questctl" {
			t.Fatalf("init container %s: command %q: want questctl", ic.Name, ic.Command)
		}
		if out, err := exec.Command(questctl(t), iargs...).CombinedOutput(); err != nil {
			t.Fatalf("pod %d: init container %s: questctl %s: %v\n%s", i, ic.Name, strings.Join(iargs, " "), err, out)
		}
		var lines []string
		for _, line := range strings.Split(text, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && slices.Contains(fileFlags, k) {
				line = k + ": " + filepath.Join(root, strings.TrimSpace(v))
			}
			lines = append(lines, line)
		}
		path := filepath.Join(t.TempDir(), "questd.yaml")
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		env := podEnv(t, c, pod)
		args := []string{}
		for _, a := range c.Args {
			a = expandEnv(a, env)
			if strings.HasPrefix(a, "--config=") {
				a = "--config=" + path
			}
			args = append(args, a)
		}
		checkFlags(t, args)
		qenv := map[string]string{}
		for k, v := range env {
			if strings.HasPrefix(k, "QUESTRT_") {
				qenv[k] = v
			}
		}
		cert := filepath.Join(root, certDir, filepath.Base(cfg["tls-cert"].(string)))
		runQuestdThen(t, append(args, listenOverrides(t, cfg)...), qenv, func(ready map[string]string) {
			if ready["name"] != pod["metadata.name"] {
				t.Errorf("pod %s: questd runs as %q, want the pod's name", pod["metadata.name"], ready["name"])
			}
			if got, want := certURIs(t, cert), []string{"questrt://node/" + ready["name"]}; !slices.Equal(got, want) {
				t.Errorf("pod %s: the init container's certificate names %q; questd runs as %q, so want %q", pod["metadata.name"], got, ready["name"], want)
			}
		})
	}
	checkMonitor(t, m.monitors[0], metricsSvc)
}

// secretKeys are the keys of the Secrets deploy/README.md has the
// operator create (kubectl create secret generic ... --from-file); a
// Secret volume of another name fails the test.
var secretKeys = map[string][]string{
	"questd-ca":      {"ca.pem", "ca.key"},
	"questd-secrets": {"gossip.key", "token"},
}

// caKey is the key of the CA's private key in the Secret questd-ca:
// whoever reads it can make node certificates, so only the init
// container may mount it.
const caKey = "ca.key"

// flagSecretKey is the Secret key each file flag of the config reads
// (tls-cert and tls-key are the init container's files).
var flagSecretKey = map[string]string{
	"tls-ca": "ca.pem", "gossip-key-file": "gossip.key", "token-file": "token",
}

// secretMount is a Secret volume as a container sees it.
type secretMount struct {
	secret string            // the Secret's name
	dir    string            // its mount path
	mode   fs.FileMode       // its files' mode
	files  map[string]string // the files: path under dir -> the Secret's key
}

func (sm secretMount) String() string {
	return fmt.Sprintf("Secret %s at %s, mode %04o", sm.secret, sm.dir, sm.mode)
}

// mountsByVolume maps a container's volume names to its mounts.
func mountsByVolume(c corev1.Container) map[string]corev1.VolumeMount {
	m := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		m[vm.Name] = vm
	}
	return m
}

// checkSecretMounts checks every Secret volume container c mounts
// (checkSecretVolume) and fails on a projected volume (none is expected:
// it could carry a Secret's keys past these checks).
func checkSecretMounts(t *testing.T, what string, c corev1.Container, vols map[string]corev1.Volume, sc *corev1.PodSecurityContext) []secretMount {
	t.Helper()
	var out []secretMount
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		switch {
		case !ok:
			t.Errorf("%s: mount of volume %q, which the pod does not have", what, vm.Name)
		case v.Projected != nil:
			t.Errorf("%s: volume %s is projected: not expected (its Secrets' modes and keys are not checked)", what, v.Name)
		case v.Secret != nil:
			out = append(out, checkSecretVolume(t, v, vm, sc))
		}
	}
	return out
}

// checkNoCAKey fails when container c (questd's) mounts the CA's key: a
// volume of the Secret questd-ca with all its keys, or with caKey among
// its items.
func checkNoCAKey(t *testing.T, c corev1.Container, vols map[string]corev1.Volume) {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		v := vols[vm.Name]
		if v.Secret == nil || v.Secret.SecretName != "questd-ca" {
			continue
		}
		if len(v.Secret.Items) == 0 {
			t.Errorf("container %s: volume %s mounts every key of Secret questd-ca, %s included: list items (ca.pem only)", c.Name, v.Name, caKey)
		}
		for _, it := range v.Secret.Items {
			if it.Key == caKey {
				t.Errorf("container %s: volume %s mounts %s of Secret questd-ca: only the init container may read the CA key", c.Name, v.Name, caKey)
			}
		}
	}
}

// checkSecretVolume checks a Secret volume and its mount: a Secret of
// secretKeys, mounted read-only, every file of mode 0400 or 0440 (the
// default, 0644, questd refuses) and readable by the pod (group read
// with the pod's fsGroup: the kubelet makes the files root's, with the
// group fsGroup).
func checkSecretVolume(t *testing.T, v corev1.Volume, vm corev1.VolumeMount, sc *corev1.PodSecurityContext) secretMount {
	t.Helper()
	sm := secretMount{secret: v.Secret.SecretName, dir: vm.MountPath, mode: 0o644, files: map[string]string{}}
	keys, ok := secretKeys[sm.secret]
	if !ok {
		t.Errorf("volume %s: Secret %q is none of %v", v.Name, sm.secret, secretKeys)
	}
	if !vm.ReadOnly {
		t.Errorf("volume %s (Secret %s): mount it readOnly", v.Name, sm.secret)
	}
	if v.Secret.DefaultMode == nil {
		t.Errorf("volume %s (Secret %s): no defaultMode: Kubernetes' 0644 lets other users read the keys, and questd refuses it; want 0440", v.Name, sm.secret)
	} else {
		sm.mode = fs.FileMode(*v.Secret.DefaultMode)
	}
	modes := []fs.FileMode{sm.mode}
	for _, it := range v.Secret.Items {
		if it.Mode != nil {
			modes = append(modes, fs.FileMode(*it.Mode))
		}
		if !slices.Contains(keys, it.Key) {
			t.Errorf("volume %s: item key %q is not a key of Secret %s %v", v.Name, it.Key, sm.secret, keys)
		}
		sm.files[it.Path] = it.Key
	}
	if len(v.Secret.Items) == 0 {
		for _, k := range keys {
			sm.files[k] = k
		}
	}
	for _, m := range modes {
		if m != 0o400 && m != 0o440 {
			t.Errorf("volume %s (Secret %s): mode %04o: want 0400 or 0440 (questd refuses a secret file that other users can read or change, or its group can write)", v.Name, sm.secret, m)
		}
		if !secretModeOK(m) {
			t.Errorf("volume %s (Secret %s): mode %04o: questd refuses it", v.Name, sm.secret, m)
		}
		if m&0o040 == 0 || sc == nil || sc.FSGroup == nil {
			t.Errorf("volume %s (Secret %s): mode %04o: the files are root's, so the pod reads them through its fsGroup (set it) and group read (0440)", v.Name, sm.secret, m)
		}
	}
	return sm
}

// podEnv is container c's environment as the kubelet sets it in a pod
// whose downward-API fields are pod (fieldPath -> value): literal values
// and fieldRefs (a fieldRef pod lacks fails the test); resourceFieldRefs
// are left out (questd reads none, GOMEMLIMIT is the Go runtime's).
func podEnv(t *testing.T, c corev1.Container, pod map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expandEnv(e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			v, ok := pod[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("container %s env %s: fieldRef %s: no value for it in the test pod %v", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath, pod)
			}
			env[e.Name] = v
		}
	}
	return env
}

// envRef is Kubernetes' reference to a variable in command, args and env
// values, $(NAME); $$ escapes a $.
var envRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expandEnv expands s as the kubelet does: $(NAME) to env's NAME, left
// as it is when env has none, and $$ to $.
func expandEnv(s string, env map[string]string) string {
	return envRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// checkMonitor is the structural check of the ServiceMonitor: the fields
// the Prometheus Operator needs, and that it selects the metrics Service
// and names one of its ports.
func checkMonitor(t *testing.T, sm map[string]any, svc *corev1.Service) {
	t.Helper()
	get := func(path ...string) any {
		var v any = sm
		for _, p := range path {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[p]
		}
		return v
	}
	if name, _ := get("metadata", "name").(string); name == "" {
		t.Error("ServiceMonitor: no metadata.name")
	}
	for _, k := range []string{"apiVersion", "kind", "metadata", "spec"} {
		if sm[k] == nil {
			t.Errorf("ServiceMonitor: no %s", k)
		}
	}
	for k := range sm {
		if !slices.Contains([]string{"apiVersion", "kind", "metadata", "spec"}, k) {
			t.Errorf("ServiceMonitor: unknown top-level field %q", k)
		}
	}
	ml, _ := get("spec", "selector", "matchLabels").(map[string]any)
	if len(ml) == 0 {
		t.Fatal("ServiceMonitor: no spec.selector.matchLabels")
	}
	set := labels.Set{}
	for k, v := range ml {
		s, ok := v.(string)
		if !ok {
			t.Errorf("ServiceMonitor matchLabels %s: not a string", k)
		}
		set[k] = s
	}
	if !labels.SelectorFromSet(set).Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor selector %v does not select Service %s (labels %v)", set, svc.Name, svc.Labels)
	}
	eps, _ := get("spec", "endpoints").([]any)
	if len(eps) == 0 {
		t.Fatal("ServiceMonitor: no spec.endpoints")
	}
	known := []string{"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels", "relabelings", "metricRelabelings"}
	for i, e := range eps {
		ep, _ := e.(map[string]any)
		for k := range ep {
			if !slices.Contains(known, k) {
				t.Errorf("ServiceMonitor endpoint %d: field %q not among the ones checked %v", i, k, known)
			}
		}
		port, _ := ep["port"].(string)
		if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == port }) {
			t.Errorf("ServiceMonitor endpoint %d: port %q is not a port name of Service %s", i, port, svc.Name)
		}
		if p, ok := ep["path"].(string); ok && p != "/metrics" {
			t.Errorf("ServiceMonitor endpoint %d: path %q, questd serves /metrics", i, p)
		}
	}
}
