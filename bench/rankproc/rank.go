package rankproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/grpctransport"
	"github.com/questrt/questrt/internal/memlimit"
)

// Rank is one child's part: rank Rank of the Size-rank gRPC group
// Group, running collective.BenchRank of Bench at batch Batch or, with
// Sweep, collective.SweepRank of SweepConfig (its Steps and Warmup taken
// from Bench), for at most Timeout.
type Rank struct {
	Group             string
	Rank, Size, Batch int
	Timeout           time.Duration
	Bench             collective.BenchConfig
	Sweep             bool
	SweepConfig       collective.SweepConfig
}

// RunRank is the child: it listens on 127.0.0.1, writes its Hello line
// to stdout, reads the Peers line from stdin, connects the group over
// gRPC (plaintext), runs its part and writes its samples as one JSON
// line to stdout. It stops when stdin closes (the parent is gone) or
// r.Timeout passes.
func RunRank(ctx context.Context, r Rank, stdin io.Reader, stdout io.Writer) error {
	c := r.Bench
	c.Transport = "grpc"
	c.MaxMemory = memlimit.NoLimit // the parent checked the group's
	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("rank %d: %w", r.Rank, err)
	}
	defer ln.Close() // the transport closes it too; a second Close is harmless
	if err := bench.WriteJSONLine(stdout, Hello{Rank: r.Rank, PID: os.Getpid(), Addr: ln.Addr().String()}); err != nil {
		return fmt.Errorf("rank %d: %w", r.Rank, err)
	}
	peers, err := readPeers(ctx, cancel, stdin)
	if err != nil {
		return fmt.Errorf("rank %d: peers: %w", r.Rank, err)
	}
	if len(peers) != r.Size || peers[r.Rank] != ln.Addr().String() {
		return fmt.Errorf("rank %d: peers %q: want %d addresses with this rank's, %s, at %d", r.Rank, peers, r.Size, ln.Addr(), r.Rank)
	}
	cfg := grpctransport.DefaultConfig()
	cfg.Group, cfg.Rank, cfg.Peers, cfg.Listener, cfg.Plaintext = r.Group, r.Rank, peers, ln, true
	sw := r.SweepConfig
	if r.Sweep {
		sw.Steps, sw.Warmup, sw.MaxMemory, sw.Shards = c.Steps, c.Warmup, memlimit.NoLimit, []int{r.Size}
		cfg.MaxMessageBytes = max(cfg.MaxMessageBytes, int(sw.MaxMsgBytes()))
	}
	tr, err := grpctransport.New(ctx, cfg)
	if err != nil {
		return fmt.Errorf("rank %d: connect: %w", r.Rank, err)
	}
	defer tr.Close()
	if r.Sweep {
		samples, err := collective.SweepRank(ctx, sw, tr)
		if err != nil {
			return err
		}
		return bench.WriteJSONLine(stdout, samples)
	}
	samples, err := collective.BenchRank(ctx, c, r.Batch, tr)
	if err != nil {
		return err
	}
	return bench.WriteJSONLine(stdout, samples)
}

// readPeers reads the parent's peers line from stdin, then keeps reading
// it on a goroutine and calls cancel when it closes: the parent is gone,
// or done with this rank.
func readPeers(ctx context.Context, cancel context.CancelFunc, stdin io.Reader) ([]string, error) {
	type result struct {
		peers []string
		err   error
	}
	got := make(chan result, 1)
	go func() {
		br := bufio.NewReader(stdin)
		line, err := br.ReadBytes('\n')
		if err != nil {
			got <- result{err: fmt.Errorf("stdin: %w", err)}
			cancel()
			return
		}
		var p Peers
		if err := json.Unmarshal(line, &p); err != nil {
			got <- result{err: fmt.Errorf("stdin: %w", err)}
			cancel()
			return
		}
		got <- result{peers: p.Peers}
		io.Copy(io.Discard, br)
		cancel()
	}()
	select {
	case r := <-got:
		return r.peers, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
