package model

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests on goroutines left running (engines' workers,
// the kernels' parallel loops).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
