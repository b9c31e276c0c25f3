//go:build unix

package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/plan"
)

// TestUpDataDir: with --data-dir DIR (missing, nested) up creates DIR
// and one directory per node, DIR/NAME (0700, empty), starts each node
// with --data-dir DIR/NAME (absolute) and says so on stderr; --json
// gives each node's "data_dir". A second up on the same DIR, given
// relative, takes the directories that are there.
func TestUpDataDir(t *testing.T) {
	dir, questd := fakeCluster(t)
	base := t.TempDir()
	data := filepath.Join(base, "a", "data")
	u := startUp(t, "--nodes", "3", "--insecure", "--questd", questd, "--base-name", "q", "--data-dir", data, "--json")
	out := u.waitJSON(t, 3)
	names := []string{"q-0", "q-1", "q-2"}
	for i, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var o map[string]any
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if o["name"] != names[i] || o["data_dir"] != filepath.Join(data, names[i]) {
			t.Errorf("--json line %d: %s, want data_dir %s", i, l, filepath.Join(data, names[i]))
		}
	}
	check := func(run string) {
		t.Helper()
		recs := readRecords(dir)
		for _, name := range names {
			want := filepath.Join(data, name)
			args := recs[name].Args
			if i := slices.Index(args, "--data-dir"); i < 0 || i+1 >= len(args) || args[i+1] != want || slices.Index(args[i+1:], "--data-dir") >= 0 {
				t.Errorf("%s: %s was started with %q, want --data-dir %s once", run, name, args, want)
			}
			fi, err := os.Stat(want)
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
				t.Errorf("%s: %s: %v, %v; want a directory 0700", run, want, fi, err)
				continue
			}
			if ents, _ := os.ReadDir(want); len(ents) != 0 {
				t.Errorf("%s: %s holds %v; the writability probe must not stay", run, want, ents)
			}
		}
		if want := "questctl up: each node persists its sequences in " + filepath.Join(data, "q-N"); !strings.Contains(u.stderr.String(), want) {
			t.Errorf("%s: stderr lacks %q:\n%s", run, want, u.stderr)
		}
	}
	check("first up")
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, u.stderr)
	}

	t.Chdir(base)
	for _, name := range names {
		os.Remove(filepath.Join(dir, name+".json"))
	}
	u = startUp(t, "--nodes", "3", "--insecure", "--questd", questd, "--base-name", "q", "--data-dir", filepath.Join("a", "data"))
	if n := parseUpLines(t, u.waitUp(t)); len(n) != 3 {
		t.Fatalf("second up: nodes %v", n)
	}
	check("second up")
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Fatalf("second up: exit %d; stderr:\n%s", code, u.stderr)
	}
}

// TestUpDataDirRefused: a --data-dir that is a file, under a file, with
// a node's directory that is a file, or that cannot be written is
// refused with one line naming the directory (exit 2) before any node
// starts.
func TestUpDataDirRefused(t *testing.T) {
	dir, questd := fakeCluster(t)
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	nodeFile := filepath.Join(tmp, "nodefile")
	if err := os.MkdirAll(filepath.Join(nodeFile, "node-0"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nodeFile, "node-1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, dataDir, want string }{
		{"file", file, file + " is not a directory"},
		{"under a file", filepath.Join(file, "sub"), "cannot use " + filepath.Join(file, "sub") + ": not a directory"},
		{"node directory is a file", nodeFile, filepath.Join(nodeFile, "node-1") + " is not a directory"},
	}
	// Read-only for this user (root writes anyway: then only where the
	// kernel refuses everyone).
	ro := filepath.Join(tmp, "ro")
	if err := os.MkdirAll(filepath.Join(ro, "node-0"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ro, "node-0"), 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(ro, "node-0"), 0o700) })
	if f, err := os.CreateTemp(filepath.Join(ro, "node-0"), "probe"); err == nil {
		f.Close()
		os.Remove(f.Name())
		t.Log("this user writes in a 0500 directory (root): the read-only case runs on /sys only")
	} else {
		cases = append(cases, struct{ name, dataDir, want string }{"read-only", ro, "cannot write in " + filepath.Join(ro, "node-0") + ": permission denied"})
	}
	if runtime.GOOS == "linux" {
		if _, err := os.Stat("/sys/kernel"); err == nil {
			cases = append(cases, struct{ name, dataDir, want string }{"sysfs", "/sys/questctl-up-test", "cannot create /sys/questctl-up-test: "})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "up", "--nodes", "2", "--insecure", "--questd", questd, "--data-dir", c.dataDir)
			if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "questctl up: --data-dir ") || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", code, stdout, stderr, c.want)
			}
			if recs := readRecords(dir); len(recs) != 0 {
				t.Errorf("nodes started: %v", recs)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(nodeFile, "node-0", ".questctl-up-probe-")); err == nil {
		t.Error("a probe file was left behind")
	}
}

// TestUpDataDirRealQuestd: with the real questd, a sequence created and
// appended through a 2-node CP 2 cluster of up --data-dir DIR (a rank
// on each node) is there again after up is stopped (SIGTERM: every node
// saves its sequences in full) and started once more with the same
// --data-dir: Recovered lists it under its id at its full length, none
// lost or damaged, and its length reads back.
func TestUpDataDirRealQuestd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts questd")
	}
	bin := filepath.Join(t.TempDir(), "questd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/questd")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/questd: %v\n%s", err, out)
	}
	data := filepath.Join(t.TempDir(), "data")
	args := []string{"--nodes", "2", "--cp", "2", "--questd", bin, "--timeout", "25s", "--stop-timeout", "5s", "--insecure", "--data-dir", data, "--",
		"--layers", "2", "--q-heads", "8", "--kv-heads", "4", "--head-dim", "16", "--page-size", "4",
		"--capacity-pages", "128", "--budget-tokens", "24", "--dense-layers", "1", "--max-memory", "none", "--drain-timeout", "1s"}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	dial := func(addr string) *client.Client {
		t.Helper()
		c, err := client.Dial(ctx, addr, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	u := startUp(t, args...)
	nodes := parseUpLines(t, u.waitUp(t))
	if len(nodes) != 2 {
		t.Fatalf("nodes %v", nodes)
	}
	c := dial(nodes[0].grpc)
	g := c.Geometry()
	id, placed, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	// Page size 4: 19 tokens are 4 sealed pages and a tail of 3, which
	// only the graceful stop saves.
	const tokens = 19
	rng := rand.New(rand.NewPCG(6, 6))
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	kv := g.KVHeads * g.HeadDim
	for l := range g.Layers {
		if err := c.Append(ctx, id, l, vec(tokens*kv), vec(tokens*kv)); err != nil {
			t.Fatal(err)
		}
	}
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Fatalf("up exited %d; stderr:\n%s", code, u.stderr)
	}
	for _, n := range nodes {
		if grids, _ := filepath.Glob(filepath.Join(data, n.name, "grids", "*", "*")); len(grids) == 0 {
			t.Errorf("%s (placed on %v): no grid directory under %s", n.name, placed, filepath.Join(data, n.name))
		}
	}

	u = startUp(t, args...)
	nodes = parseUpLines(t, u.waitUp(t))
	if len(nodes) != 2 {
		t.Fatalf("after the restart: nodes %v", nodes)
	}
	c = dial(nodes[0].grpc)
	recs, dmg, err := c.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ID != id || recs[0].Len != tokens || recs[0].LostTokens != 0 || len(dmg) != 0 {
		t.Fatalf("after the restart: recovered %+v, damaged %+v; want %s at %d tokens, nothing lost", recs, dmg, id, tokens)
	}
	if n, err := c.Len(ctx, id); err != nil || n != tokens {
		t.Errorf("Len(%s) = %d, %v; want %d", id, n, err, tokens)
	}
	u.cancel()
	if code := u.wait(t); code != 0 {
		t.Errorf("up exited %d; stderr:\n%s", code, u.stderr)
	}
}
