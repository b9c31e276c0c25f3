// Package cluster owns the membership of a questrt cluster and, later, the
// placement of sequences onto its nodes. It does no compute; shard and the
// packages below it never import it.
//
// # Membership
//
// [NewMembership] starts gossip and failure detection with
// hashicorp/memberlist over UDP and TCP and joins the cluster through
// [MemberConfig.Join]. Nodes with another cluster label
// ([MemberConfig.Label]) or other gossip keys ([MemberConfig.SecretKeys])
// are refused, and so is a second node with a name already in use
// ([ErrNameConflict]).
//
// Each node advertises a [NodeMeta] (gRPC address, version, backend,
// device count, free pages and bytes), encoded in a small versioned binary
// form that must fit memberlist's 512-byte limit ([ErrMetaTooLarge]); the
// full device inventory is served over gRPC. [Membership.UpdateMeta]
// changes it at run time.
//
// [Membership.View] is this node's snapshot: the members sorted by name
// (so that placement computed from it is deterministic), each alive,
// suspect, dead or left, and a version that increases at every change.
// [View.Digest] compares views across nodes. [Membership.Subscribe]
// delivers every change as an [Event] without ever blocking memberlist
// (a full buffer drops and counts; see [Subscription]).
//
// [Membership.Leave] departs gracefully (the others see [StateLeft]);
// [Membership.Shutdown] stops everything, and without Leave looks like a
// crash: the others declare the node [StateDead] after their failure
// detection, which [MemberConfig.DetectionBound] estimates from the
// probe interval, probe timeout, suspicion multiplier and gossip interval.
// Measured on a 2-core machine over loopback with 3 nodes: about 5.8 s
// with memberlist's default LAN timings, about 0.35 s with a 100 ms probe
// interval, 50 ms probe timeout and a suspicion multiplier of 2. That is
// why steps do not wait for gossip: a broken stream or a missed step
// deadline fails a step at once, and membership confirms and drives
// placement and rejoin. A node restarted under the same name rejoins with
// a new [Member.Instance].
//
// # GPU discovery
//
// [Discover] lists the node's GPUs with go-nvml, behind `questctl
// devices`; only in builds with the nvml or cuda tag, since go-nvml needs
// cgo and the default build is pure Go.
//
// # Placement
//
// [PlaceGrid] places the CP x TP ranks of a grid on nodes, a pure
// function of the nodes that are up ([NodesOf] a [View]: alive or
// suspect, with decodable meta and a gRPC address) and their free pages:
// rank (0, 0) on the coordinator when it has room (the merged outputs
// end there), the others dealt round-robin over the other nodes in a
// rendezvous-hash order of (coordinator, node), skipping nodes without
// room for one more rank ([ErrNoCapacity] when the grid does not fit).
// Two nodes whose views agree place alike. The coordinator side (grids,
// sequences, the client API) is package coord; a whole node is
// package node.
package cluster
