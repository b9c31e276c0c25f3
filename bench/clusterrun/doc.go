// Package clusterrun runs the collective benchmark on the nodes of a
// running cluster, as `questctl bench collective --addr` does: one
// BenchCollective call to a node's decode API per configuration, which
// runs one rank on each node over the cluster's own streams; Run checks
// that every rank answered once, combines their samples as the local
// modes do (collective.BenchCombine, SweepCombine) and hands each result
// on with the nodes that ran it.
package clusterrun
