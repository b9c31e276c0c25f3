package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// asQuestdEnv, set to 1, makes the test binary run as questd (its
// arguments are questd's): the tests that need a real questd process
// (kill -9) start this binary again instead of building one.
const asQuestdEnv = "QUESTD_TEST_AS_QUESTD"

// nofileEnv, set to a number with asQuestdEnv, sets the open-file limit
// (RLIMIT_NOFILE, soft and hard) of the questd process to it before it
// starts: the open-file-limit tests.
const nofileEnv = "QUESTD_TEST_NOFILE"

// addressSpaceEnv, set to a number of bytes with asQuestdEnv, limits the
// address space (RLIMIT_AS, ulimit -v) of the questd process to what it
// maps at start plus that many bytes: the memory-bound tests. Not in
// race builds (the detector's shadow memory needs a large address space).
const addressSpaceEnv = "QUESTD_TEST_ADDRESS_SPACE"

// memberlist's goroutines end a probe interval after Shutdown: give them
// time before goleak's verdict.
func TestMain(m *testing.M) {
	if v := os.Getenv(spinEnv); v != "" {
		os.Exit(spin(v))
	}
	if os.Getenv(asQuestdEnv) == "1" {
		if v := os.Getenv(nofileEnv); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err == nil {
				err = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n})
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s=%s: %v\n", nofileEnv, v, err)
				os.Exit(3)
			}
		}
		if v := os.Getenv(addressSpaceEnv); v != "" && !raceEnabled {
			if err := limitAddressSpace(v); err != nil {
				fmt.Fprintf(os.Stderr, "%s=%s: %v\n", addressSpaceEnv, v, err)
				os.Exit(3)
			}
		}
		os.Exit(run(context.Background(), os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
	}
	// memberlist's Shutdown does not wait for a probe in flight: its
	// probeNode waits for the ack timer (the probe interval, which
	// Lifeguard stretches up to 8 times after failed probes, as when a
	// test kills a peer) and then returns, past goleak's retries. A
	// memberlist left running still shows its listeners and scheduler.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("time.Sleep"),
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// limitAddressSpace sets RLIMIT_AS to the process's mapped size (VmSize)
// plus extra bytes (a decimal number).
func limitAddressSpace(extra string) error {
	n, err := strconv.ParseUint(extra, 10, 64)
	if err != nil {
		return err
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmSize:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return err
			}
			lim := kb*1024 + n
			return syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: lim, Max: lim})
		}
	}
	return fmt.Errorf("no VmSize in /proc/self/status")
}
