package completion

import (
	"testing"

	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/shard"
)

// The coordinator's Cluster is built outside completion (completion reaches the
// runtime only through the step seam): internal/serveengine, which
// imports completion, so the tests of package completion get it from the external
// test package (runtime_test.go), which sets these before any test runs.
var (
	// NewCoordinatorCluster is serveengine.CoordinatorCluster.
	NewCoordinatorCluster func(co *coord.Coordinator) Cluster
	// MarkClusterError is serveengine.ClusterError.
	MarkClusterError func(err error) error
)

// CoordinatorCluster is the Cluster of a node's coordinator.
func CoordinatorCluster(co *coord.Coordinator) Cluster { return NewCoordinatorCluster(co) }

// clusterErr marks a coordinator's error as the coordinator's Cluster does.
func clusterErr(err error) error { return MarkClusterError(err) }

// TestEngines is serveengine.Engines(): the engines of testConfig's
// servers.
var TestEngines Engines

// shardStore is the page store of rank (0, 0) of s's main engine (an
// in-process engine of serveengine, which keeps the engine's Shard).
func shardStore(t testing.TB, s *Server) *pagestore.Store {
	t.Helper()
	sh, ok := s.eng.(interface{ Shard(tp, cp int) *shard.Shard })
	if !ok || sh.Shard(0, 0) == nil {
		t.Fatalf("the server's engine (%T) has no shard (0, 0) to look at", s.eng)
	}
	return sh.Shard(0, 0).Store()
}
