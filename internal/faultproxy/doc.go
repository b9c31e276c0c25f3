// Package faultproxy is a TCP proxy that injects network faults into the
// connections it forwards: a fixed latency, latency spikes and emulated
// packet loss. It stands in for tc netem where the kernel has none (the
// e2e chaos tests put questd's node-to-node gRPC traffic through one
// proxy per node).
//
// A [Proxy] listens, and for every connection it accepts dials its
// [Config.Target] and copies bytes both ways. Each direction is read as
// it arrives and cut into chunks of at most [Config.ChunkSize] bytes (by
// default 1448, one TCP segment on Ethernet), and each chunk gets a
// release time, decided when it is read:
//
//	release = max(arrival + Latency + spike + stall, release of the previous chunk)
//
// so that the bytes of a direction stay in order, and a chunk held back
// holds back every chunk behind it (head-of-line blocking, as in TCP).
// spike is [Faults.SpikeDelay] for a chunk drawn with probability
// [Faults.SpikeProb], or read within a periodic window (the first
// [Faults.SpikeFor] of every [Faults.SpikeEvery] since the proxy
// started); stall is [Faults.LossDelay] for a chunk "lost" with
// probability [Faults.LossProb] under [LossStall]. A writer per direction
// sends each chunk at its release time. Reading does not wait for the
// delays (up to a bounded queue of chunks), so a latency does not cut
// the throughput, as on a long link.
//
// # Which loss emulates packet loss
//
// TCP hides a lost segment from the application: the sender retransmits
// it, and the receiver's stream stops at the hole until the copy
// arrives. What the application sees of p packet loss is therefore that
// a fraction p of the segments arrive late, by about one retransmission
// timeout (Linux's minimum RTO is 200 ms; fast retransmit or a tail-loss
// probe can be quicker, a loss of the retransmission slower), with
// everything behind them. [LossStall] (the default) is exactly that:
// with LossProb 0.05, ChunkSize 1448 and LossDelay 200 ms, 5% of the
// segments and the bytes queued behind them are held 200 ms. That is the
// mode that emulates 5% packet loss. The loss of ACKs is not modelled
// (cumulative ACKs hide most of it), nor the sender's congestion window
// shrinking.
//
// [LossReset] instead resets the connection (an RST both ways, through
// SO_LINGER 0) at a chunk drawn with probability LossProb. Packet loss
// alone never does that to a TCP connection; it emulates what a
// middlebox or a peer that drops state does, or a loss long enough for
// the connection to time out, and exercises the callers' reconnects and
// failure paths.
//
// # Ownership
//
// The proxy has no global state: its random source is its own, seeded
// by [Config.Seed], so a run is repeatable for the same sequence of
// reads. Every goroutine it starts (the accept loop, the context watch,
// and per connection a dialer, two readers and two writers) is tracked
// and ended by [Proxy.Close], which closes the listener and every
// connection and waits for them; the context given to [Listen] or [New]
// ending closes the proxy as Close does (Close must still be called to
// wait). [Proxy.SetFaults] changes the faults at any time; chunks
// already queued keep their release times.
package faultproxy
