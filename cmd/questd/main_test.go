package main

import (
	"context"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// asQuestdEnv, set to 1, makes the test binary run as questd (its
// arguments are questd's): the tests that need a real questd process
// (kill -9) start this binary again instead of building one.
const asQuestdEnv = "QUESTD_TEST_AS_QUESTD"

// memberlist's goroutines end a probe interval after Shutdown: give them
// time before goleak's verdict.
func TestMain(m *testing.M) {
	if os.Getenv(asQuestdEnv) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("time.Sleep"))
}
