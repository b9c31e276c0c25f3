package main

import (
	"bytes"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
)

// TestHelp: --help and -h print the usage on stdout, with what questd
// does, the precedence rule and every flag with its default and variable.
func TestHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var out bytes.Buffer
		_, err := loadConfig([]string{arg}, envOf(nil), &out)
		if !errors.Is(err, errHelp) {
			t.Fatalf("%s: err %v, want errHelp", arg, err)
		}
		help := out.String()
		for _, w := range []string{
			"Usage: questd", "node daemon", "health", `{"event":"ready","name":`, "SIGTERM", "exits 0",
			"Precedence: flags, then the environment, then the file, then the defaults",
			"(default 127.0.0.1:7070)", "(default 2s)", "(default auto)", "(default group_max)", "(default 1024)",
		} {
			if !strings.Contains(help, w) {
				t.Errorf("%s: usage lacks %q", arg, w)
			}
		}
		var c Config
		fs, groups := newFlagSet(&c, "h")
		var grouped []string
		for _, g := range groups {
			grouped = append(grouped, g.names...)
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.Contains(help, "\n  --"+f.Name+" ") && !strings.Contains(help, "\n  --"+f.Name+"\n") {
				t.Errorf("%s: usage lacks --%s", arg, f.Name)
			}
			if cliOnly(f.Name) {
				if strings.Contains(help, "env "+envName(f.Name)) {
					t.Errorf("%s: usage names %s, which is not read", arg, envName(f.Name))
				}
			} else if !strings.Contains(help, "env "+envName(f.Name)+"\n") {
				t.Errorf("%s: usage lacks %s", arg, envName(f.Name))
			}
			if !slices.Contains(grouped, f.Name) {
				t.Errorf("--%s is in no usage section", f.Name)
			}
		})
	}
}
