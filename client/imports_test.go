package client_test

import (
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/questrt/questrt"

// allowedOwn reports whether the client may import package path of this
// module: the step seam (decode), plan, and the api/ packages (the
// generated messages and api/wire).
func allowedOwn(path string) bool {
	switch path {
	case module + "/client", module + "/decode", module + "/plan":
		return true
	}
	return strings.HasPrefix(path, module+"/api/")
}

// allowedModules are the other modules the client may link: gRPC,
// protobuf and what they import, and yaml (plan's policy files).
var allowedModules = []string{
	"golang.org/x/net", "golang.org/x/sys", "golang.org/x/text",
	"google.golang.org/genproto/googleapis/rpc", "google.golang.org/grpc", "google.golang.org/protobuf",
	"gopkg.in/yaml.v3",
}

// TestImports keeps the public Go client light: a program that talks to
// a cluster links none of the runtime (engine, shard, worker, kernels,
// their device code). It lists the client's transitive imports (go list
// -deps) and names each one outside the allowed set with the chain of
// imports that brings it in.
func TestImports(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-deps", "-json=ImportPath,Standard,Module,Imports", ".")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	type pkg struct {
		ImportPath string
		Standard   bool
		Module     *struct{ Path string }
		Imports    []string
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs[p.ImportPath] = p
	}
	root := module + "/client"
	if _, ok := pkgs[root]; !ok {
		t.Fatalf("go list did not list %s", root)
	}
	// The first importer of each package on a shortest chain from root.
	from := map[string]string{root: ""}
	for queue := []string{root}; len(queue) > 0; queue = queue[1:] {
		for _, imp := range pkgs[queue[0]].Imports {
			if _, seen := from[imp]; !seen {
				from[imp] = queue[0]
				queue = append(queue, imp)
			}
		}
	}
	chain := func(p string) string {
		var c []string
		for ; p != ""; p = from[p] {
			c = append(c, strings.TrimPrefix(p, module+"/"))
		}
		slices.Reverse(c)
		return strings.Join(c, " -> ")
	}
	var own int
	paths := slices.Sorted(maps.Keys(pkgs))
	for _, path := range paths {
		p := pkgs[path]
		switch {
		case p.Standard:
		case p.Module != nil && p.Module.Path == module:
			own++
			if !allowedOwn(path) {
				t.Errorf("the client imports %s (%s): only decode, plan and api/... are allowed", path, chain(path))
			}
		case p.Module == nil || !slices.Contains(allowedModules, p.Module.Path):
			t.Errorf("the client imports %s (%s), outside the allowed modules %v", path, chain(path), allowedModules)
		}
	}
	if own < 4 {
		t.Errorf("only %d packages of this module listed: go list output is not what this test expects", own)
	}
}
