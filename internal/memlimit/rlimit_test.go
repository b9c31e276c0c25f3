//go:build linux

package memlimit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv marks the child process of TestCheckUnderAddressLimit.
const childEnv = "MEMLIMIT_TEST_CHILD"

// TestCheckUnderAddressLimit runs Check in a child process whose
// address space is limited (ulimit -v) to what it maps now plus 256 MiB:
// a 1 GiB need is refused under NoLimit, Auto and a 4 GiB limit alike
// (each would otherwise reach the runtime's out-of-memory crash), naming
// the address-space limit, while 32 MiB passes and is then allocated.
func TestCheckUnderAddressLimit(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory does not fit a small address space")
	}
	if os.Getenv(childEnv) == "1" {
		checkUnderAddressLimit()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckUnderAddressLimit$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "child ok") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func checkUnderAddressLimit() {
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "child: "+format+"\n", args...)
		os.Exit(1)
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fail("%v", err)
	}
	mapped, ok := parseVmSize(b)
	if !ok {
		fail("no VmSize")
	}
	lim := uint64(mapped + 256<<20)
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		fail("setrlimit: %v", err)
	}
	n, why, err := Ceiling()
	if err != nil || n > 256<<20 || !strings.Contains(why, "address-space") {
		fail("Ceiling = %d, %q, %v; want at most 256 MiB from the address-space limit", n, why, err)
	}
	for _, limit := range []int64{NoLimit, Auto, 4 << 30} {
		err := Check("pools", 1<<30, limit)
		if !errors.Is(err, ErrTooLarge) || strings.Contains(err.Error(), "\n") {
			fail("1 GiB under limit %d: %v", limit, err)
		}
	}
	if err := Check("pools", 32<<20, NoLimit); err != nil {
		fail("32 MiB: %v", err)
	}
	buf := make([]byte, 32<<20)
	buf[len(buf)-1] = 1
	os.Stdout.WriteString("child ok\n")
}
