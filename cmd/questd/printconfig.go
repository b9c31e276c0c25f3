package main

import (
	"flag"
	"fmt"
	"io"
	"slices"

	"gopkg.in/yaml.v3"
)

// printConfig writes the effective configuration held by fs's flags as a
// YAML mapping from flag names to values, in the usage's order: the
// format applyFile reads, so that the output fed back through --config
// gives the same configuration. Left out: the flags of the command line
// only, --config itself (a file cannot name another) and the aliases
// (--plaintext, --tensor-parallel-size, ...: the flag's own name is
// printed; see flagAliases). Secrets are not flags (the token and the
// gossip keys are read from their files), so none is printed.
func printConfig(w io.Writer, fs *flag.FlagSet, groups []flagGroup) error {
	top := &yaml.Node{Kind: yaml.MappingNode,
		HeadComment: "questd --print-config: the effective configuration, for --config"}
	for _, g := range groups {
		for _, name := range g.names {
			if _, alias := flagAliases[name]; alias || cliOnly(name) || name == "config" {
				continue
			}
			f := fs.Lookup(name)
			top.Content = append(top.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name}, yamlValue(f))
		}
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{top}}); err != nil {
		return fmt.Errorf("print config: %w", err)
	}
	return enc.Close()
}

// yamlValue is the YAML node of f's value, of the kind applyFile wants
// for it.
func yamlValue(f *flag.Flag) *yaml.Node {
	scalar := func(tag, v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v} }
	switch kindOf(f) {
	case kindList:
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		if l := f.Value.(*listValue); l.p != nil {
			for _, item := range slices.Clone(*l.p) {
				seq.Content = append(seq.Content, scalar("!!str", item))
			}
		}
		return seq
	case kindInt:
		return scalar("!!int", f.Value.String())
	case kindBool:
		return scalar("!!bool", f.Value.String())
	}
	return scalar("!!str", f.Value.String())
}
