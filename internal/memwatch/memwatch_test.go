package memwatch

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestWatchEndsRunaway: a child that touches 512 MB under a bound 256
// MB above its starting size exits 3 with its stack (this test's
// function named) on stderr; one that touches 16 MB passes.
func TestWatchEndsRunaway(t *testing.T) {
	if os.Getenv("MEMWATCH_CHILD") != "" {
		// The bound sits 256 MB above what the child holds at its start
		// (the race detector's shadow memory grows both).
		base, err := RSS()
		if err != nil {
			t.Fatal(err)
		}
		w := Start(base + 256<<20)
		defer w.Stop()
		n := 16 << 20
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
			if code != 3 || !strings.Contains(string(out), "exceeds the test binary's bound of") || !strings.Contains(string(out), "TestWatchEndsRunaway") {
				t.Errorf("runaway child: exit %d, output:\n%.2000s", code, out)
			}
		case "within":
			if code != 0 {
				t.Errorf("child within the bound: exit %d, output:\n%.2000s", code, out)
			}
		}
	}
}
