package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/questrt/questrt/internal/readlimit"
)

// yamlKind is the kind of YAML value a flag takes in the file.
type yamlKind int

const (
	kindString   yamlKind = iota // a string
	kindInt                      // an integer
	kindBool                     // true or false
	kindDuration                 // a duration string such as 2s
	kindText                     // a string or an integer (sizes, names of modes)
	kindList                     // a sequence of strings
)

func kindOf(f *flag.Flag) yamlKind {
	switch v := f.Value.(type) {
	case *listValue:
		return kindList
	case *textValue:
		return kindText
	case flag.Getter:
		switch v.Get().(type) {
		case bool:
			return kindBool
		case int:
			return kindInt
		case time.Duration:
			return kindDuration
		}
	}
	return kindString
}

var kindWant = map[yamlKind]string{
	kindString:   "a string",
	kindInt:      "an integer",
	kindBool:     "true or false",
	kindDuration: "a duration string such as 2s",
	kindText:     "a string",
	kindList:     "a sequence of strings",
}

// applyFile reads the YAML file at path, a mapping from flag names to
// values, and sets every flag not given on the command line from it.
// Unknown keys, repeated keys and values of the wrong kind are refused.
func applyFile(fs *flag.FlagSet, path string, onCLI map[string]bool, origin map[string]string) error {
	bad := func(line int, format string, args ...any) error {
		where := ""
		if line > 0 {
			where = fmt.Sprintf("line %d: ", line)
		}
		return withOrigin(fmt.Errorf("--config %q: %s%s", path, where, fmt.Sprintf(format, args...)), origin["config"])
	}
	b, err := readlimit.ReadFile(path, maxConfigFile)
	if err != nil {
		return bad(0, "%v", errors.Unwrap(err))
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return bad(0, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil // an empty file
	}
	top := doc.Content[0]
	if top.Kind == yaml.ScalarNode && top.ShortTag() == "!!null" {
		return nil
	}
	if top.Kind != yaml.MappingNode {
		return bad(top.Line, "want a mapping of flag names to values")
	}
	type keyed struct {
		key  *yaml.Node
		vals []string
	}
	seen := map[string]keyed{} // by the flag's own name: the key that set it and its values
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			return bad(k.Line, "key %q is not a flag name", k.Value)
		}
		name := k.Value
		canon := canonicalFlag(name)
		prev, again := seen[canon]
		if again && prev.key.Value == name {
			return bad(k.Line, "key %q repeated (first on line %d)", name, prev.key.Line)
		}
		f := fs.Lookup(name)
		if f == nil {
			hint := ""
			if alt := strings.ToLower(strings.ReplaceAll(name, "_", "-")); fs.Lookup(alt) != nil {
				hint = fmt.Sprintf(" (did you mean %s?)", alt)
			}
			return bad(k.Line, "unknown key %q%s", name, hint)
		}
		if name == "config" {
			return bad(k.Line, "key %q: a config file cannot name another", name)
		}
		if cliOnly(name) {
			return bad(k.Line, "key %q: --%s is for the command line only", name, name)
		}
		vals, err := yamlValues(v, kindOf(f))
		if err != nil {
			return bad(v.Line, "key %q: %v", name, err)
		}
		if again {
			// A flag and its alias: fine with the same value, set once.
			same := len(vals) == len(prev.vals)
			for j := 0; same && j < len(vals); j++ {
				same = sameValue(f, vals[j], prev.vals[j])
			}
			if !same {
				return bad(k.Line, "key %q: the same setting as %q on line %d (--%s), with another value; give one", name, prev.key.Value, prev.key.Line, canon)
			}
			continue
		}
		seen[canon] = keyed{k, vals}
		if onCLI[canon] {
			continue // still checked above
		}
		if l, ok := f.Value.(*listValue); ok {
			l.reset()
		}
		for _, s := range vals {
			if err := fs.Set(name, s); err != nil {
				return bad(v.Line, "%s %q: %s", name, s, setWhy(f, err))
			}
		}
		origin[canon] = fmt.Sprintf("%s line %d", path, k.Line)
	}
	return nil
}

// yamlValues returns the text of node for fs.Set (one per item of a
// list), checking that it is of kind k.
func yamlValues(n *yaml.Node, k yamlKind) ([]string, error) {
	tag := n.ShortTag()
	wrong := func() error {
		got := map[string]string{"!!str": "a string", "!!int": "an integer", "!!bool": "a boolean",
			"!!float": "a number", "!!null": "empty", "!!timestamp": "a date"}[tag]
		switch {
		case n.Kind == yaml.SequenceNode:
			got = "a sequence"
		case n.Kind == yaml.MappingNode:
			got = "a mapping"
		case got == "":
			got = tag
		}
		hint := ""
		if n.Kind == yaml.ScalarNode && (k == kindString || k == kindText || k == kindDuration) {
			hint = " (quote it)"
		}
		return fmt.Errorf("want %s, not %s%s", kindWant[k], got, hint)
	}
	if k == kindList {
		if n.Kind != yaml.SequenceNode {
			return nil, wrong()
		}
		out := make([]string, 0, len(n.Content))
		for _, item := range n.Content {
			if item.Kind != yaml.ScalarNode || item.ShortTag() != "!!str" {
				return nil, fmt.Errorf("item on line %d: want a string", item.Line)
			}
			if strings.Contains(item.Value, ",") {
				return nil, fmt.Errorf("item %q: one address per item, no commas", item.Value)
			}
			out = append(out, item.Value)
		}
		return out, nil
	}
	if n.Kind != yaml.ScalarNode {
		return nil, wrong()
	}
	switch {
	case k == kindInt && tag == "!!int":
		var v int
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("%q: too large for an integer", n.Value)
		}
		return []string{strconv.Itoa(v)}, nil
	case k == kindBool && tag == "!!bool":
		var v bool
		if err := n.Decode(&v); err != nil {
			return nil, wrong()
		}
		return []string{strconv.FormatBool(v)}, nil
	case (k == kindString || k == kindDuration) && tag == "!!str",
		k == kindText && (tag == "!!str" || tag == "!!int"):
		return []string{n.Value}, nil
	}
	return nil, wrong()
}
