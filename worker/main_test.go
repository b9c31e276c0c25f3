package worker

import (
	"fmt"
	"os"
	"testing"

	"github.com/questrt/questrt/internal/memwatch"
	"go.uber.org/goleak"
)

// rssBound is this package's resident memory bound: its tests hold tens
// of MB; one that runs away (the corruption tests read damaged files)
// fails with its stack instead of being killed by the OOM killer.
const rssBound = 2 << 30

func TestMain(m *testing.M) {
	w := memwatch.Start(rssBound)
	code := m.Run()
	w.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
