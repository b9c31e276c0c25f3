package grpctransport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// Config configures one member of a group. Every member of a group uses
// the same Group, Peers and (for keepalive to be compatible) keepalive
// settings; Rank and the listener are per member. Start from DefaultConfig.
type Config struct {
	// Group identifies one incarnation of the group; every member uses the
	// same one, and a stream that announces another is refused. Give a
	// rebuilt group (after a failure, a new membership view) a new id.
	// Required.
	Group string

	// Rank is this member's rank in [0, len(Peers)).
	Rank int

	// Peers are the members' gRPC addresses (host:port), by rank; the
	// group has len(Peers) members. This member dials every lower rank at
	// its address; Peers[Rank] is this member's own advertised address,
	// used only to listen on when neither Listener nor ListenAddr is set.
	Peers []string

	// ListenAddr is the address to listen on (":7070", "127.0.0.1:0").
	// Default: Peers[Rank].
	ListenAddr string

	// Listener, when set, is used instead of listening on ListenAddr: a
	// listener created before the peers' addresses were known (ephemeral
	// ports), or a wrapped one. The Transport takes it over and closes it.
	Listener net.Listener

	// TLS secures every connection with this configuration, as server and
	// as client: set Certificates and RootCAs, and ClientCAs with
	// ClientAuth tls.RequireAndVerifyClientCert for mutual TLS. Exactly one
	// of TLS and Plaintext must be set.
	TLS *tls.Config

	// Plaintext runs the connections unencrypted and unauthenticated; only
	// when asked for (tests, a trusted single host).
	Plaintext bool

	// MaxMessageBytes is the largest message payload this member sends
	// and accepts. gRPC's send and receive limits on both sides are set to
	// it plus the framing overhead; the peers announce theirs in the
	// Hello, and Send refuses a message over the smaller of this and the
	// peer's limit with ErrTooLarge, leaving the stream up. Default 16 MiB;
	// at most 1 GiB.
	MaxMessageBytes int

	// SendQueue is the number of messages queued for a peer's sender
	// goroutine before Send blocks (honouring its ctx) until the stream
	// takes one. The memory it holds is bounded by SendQueue *
	// MaxMessageBytes per peer. Default 64.
	SendQueue int

	// KeepaliveTime is how long a connection may stay idle before this
	// member pings the peer; KeepaliveTimeout is how long it then waits for
	// the answer before declaring the connection (and the stream) lost.
	// Both sides ping: the dialer as a gRPC client, the listener as a
	// server. gRPC clients never ping more often than every 10 s, so
	// KeepaliveTime is at least 10 s. Defaults 10 s and 5 s. A missed step
	// deadline finds a hung peer sooner; keepalive finds a silent network.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration

	// KeepaliveMinTime is the shortest ping interval the server side
	// accepts before it closes the connection for too many pings; it must
	// be at most KeepaliveTime, so members with the same Config never
	// cut each other off. Default 5 s.
	KeepaliveMinTime time.Duration

	// CloseTimeout bounds how long Close waits for the peers to
	// acknowledge its Bye (so the messages queued before Close reach
	// them) before it cuts the streams. Default 1 s.
	CloseTimeout time.Duration

	// ServerOptions and DialOptions are added after the transport's own
	// gRPC options (credentials, limits, codec, keepalive, reconnect
	// backoff), so they can override them: interceptors, stats handlers,
	// a context dialer.
	ServerOptions []grpc.ServerOption
	DialOptions   []grpc.DialOption

	// Logger receives the transport's logs (refused streams, lost peers).
	// Default: discard.
	Logger *slog.Logger
}

// Defaults of DefaultConfig.
const (
	DefaultMaxMessageBytes  = 16 << 20
	DefaultSendQueue        = 64
	DefaultKeepaliveTime    = 10 * time.Second
	DefaultKeepaliveTimeout = 5 * time.Second
	DefaultKeepaliveMinTime = 5 * time.Second
	DefaultCloseTimeout     = time.Second
)

// Bounds of the connections a member's server accepts, fixed (a
// Config's ServerOptions may override them): a connection that says
// nothing is closed after serverHandshakeTimeout (gRPC's default:
// 120 s); one that carries no stream, after serverMaxIdle (a member's
// peer opens its one stream as soon as it connects and keeps it until
// Close, so only a stray connection is ever idle); and one connection
// carries at most serverMaxStreams streams (a peer needs one). The
// keepalive enforcement is KeepaliveMinTime's.
const (
	serverHandshakeTimeout = 20 * time.Second
	serverMaxIdle          = time.Minute
	serverMaxStreams       = 8
)

// Limits that Validate enforces.
const (
	// MaxMessageBytesLimit is the largest MaxMessageBytes.
	MaxMessageBytesLimit = 1 << 30
	// MinKeepaliveTime is the shortest KeepaliveTime: gRPC raises a
	// client's shorter interval to it.
	MinKeepaliveTime = 10 * time.Second
)

// frameOverhead bounds the bytes a Frame adds around a message payload
// (field keys, lengths, the tag); gRPC's limits are MaxMessageBytes plus it.
const frameOverhead = 64

// ErrConfig is wrapped by every error of Validate.
var ErrConfig = errors.New("grpctransport: invalid config")

// DefaultConfig returns the defaults; set Group, Rank, Peers and one of
// TLS and Plaintext.
func DefaultConfig() Config {
	return Config{
		MaxMessageBytes:  DefaultMaxMessageBytes,
		SendQueue:        DefaultSendQueue,
		KeepaliveTime:    DefaultKeepaliveTime,
		KeepaliveTimeout: DefaultKeepaliveTimeout,
		KeepaliveMinTime: DefaultKeepaliveMinTime,
		CloseTimeout:     DefaultCloseTimeout,
	}
}

// Validate reports the first invalid field of c, wrapping ErrConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Group == "":
		return bad("Group is empty")
	case len(c.Peers) < 1:
		return bad("Peers is empty")
	case c.Rank < 0 || c.Rank >= len(c.Peers):
		return bad("Rank %d not in [0, %d)", c.Rank, len(c.Peers))
	}
	for r, addr := range c.Peers {
		if r != c.Rank && addr == "" {
			return bad("Peers[%d] is empty", r)
		}
	}
	if c.Listener == nil && c.ListenAddr == "" && c.Peers[c.Rank] == "" {
		return bad("no Listener, ListenAddr or Peers[%d] to listen on", c.Rank)
	}
	switch {
	case c.TLS != nil && c.Plaintext:
		return bad("both TLS and Plaintext are set")
	case c.TLS == nil && !c.Plaintext:
		return bad("neither TLS nor Plaintext is set (plaintext only when asked for)")
	case c.MaxMessageBytes < 1 || c.MaxMessageBytes > MaxMessageBytesLimit:
		return bad("MaxMessageBytes %d not in [1, %d]", c.MaxMessageBytes, MaxMessageBytesLimit)
	case c.SendQueue < 1:
		return bad("SendQueue %d < 1", c.SendQueue)
	case c.KeepaliveTime < MinKeepaliveTime:
		return bad("KeepaliveTime %v < %v (gRPC's minimum for clients)", c.KeepaliveTime, MinKeepaliveTime)
	case c.KeepaliveTimeout <= 0:
		return bad("KeepaliveTimeout %v <= 0", c.KeepaliveTimeout)
	case c.KeepaliveMinTime <= 0:
		return bad("KeepaliveMinTime %v <= 0", c.KeepaliveMinTime)
	case c.KeepaliveMinTime > c.KeepaliveTime:
		return bad("KeepaliveMinTime %v > KeepaliveTime %v: servers would cut off clients for pinging too often", c.KeepaliveMinTime, c.KeepaliveTime)
	case c.CloseTimeout <= 0:
		return bad("CloseTimeout %v <= 0", c.CloseTimeout)
	}
	return nil
}

// grpcLimit is the gRPC message size limit for c.MaxMessageBytes.
func (c Config) grpcLimit() int { return c.MaxMessageBytes + frameOverhead }

func (c Config) credentials() credentials.TransportCredentials {
	if c.TLS != nil {
		return credentials.NewTLS(c.TLS)
	}
	return insecure.NewCredentials()
}

// serverOptions are the options of this member's gRPC server.
func (c Config) serverOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.Creds(c.credentials()),
		grpc.MaxRecvMsgSize(c.grpcLimit()),
		grpc.MaxSendMsgSize(c.grpcLimit()),
		grpc.ForceServerCodecV2(frameCodec{}),
		grpc.ConnectionTimeout(serverHandshakeTimeout),
		grpc.MaxConcurrentStreams(serverMaxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             c.KeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:              c.KeepaliveTime,
			Timeout:           c.KeepaliveTimeout,
			MaxConnectionIdle: serverMaxIdle,
		}),
	}
	return append(opts, c.ServerOptions...)
}

// dialOptions are the options of this member's connections to lower ranks.
// Reconnection backoff is short: New waits (WaitForReady) for a peer that
// is still starting, bounded by its ctx.
func (c Config) dialOptions() []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(c.credentials()),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(c.grpcLimit()),
			grpc.MaxCallSendMsgSize(c.grpcLimit()),
			grpc.ForceCodecV2(frameCodec{}),
		),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                c.KeepaliveTime,
			Timeout:             c.KeepaliveTimeout,
			PermitWithoutStream: true,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  50 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   time.Second,
			},
			MinConnectTimeout: 2 * time.Second,
		}),
	}
	return append(opts, c.DialOptions...)
}

func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.DiscardHandler)
}
