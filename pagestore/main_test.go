package pagestore

import (
	"os"
	"testing"

	"github.com/questrt/questrt/internal/memwatch"
)

// TestMain bounds the tests' resident memory (they hold tens of MB): one
// that runs away (the corruption and disk-full tests read damaged
// files) fails with its stack instead of being killed by the OOM killer.
func TestMain(m *testing.M) {
	w := memwatch.Start(2 << 30)
	code := m.Run()
	w.Stop()
	os.Exit(code)
}
