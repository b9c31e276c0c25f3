package node

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// connLimits bound the connections of the node's gRPC server (the
// client, worker and health APIs on GRPCAddr), so that connections that
// say nothing, idle ones and peers gone without a word do not hold the
// node's file descriptors for ever, and one connection cannot open
// streams without end. Start from defaultConnLimits.
//
// The keepalive enforcement must accept every client's pings, or gRPC
// answers GOAWAY "too_many_pings" and drops the connection: no client in
// this repository pings the node's server (the node's pool to other
// nodes, client and questctl set no keepalive), grpc-go clients
// never ping more often than every 10 s whatever they ask for, and
// MinPingInterval is half that, as the collective transport's
// (grpctransport.DefaultKeepaliveMinTime, for its members' 10 s pings on
// their own listeners).
type connLimits struct {
	// Handshake bounds a new connection's TLS and HTTP/2 handshake
	// (grpc.ConnectionTimeout): a connection that opens and says nothing
	// is closed then. Default 20s (gRPC's: 120s).
	Handshake time.Duration
	// MaxIdle closes, with a GOAWAY, a connection that has had no RPC in
	// flight for this long (keepalive.ServerParameters.MaxConnectionIdle);
	// its client reconnects at its next call, as the node's pool does
	// between grids. A Steps stream is an RPC in flight: never idle.
	// Default 5 min.
	MaxIdle time.Duration
	// PingTime and PingTimeout: the server pings a connection that has
	// been quiet for PingTime and closes it when the ping is not answered
	// within PingTimeout (a peer gone without closing: a crash, a cut
	// network). Defaults 1 min and 20s.
	PingTime, PingTimeout time.Duration
	// MinPingInterval is the shortest interval between a client's pings
	// the server accepts, with or without RPCs in flight
	// (keepalive.EnforcementPolicy); a client that pings more often gets
	// GOAWAY "too_many_pings". Default 5s, half of grpc-go's shortest
	// client keepalive (10s).
	MinPingInterval time.Duration
	// MaxStreams caps the RPCs in flight on one connection
	// (grpc.MaxConcurrentStreams); a grpc-go client past it waits for a
	// stream to end, it does not fail. Default 1024, far above what a
	// coordinator runs on one worker at once.
	MaxStreams uint32
}

// defaultConnLimits returns the limits the node's server runs with.
func defaultConnLimits() connLimits {
	return connLimits{
		Handshake:       20 * time.Second,
		MaxIdle:         5 * time.Minute,
		PingTime:        time.Minute,
		PingTimeout:     20 * time.Second,
		MinPingInterval: 5 * time.Second,
		MaxStreams:      1024,
	}
}

// serverOptions are the gRPC server options of l. MaxConnectionAge is
// left unset (no limit): a Steps stream lives as long as its grid, and
// nothing here balances load by reconnecting.
func (l connLimits) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(l.Handshake),
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: l.MaxIdle,
			Time:              l.PingTime,
			Timeout:           l.PingTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             l.MinPingInterval,
			PermitWithoutStream: true,
		}),
	}
}

// serverWindow is the static HTTP/2 flow-control window, per stream and
// per connection, of the node's gRPC server (serverFlowOptions).
const serverWindow = 1 << 20

// serverFlowOptions fix the node's server's receive windows at
// serverWindow, which turns gRPC's BDP estimator off: with it on, the
// server answers every burst of data it receives with a WINDOW_UPDATE
// and a PING that the peer acknowledges, and on the decode path every
// message (a step's layer, a worker's call) is such a burst: two extra
// writes and reads and their wake-ups per message on both sides
// (bench/results/2026-12-06-cluster-generate-cpu.md). 1 MiB is a
// sixteenth of the 16 MiB the estimator grows a window to for any peer
// that keeps it busy, so no peer makes the node buffer more than it
// could before; a bulk transfer (a prefill's appends) moves 1 MiB per
// round trip, about 10 GB/s at loopback's 0.1 ms.
func serverFlowOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StaticStreamWindowSize(serverWindow), grpc.StaticConnWindowSize(serverWindow)}
}
