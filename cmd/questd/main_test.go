package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
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

// memberlist's goroutines end a probe interval after Shutdown: give them
// time before goleak's verdict.
func TestMain(m *testing.M) {
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
		os.Exit(run(context.Background(), os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("time.Sleep"))
}
