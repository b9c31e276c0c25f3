package main

import (
	"flag"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// notFlags are the fields of Config that no flag sets: read from files
// by loadConfig (the keys, the token, the per-layer budgets) or fixed
// (the grid's storage type, plan.Float32).
var notFlags = []string{"Membership.Keys", "Security.Token", "Policy.LayerBudget", "Grid.Geometry.DType"}

// altText is a valid value other than the default for every flag parsed
// by a function (flagDefs.text).
var altText = map[string]string{
	"dense-rho": "0.5", "reuse-steps": "2", "reuse-layers": "3,5", "gqa": "per_head", "selector": "oracle", "selection": "union",
	"backend": "cuda", "devices": "1", "kv-cache-dtype": "f16", "max-memory": "1GiB", "eviction": "score",
	"durability": "periodic", "recovery-verify": "at-open", "scrub-rate": "1MiB", "max-itl-factor": "3", "serve-memory-fraction": "0.25", "gpu-memory-utilization": "0.5", "serve-layout": "cluster",
	"monitor-rate": "0.5", "log-level": "debug", "log-format": "json",
}

// configLeaves returns the leaf fields of v (a Config), by their dotted
// path, recursing into structs.
func configLeaves(v reflect.Value, path string, out map[string]reflect.Value) {
	if v.Kind() == reflect.Struct {
		for i := range v.NumField() {
			p := v.Type().Field(i).Name
			if path != "" {
				p = path + "." + p
			}
			configLeaves(v.Field(i), p, out)
		}
		return
	}
	out[path] = v
}

// altValue is a value of flag f other than its default, as fs.Set takes
// it.
func altValue(t *testing.T, f *flag.Flag) string {
	switch kindOf(f) {
	case kindBool:
		b, _ := strconv.ParseBool(f.DefValue)
		return strconv.FormatBool(!b)
	case kindInt:
		n, _ := strconv.Atoi(f.DefValue)
		return strconv.Itoa(n + 1)
	case kindDuration:
		d, _ := time.ParseDuration(f.DefValue)
		return (d + time.Second).String()
	case kindList:
		return "10.0.0.1:1"
	case kindText:
		v, ok := altText[f.Name]
		if !ok {
			t.Fatalf("--%s: no value in altText", f.Name)
		}
		return v
	}
	return "alt-" + f.Name
}

// setOne sets flag name (by fs.Set) to v on a default config and
// returns the leaves of Config that changed.
func setOne(t *testing.T, name, v string) []string {
	var c Config
	fs, _ := newFlagSet(&c, "host-1")
	before := map[string]reflect.Value{}
	configLeaves(reflect.ValueOf(deepCopy(c)), "", before)
	if err := fs.Set(name, v); err != nil {
		t.Fatalf("--%s %q: %v", name, v, err)
	}
	after := map[string]reflect.Value{}
	configLeaves(reflect.ValueOf(c), "", after)
	var changed []string
	for p, a := range after {
		if !reflect.DeepEqual(a.Interface(), before[p].Interface()) {
			changed = append(changed, p)
		}
	}
	slices.Sort(changed)
	return changed
}

// deepCopy copies c's slices so that a later Set does not show through.
func deepCopy(c Config) Config {
	c.Membership.Join = slices.Clone(c.Membership.Join)
	c.Serve.AllowedOrigins = slices.Clone(c.Serve.AllowedOrigins)
	c.Devices.Ordinals = slices.Clone(c.Devices.Ordinals)
	return c
}

// TestFlagsMapToFields: every flag (an alias included) sets exactly one
// field of the nested Config, no two flags but an alias and its flag set
// the same one, and every field but notFlags has its flag. The
// environment and the file are derived from the same flag set: every
// flag but those of the command line has its variable (loadConfig asks
// for each) and its key (a file giving every key sets the same fields to
// the same values as the flags), and --print-config prints every key.
func TestFlagsMapToFields(t *testing.T) {
	var c Config
	fs, _ := newFlagSet(&c, "host-1")
	owner := map[string]string{} // field -> the flag's own name
	var flags []string
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f.Name) })
	for _, name := range flags {
		if cliOnly(name) {
			continue
		}
		changed := setOne(t, name, altValue(t, fs.Lookup(canonicalFlag(name))))
		if len(changed) != 1 {
			t.Errorf("--%s sets %d fields %v, want 1", name, len(changed), changed)
			continue
		}
		canon := canonicalFlag(name)
		if prev, dup := owner[changed[0]]; dup && prev != canon {
			t.Errorf("--%s and --%s both set %s", prev, name, changed[0])
			continue
		}
		owner[changed[0]] = canon
	}
	leaves := map[string]reflect.Value{}
	configLeaves(reflect.ValueOf(c), "", leaves)
	for p := range leaves {
		_, has := owner[p]
		switch {
		case slices.Contains(notFlags, p) && has:
			t.Errorf("%s is in notFlags but --%s sets it", p, owner[p])
		case !slices.Contains(notFlags, p) && !has:
			t.Errorf("field %s has no flag (add one, or list it in notFlags)", p)
		}
	}

	// The environment: loadConfig asks for exactly the variables of the
	// flags but those of the command line.
	asked := map[string]bool{}
	loadConfig(nil, func(k string) (string, bool) { asked[k] = true; return "", false }, io.Discard)
	for _, name := range flags {
		if asked[envName(name)] == cliOnly(name) {
			t.Errorf("--%s: variable %s asked %v", name, envName(name), asked[envName(name)])
		}
		delete(asked, envName(name))
	}
	if len(asked) > 0 {
		t.Errorf("variables of no flag asked: %v", asked)
	}

	// The file: every flag's own key with the value given to the flag
	// above sets the same fields to the same values.
	var file strings.Builder
	var want Config
	wfs, _ := newFlagSet(&want, "host-1")
	for _, name := range flags {
		if cliOnly(name) || name == "config" || canonicalFlag(name) != name {
			continue
		}
		v := altValue(t, fs.Lookup(name))
		if err := wfs.Set(name, v); err != nil {
			t.Fatal(err)
		}
		switch kindOf(fs.Lookup(name)) {
		case kindList:
			fmt.Fprintf(&file, "%s: [%q]\n", name, v)
		case kindInt, kindBool:
			fmt.Fprintf(&file, "%s: %s\n", name, v)
		default:
			fmt.Fprintf(&file, "%s: %q\n", name, v)
		}
	}
	var got Config
	gfs, groups := newFlagSet(&got, "host-1")
	path := writeFile(t, "all.yaml", file.String())
	if err := applyFile(gfs, path, map[string]bool{}, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("a file of every key:\n got %+v\nwant %+v", got, want)
	}
	if reflect.DeepEqual(got, DefaultConfig("host-1")) {
		t.Error("a file of every key left the defaults")
	}

	// --print-config prints every flag's own key but --config.
	var out strings.Builder
	if err := printConfig(&out, gfs, groups); err != nil {
		t.Fatal(err)
	}
	var printed map[string]any
	if err := yaml.Unmarshal([]byte(out.String()), &printed); err != nil {
		t.Fatal(err)
	}
	for _, name := range flags {
		_, ok := printed[name]
		if want := !cliOnly(name) && name != "config" && canonicalFlag(name) == name; ok != want {
			t.Errorf("--print-config: key %s printed %v, want %v", name, ok, want)
		}
		delete(printed, name)
	}
	if len(printed) > 0 {
		t.Errorf("--print-config: keys of no flag %v", printed)
	}
}
