package memwatch

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestRSSGrows: RSS sees 256 MB that were touched.
func TestRSSGrows(t *testing.T) {
	before, err := RSS()
	if err != nil {
		t.Skipf("no /proc/self/statm: %v", err)
	}
	b := make([]byte, 256<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	after, err := RSS()
	if err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(b)
	if after-before < 200<<20 {
		t.Errorf("RSS went from %d to %d MB after touching 256 MB", before>>20, after>>20)
	}
}

// TestWatchEndsRunaway: a child that touches 512 MB under a 128 MB
// watch exits 3 with its stack (this test's function named) on
// stderr; under a watch it stays within, the child passes.
func TestWatchEndsRunaway(t *testing.T) {
	if os.Getenv("MEMWATCH_CHILD") != "" {
		w := Start(128 << 20)
		defer w.Stop()
		n := 64 << 20
		if os.Getenv("MEMWATCH_CHILD") == "runaway" {
			n = 512 << 20
		}
		b := make([]byte, n)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		time.Sleep(50 * Period) // the watch ends a runaway child here
		runtime.KeepAlive(b)
		return
	}
	if _, err := RSS(); err != nil {
		t.Skipf("no /proc/self/statm: %v", err)
	}
	for _, mode := range []string{"runaway", "within"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWatchEndsRunaway$", "-test.v")
		cmd.Env = append(os.Environ(), "MEMWATCH_CHILD="+mode)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		switch mode {
		case "runaway":
			if code != 3 || !strings.Contains(string(out), "exceeds the test binary's bound of 128 MB") || !strings.Contains(string(out), "TestWatchEndsRunaway") {
				t.Errorf("runaway child: exit %d, output:\n%.2000s", code, out)
			}
		case "within":
			if code != 0 {
				t.Errorf("child within the bound: exit %d, output:\n%.2000s", code, out)
			}
		}
	}
}
