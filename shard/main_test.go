package shard

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives its tests: the
// prefetcher of a prefetching shard must end with Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
