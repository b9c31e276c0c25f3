// Package e2e holds the end-to-end tests of questrt: the real questd and
// questctl binaries, built once by TestMain, run as separate processes on
// loopback and across network namespaces. It has no non-test code.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// bin is the folder holding the built questd and questctl.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "questrt-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	for _, cmd := range []string{"questd", "questctl"} {
		b := exec.Command("go", "build", "-o", filepath.Join(dir, cmd), "github.com/questrt/questrt/cmd/"+cmd)
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build %s: %v\n", cmd, err)
			return 1
		}
	}
	bin = dir
	return m.Run()
}
