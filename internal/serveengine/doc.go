// Package serveengine builds the runtime objects the completions server
// (package completion) runs on, for the programs that start one (cmd/questd):
// serve reaches the runtime only through the step seam (package decode)
// and the small interfaces it declares, so the coordinator, the engine
// and the workers are named here, not there (issue 31 item 3): Engines
// opens the in-process engines of a completion.GridSpec
// (completion.Config.Engines), CoordinatorCluster holds the sequences on a
// node's coordinator (completion.Config.Cluster).
package serveengine
