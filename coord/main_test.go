package coord_test

import (
	"testing"

	"go.uber.org/goleak"
)

// memberlist's goroutines end a probe interval after Shutdown (they sleep
// it out): goleak ignores the sleeping ones; its retries give the others
// time to end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("time.Sleep"))
}
