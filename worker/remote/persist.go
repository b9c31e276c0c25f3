package remote

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/worker"
)

// Persistence of a server's grids (ServerConfig.DataDir). Layout:
//
//	DIR/LOCK                          held (flock) by the server for its
//	                                  life; holds its pid
//	DIR/grids/<owner>/<shape>.<n>/    one grid's worker data directory
//	                                  (worker.Config.DataDir)
//
// <owner> is the grid's coordinator (the grid id without its last two
// parts, "/<instance>/<number>", which change with every coordinator
// process), <shape> what fixes the grid's pages: layers, geometry,
// dtype, CP x TP, pages per rank and (a hash of) the ranks this node
// hosts; the policy, selection mode and offload settings may change
// between restarts. <n> is the lowest number no open grid of the same
// owner and shape uses: a restarted node's first grid of a shape finds
// the directory of the first grid of that shape before the restart.

// ErrDataDirInUse: another process holds the server's data directory.
var ErrDataDirInUse = errors.New("data directory in use by another process")

// lockName is the lock file of a server's data directory.
const lockName = "LOCK"

// dataLock is a held lock of a data directory.
type dataLock struct{ f *os.File }

// lockDataDir creates dir and takes its lock (without waiting); the
// error names the directory and, when another process holds it, the pid
// it wrote.
func lockDataDir(dir string) (*dataLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("worker server: data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("worker server: data dir %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := strings.TrimSpace(string(b[:n]))
			if holder == "" {
				holder = "?"
			}
			return nil, fmt.Errorf("worker server: data dir %s: %w (pid %s holds %s)", dir, ErrDataDirInUse, holder, path)
		}
		return nil, fmt.Errorf("worker server: data dir %s: lock %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dataLock{f: f}, nil
}

// unlock releases the lock (closing the file drops the flock).
func (l *dataLock) unlock() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}

// gridOwner returns the coordinator part of a grid id
// ("node/instance/number" -> "node"; an id of another form is its own
// owner).
func gridOwner(id string) string {
	if i := strings.LastIndexByte(id, '/'); i > 0 {
		if j := strings.LastIndexByte(id[:i], '/'); j > 0 {
			return id[:j]
		}
	}
	return id
}

// safeName maps s onto a file name: letters, digits, '.', '-' and '_'
// stay, any other byte becomes '_'; names of only dots get a prefix.
func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	out := string(b)
	if strings.Trim(out, ".") == "" {
		out = "_" + out
	}
	return out
}

// gridDirBase returns DIR/grids/<owner>/<shape> for a grid (without the
// ".<n>" suffix).
func gridDirBase(dir, id string, c worker.Config, ranks []worker.Rank) string {
	h := sha256.New()
	for _, r := range ranks {
		fmt.Fprintf(h, "%d.%d,", r.TP, r.CP)
	}
	shape := fmt.Sprintf("l%d-q%d-kv%d-d%d-s%d-%v-cp%d-tp%d-cap%d-r%s",
		c.Layers, c.QHeads, c.KVHeads, c.HeadDim, c.PageSize, c.DType, c.CP, c.TP, c.Capacity, hex.EncodeToString(h.Sum(nil)[:6]))
	return filepath.Join(dir, "grids", safeName(gridOwner(id)), safeName(shape))
}

// RecoveryStats counts what the server's grids recovered from the data
// directory since the server started (ServerConfig.DataDir).
type RecoveryStats struct {
	// Grids counts the grids opened on a data directory that held
	// sequences or damage.
	Grids int
	// Sequences, LostTokens and Damaged are the worker reports' sums
	// (worker.RecoveryReport): sequences recovered, tokens they lost
	// (to re-append), sequences found and not recovered; CorruptSlots
	// the slab slots whose check failed.
	Sequences, LostTokens, Damaged, CorruptSlots int
	// RolledBack is the sum of worker.RecoveryReport.RolledBackTokens:
	// the tokens (summed over layers) of interrupted steps that recovery
	// cut from the recovered sequences.
	RolledBack int
	// Parked is the recovered sequences of the connected grids that no
	// coordinator claimed yet (worker.Local.Parked), now.
	Parked int
}

// claimDir returns the lowest-numbered directory of base no open grid
// uses, and marks it used (s.mu held).
func (s *Server) claimDir(base string) string {
	for n := 0; ; n++ {
		d := base + "." + strconv.Itoa(n)
		if !s.dirs[d] {
			s.dirs[d] = true
			return d
		}
	}
}

// encodeRecovered is a node's ConnectGridReply.recovered entry.
func encodeRecovered(e *enc, r worker.RecoveredSeq) *workerv1.RecoveredSeq {
	out := &workerv1.RecoveredSeq{Key: r.Key, Seq: r.Seq, Grid: r.Grid, Placement: r.Placement, Layout: encodeLayout(e, r.Layout),
		Had: e.u32("had", r.Had), LostTokens: e.u32("lost tokens", r.LostTokens)}
	for _, n := range r.Lens {
		out.Lens = append(out.Lens, e.u32("lens", n))
	}
	for _, n := range r.RolledBack {
		out.RolledBack = append(out.RolledBack, e.u32("rolled back", n))
	}
	return out
}

// decodeRecovered is the client's side of encodeRecovered.
func decodeRecovered(d *dec, r *workerv1.RecoveredSeq, layers int) worker.RecoveredSeq {
	out := worker.RecoveredSeq{Key: r.GetKey(), Seq: r.GetSeq(), Grid: r.GetGrid(), Placement: r.GetPlacement(), Layout: decodeLayout(d, r.GetLayout()),
		Had: toInt(d, "had", r.GetHad()), LostTokens: toInt(d, "lost_tokens", r.GetLostTokens())}
	if n := len(r.GetPlacement()); n != 0 && n != out.Layout.CP*out.Layout.TP {
		d.fail("recovered sequence %d: placement of %d nodes for %d ranks", r.GetKey(), n, out.Layout.CP*out.Layout.TP)
		return out
	}
	if len(r.GetLens()) != layers {
		d.fail("recovered sequence %d: %d lengths for %d layers", r.GetKey(), len(r.GetLens()), layers)
		return out
	}
	for _, n := range r.GetLens() {
		out.Lens = append(out.Lens, toInt(d, "lens", n))
	}
	if rb := r.GetRolledBack(); len(rb) != 0 {
		if len(rb) != layers {
			d.fail("recovered sequence %d: %d rolled back counts for %d layers", r.GetKey(), len(rb), layers)
			return out
		}
		for _, n := range rb {
			out.RolledBack = append(out.RolledBack, toInt(d, "rolled_back", n))
		}
	}
	return out
}

// Claim implements workerv1.WorkerServer (worker.Local.Claim).
func (s *Server) Claim(ctx context.Context, r *workerv1.ClaimRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		return g.local.Claim(ctx, r.GetKey(), r.GetSeq())
	}))
}

// Park implements workerv1.WorkerServer (worker.Local.Park).
func (s *Server) Park(ctx context.Context, r *workerv1.ParkRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		return g.local.Park(ctx, r.GetSeq())
	}))
}

// DropRecovered implements workerv1.WorkerServer
// (worker.Local.DropRecovered).
func (s *Server) DropRecovered(ctx context.Context, r *workerv1.DropRecoveredRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		return g.local.DropRecovered(ctx, r.GetKey())
	}))
}

// Recovered returns the sequences the client's node recovered for the
// grid from its data directory when the grid connected (ServerConfig
// DataDir), parked until [Client.Claim] or [Client.DropRecovered]: what
// a coordinator adopts after a restart. Ranks on other nodes recover
// their own: the lengths all of them hold are the smallest Lens over
// the grid's clients, the length before the stop the largest Had.
func (c *Client) Recovered() []worker.RecoveredSeq { return c.recovered }

// Claim makes recovered sequence key live again as sequence seq on the
// client's node (worker.Local.Claim).
func (c *Client) Claim(ctx context.Context, key, seq uint64) error {
	_, err := c.api.Claim(ctx, &workerv1.ClaimRequest{Ref: c.ref, Key: key, Seq: seq})
	return FromStatus(err)
}

// DropRecovered frees recovered sequence key on the client's node
// (worker.Local.DropRecovered).
func (c *Client) DropRecovered(ctx context.Context, key uint64) error {
	_, err := c.api.DropRecovered(ctx, &workerv1.DropRecoveredRequest{Ref: c.ref, Key: key})
	return FromStatus(err)
}

// Park parks sequence seq, which Claim made live, again on the client's
// node (worker.Local.Park).
func (c *Client) Park(ctx context.Context, seq uint64) error {
	_, err := c.api.Park(ctx, &workerv1.ParkRequest{Ref: c.ref, Seq: seq})
	return FromStatus(err)
}
