package eval

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests on goroutines left running (the harness
// engines' workers).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
