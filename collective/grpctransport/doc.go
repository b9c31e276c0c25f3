// Package grpctransport is the gRPC implementation of collective.Transport:
// the ranks of one group, each in its own process (or all in one, for
// tests), exchange the group operations' byte messages over gRPC.
//
// # Streams
//
// Every pair of ranks shares exactly one long-lived bidirectional stream of
// the Collective service (api/collective/v1): the higher rank dials the
// lower one once, in New, and both directions of the pair's traffic use
// that stream for the life of the group. Nothing is dialed per step or per
// message. The stream opens with a Hello each way (group id, rank, group
// size, the largest message the sender accepts), so a stream of another
// group, a group of another size or a duplicate rank is refused at once.
//
// Each stream has one sender goroutine, the only one that writes to it:
// Send copies the message into a bounded per-peer queue and returns, so a
// rank can send every message of a round before receiving any. Each stream
// has one reader that files incoming (tag, bytes) frames into per-(sender,
// tag) mailboxes, where Recv finds them; the reader never waits for a Recv,
// so gRPC's flow control always drains. Every goroutine belongs to the
// Transport and Close stops them all.
//
// # Failures
//
// A stream that breaks (the peer process died, its connection was reset,
// keepalive found it unreachable) or a peer that closed its Transport makes
// Recv from that peer fail with an error wrapping collective.ErrPeerClosed,
// once the messages the reader had already received from it are consumed,
// and Send to it fail the same way; pending calls fail at once. Messages
// still queued or in flight when a stream breaks are lost with it (Send
// reports the loss from the moment the link is known to be gone). A link is
// not re-established: a group is one incarnation, and the layer above (the
// cluster) builds a new group, under a new group id, after a failure. Close
// makes every call fail with collective.ErrClosed, tells each peer with a
// Bye after the messages already queued for it, and waits up to
// Config.CloseTimeout for the peers to acknowledge.
//
// # Configuration
//
// Config documents every setting; DefaultConfig gives the defaults and
// Validate checks a Config. Connections use TLS (Config.TLS, mutual when
// the tls.Config asks for client certificates) or, only when asked for,
// plaintext (Config.Plaintext). Message sizes are limited explicitly on
// both sides (Config.MaxMessageBytes): Send refuses a larger message with
// ErrTooLarge and the stream stays up. Keepalive is configured compatibly
// on both sides: clients ping every KeepaliveTime, servers accept pings as
// often as every KeepaliveMinTime <= KeepaliveTime.
//
// NewLocalGroup builds a whole group in one process on 127.0.0.1 with
// ephemeral ports (tests, benchmarks).
package grpctransport
