package completion_test

import (
	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/serveengine"
)

// init hands package completion's tests the runtime they build servers on
// (hooks_test.go).
func init() {
	completion.NewCoordinatorCluster = serveengine.CoordinatorCluster
	completion.MarkClusterError = serveengine.ClusterError
	completion.TestEngines = serveengine.Engines()
}
