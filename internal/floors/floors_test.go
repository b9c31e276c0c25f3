package floors

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/questrt/questrt/"

// floorOf returns the floor of a package of this module (its path
// without the module prefix): 0 the leaves importable from everywhere
// (planning, the step seam, the wire API, small utilities), 1 compute
// and storage (kernels, pagestore, collective), 2 the shard, 3 the
// worker, 4 the runners (engine, membership, coordinator, node, client),
// 5 the model and the quality harness, 6 serving, 7 the programs and
// their tools. ok is false for a package no floor names (the test then
// asks for one).
func floorOf(p string) (floor int, ok bool) {
	under := func(prefixes ...string) bool {
		for _, x := range prefixes {
			if p == x || strings.HasPrefix(p, x+"/") {
				return true
			}
		}
		return false
	}
	switch {
	case under("plan", "decode", "api", "chat", "internal/memlimit", "internal/readlimit", "internal/identity",
		"internal/buildinfo", "internal/boltcheck", "internal/faultproxy", "internal/certgen", "internal/testcert",
		"internal/testmodels", "internal/tmpfstest", "internal/floors", "internal/invariants", "internal/yield", "internal/parfor",
		"internal/redact", "internal/memwatch"):
		return 0, true
	case under("kernels", "pagestore", "collective", "internal/offload", "internal/metastore"):
		return 1, true
	case under("shard"):
		return 2, true
	case under("worker"):
		return 3, true
	case under("engine", "cluster", "node", "coord", "client"):
		return 4, true
	case under("model", "eval"):
		return 5, true
	case under("completion"):
		return 6, true
	case under("cmd", "bench", "replay", "e2e", "internal/evalengine",
		"internal/serveengine"):
		return 7, true
	}
	return 0, false
}

// seamOnly reports whether p may reach floors 1 to 4 only through the
// step seam and the kernels' compute API (DESIGN.md: the model executor
// sees runners only through the Stepper seam; model and eval never reach
// into shards; completion sits above model and eval).
func seamOnly(p string) bool {
	f, _ := floorOf(p)
	return f == 5 || f == 6
}

// known are the arrows that break the rules today, importer -> imported,
// with what removes them (none today: add one only with the issue that
// removes it).
var known = map[string]string{}

type pkg struct {
	ImportPath string
	Imports    []string
}

// TestImportFloors lists every package of the module (go list -deps
// would add the standard library; only ./... is needed) and checks each
// import of another package of the module (test files excluded: tests
// may reach anywhere to check).
func TestImportFloors(t *testing.T) {
	pkgs := listModule(t)
	seen := map[string]bool{}
	for _, bad := range violations(pkgs, seen) {
		t.Error(bad)
	}
	for arrow, why := range known {
		if !seen[arrow] {
			t.Errorf("%s (%s) no longer exists: remove it from known", arrow, why)
		}
	}
}

// boltHomes are the packages that may import bbolt: the home of durable
// metadata (issue 31, item 2) and the checks it opens files with.
var boltHomes = []string{"internal/metastore", "internal/boltcheck"}

// TestBoltHome checks that only boltHomes import bbolt (go.etcd.io/bbolt
// and its packages; test files excluded): every other package keeps its
// durable metadata through internal/metastore's interfaces.
func TestBoltHome(t *testing.T) {
	for _, bad := range boltImporters(listModule(t)) {
		t.Errorf("%s imports bbolt: keep durable metadata behind internal/metastore", bad)
	}
}

// boltImporters returns the packages of pkgs outside boltHomes that
// import bbolt.
func boltImporters(pkgs []pkg) []string {
	var out []string
	for _, p := range pkgs {
		from, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok || slices.ContainsFunc(boltHomes, func(h string) bool { return from == h || strings.HasPrefix(from, h+"/") }) {
			continue
		}
		if slices.ContainsFunc(p.Imports, func(imp string) bool {
			return imp == "go.etcd.io/bbolt" || strings.HasPrefix(imp, "go.etcd.io/bbolt/")
		}) {
			out = append(out, from)
		}
	}
	return out
}

// TestBoltImporters checks boltImporters on a made-up module.
func TestBoltImporters(t *testing.T) {
	got := boltImporters([]pkg{
		{module + "pagestore", []string{"go.etcd.io/bbolt", "fmt"}},
		{module + "worker", []string{"go.etcd.io/bbolt/errors"}},
		{module + "internal/metastore", []string{"go.etcd.io/bbolt"}},
		{module + "internal/metastore/metastoretest", []string{"go.etcd.io/bbolt"}},
		{module + "shard", []string{module + "internal/metastore"}},
	})
	if want := []string{"pagestore", "worker"}; !slices.Equal(got, want) {
		t.Errorf("bbolt importers %v, want %v", got, want)
	}
}

// listModule returns the module's packages with their imports.
func listModule(t *testing.T) []pkg {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-json=ImportPath,Imports", "./...")
	cmd.Dir = "../.."
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages: not the module", len(pkgs))
	}
	return pkgs
}

// violations returns one line per import that breaks the floors and is
// not in known; seen collects the known arrows met.
func violations(pkgs []pkg, seen map[string]bool) []string {
	var out []string
	for _, p := range pkgs {
		from, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok {
			continue // the module root holds no package
		}
		ff, ok := floorOf(from)
		if !ok {
			out = append(out, fmt.Sprintf("package %s is on no floor: add it to floorOf", from))
			continue
		}
		for _, imp := range p.Imports {
			to, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			tf, ok := floorOf(to)
			if !ok {
				continue // reported as its own package
			}
			arrow := from + " -> " + to
			var why string
			switch {
			case tf > ff:
				why = fmt.Sprintf("floor %d imports floor %d", ff, tf)
			case seamOnly(from) && tf >= 1 && tf <= 4 && !strings.HasPrefix(to+"/", "kernels/"):
				why = fmt.Sprintf("floor %d reaches the runtime (floor %d) past the step seam", ff, tf)
			default:
				continue
			}
			if _, ok := known[arrow]; ok {
				seen[arrow] = true
				continue
			}
			out = append(out, fmt.Sprintf("%s: %s", arrow, why))
		}
	}
	slices.Sort(out)
	return out
}

// TestViolationsFindsArrows checks the rule itself on a made-up module:
// an upward import, a model reaching a shard, and allowed arrows.
func TestViolationsFindsArrows(t *testing.T) {
	pkgs := []pkg{
		{module + "shard", []string{module + "engine", module + "kernels", "fmt"}},
		{module + "model", []string{module + "shard", module + "kernels", module + "decode"}},
		{module + "completion", []string{module + "model", module + "plan"}},
		{module + "newthing", nil},
	}
	got := violations(pkgs, map[string]bool{})
	want := []string{
		"model -> shard: floor 5 reaches the runtime (floor 2) past the step seam",
		"package newthing is on no floor: add it to floorOf",
		"shard -> engine: floor 2 imports floor 4",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPackageTable checks that the package table of docs/architecture.md
// (section 9) names every package of the module in a row's first column
// (one or more backquoted import paths without the module prefix,
// separated by commas) and names no package that does not exist, so the
// table follows the tree (issue 31: "the package table of
// docs/architecture.md matches the tree").
func TestPackageTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	named, err := tablePackages(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, p := range listModule(t) {
		from, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok {
			continue
		}
		have[from] = true
		if !named[from] {
			t.Errorf("package %s has no row in docs/architecture.md's package table", from)
		}
	}
	for p := range named {
		if !have[p] {
			t.Errorf("docs/architecture.md's package table names %s, which is not a package of the module", p)
		}
	}
}

// tablePackages returns the packages named in the first column of the
// table under the "## 9. Packages" heading of doc.
func tablePackages(doc string) (map[string]bool, error) {
	_, sec, ok := strings.Cut(doc, "\n## 9. Packages")
	if !ok {
		return nil, fmt.Errorf("no \"## 9. Packages\" section")
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	named := map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		for _, c := range strings.Split(cells[1], ",") {
			c = strings.TrimSpace(c)
			p, ok := strings.CutPrefix(c, "`")
			if p, ok = strings.CutSuffix(p, "`"); !ok || p == "" {
				return nil, fmt.Errorf("row %q: first column entry %q is not a backquoted package path", line, c)
			}
			named[p] = true
		}
	}
	if len(named) == 0 {
		return nil, fmt.Errorf("no package rows in section 9")
	}
	return named, nil
}

// TestTablePackages checks tablePackages on a made-up document.
func TestTablePackages(t *testing.T) {
	doc := "# x\n## 9. Packages\n\n| package | owns |\n| --- | --- |\n| `a`, `a/b` | things, with `c` |\n| `d` | x |\n## 10. Next\n| `e` | y |\n"
	got, err := tablePackages(doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !got["a"] || !got["a/b"] || !got["d"] {
		t.Errorf("got %v, want a, a/b, d", got)
	}
	if _, err := tablePackages("## 9. Packages\n| `a`, b | x |\n"); err == nil {
		t.Error("an unquoted entry was accepted")
	}
}
