package serve_test

import (
	"github.com/questrt/questrt/internal/serveengine"
	"github.com/questrt/questrt/serve"
)

// init hands package serve's tests the runtime they build servers on
// (hooks_test.go).
func init() {
	serve.NewCoordinatorCluster = serveengine.CoordinatorCluster
	serve.MarkClusterError = serveengine.ClusterError
	serve.TestEngines = serveengine.Engines()
}
