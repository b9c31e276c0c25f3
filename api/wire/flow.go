package wire

import "google.golang.org/grpc"

// FlowWindow is the fixed HTTP/2 flow-control window, per stream and per
// connection, of questrt's gRPC connections: the largest window gRPC's
// BDP estimator would grow to (16 MiB), set from the start.
//
// A fixed window turns the estimator off. With it on (gRPC's default), a
// side that receives a message answers it with a WINDOW_UPDATE and a
// PING, and the sender acknowledges the PING: on the decode path, where
// every message is small and answered at once, that is two extra
// writes, two extra reads and the wake-ups they cause per message, which
// on the 2-core machine cost more than the message itself
// (bench/results/2026-12-06-cluster-generate-cpu.md).
const FlowWindow = 16 << 20

// DialFlowOptions are the dial options that fix a client connection's
// receive windows at FlowWindow (no BDP pings from this side).
func DialFlowOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(FlowWindow), grpc.WithInitialConnWindowSize(FlowWindow)}
}

// ServerFlowOptions are the server options that fix the receive windows
// of a server's connections at FlowWindow (no BDP pings from the server).
func ServerFlowOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(FlowWindow), grpc.InitialConnWindowSize(FlowWindow)}
}
