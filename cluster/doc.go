// Package cluster will own the membership of a questrt cluster and the
// placement of sequences onto shards. Only GPU discovery is built
// ([Discover], go-nvml, behind `questctl devices`; only in builds with the
// nvml or cuda tag, since go-nvml needs cgo and the default build is pure
// Go); the rest is planned.
//
// The planned design:
//
//   - Membership and failure detection by gossip with hashicorp/memberlist.
//     Each node's metadata carries its gRPC address, its devices (GPUs
//     discovered with go-nvml, or the CPU where there is none) and its free
//     page capacity.
//   - Placement: a sequence gets one coordinator and a fixed shard layout
//     (CP x TP) when it is created, derived deterministically from the
//     membership view.
//   - Failure handling: steps that need a lost node fail with UNAVAILABLE
//     within the step deadline; nothing hangs and no other sequence is
//     affected.
//
// The package does no compute; shard and the packages below it never
// import it.
package cluster
