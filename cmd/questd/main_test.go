package main

import (
	"testing"

	"go.uber.org/goleak"
)

// memberlist's goroutines end a probe interval after Shutdown: give them
// time before goleak's verdict.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("time.Sleep"))
}
