// Package localgroup runs the collective benchmark with every rank a
// goroutine of this process, as `questctl bench collective --shards`
// does: over the in-process transport (channels) or a gRPC group on
// 127.0.0.1 (one plaintext loopback stream per pair of ranks, ephemeral
// ports: the cost of the network path without a network), the selection
// exchange and the merge with their baselines (Bench, on
// collective.BenchCollective) or the all-gather message-size sweep
// (Sweep, on collective.BenchSweep). The measured loops live in
// collective, where the worker runs them on a cluster's nodes too
// (bench/clusterrun); the ranks in processes are bench/rankproc's. The
// CLI keeps the flags, their checks, the table and the JSON lines.
package localgroup
