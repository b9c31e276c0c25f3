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
	"sync"

	"golang.org/x/sys/unix"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/pagestore"
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
// the directory of the first grid of that shape before the restart. A
// directory that a closed grid's worker still holds (closing) is waited
// for, not skipped: the grid opened to replace a lost one recovers it.

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
	l, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("worker server: data dir %s: %w", dir, err)
	}
	return l, nil
}

// lockDir is lockDataDir with errors that do not name dir (those of
// another process's lock name its pid and the lock file).
func lockDir(dir string) (*dataLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
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
			return nil, fmt.Errorf("%w (pid %s holds %s)", ErrDataDirInUse, holder, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dataLock{f: f}, nil
}

// DataDirLock is a data directory's lock taken before its server is
// made (LockDataDir), so that a process can claim everything it needs
// before it starts anything and hand it on ([ServerConfig.DataDirLock]).
type DataDirLock struct {
	dir  string
	l    *dataLock
	once sync.Once
}

// LockDataDir creates dir and takes its lock, as [NewServer] does,
// without waiting: another process's lock fails with [ErrDataDirInUse]
// naming its pid and the lock file (the error does not name dir).
// Close it, or hand it to NewServer, which takes it over.
func LockDataDir(dir string) (*DataDirLock, error) {
	l, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	return &DataDirLock{dir: dir, l: l}, nil
}

// Close releases the lock; later calls do nothing.
func (d *DataDirLock) Close() error {
	var err error
	d.once.Do(func() { err = d.l.unlock() })
	return err
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

// dirHold is a grid directory in use: by grid g from its ConnectGrid
// until it is closed; released is closed when g gives it back.
type dirHold struct {
	g        *grid
	released chan struct{}
}

// claimDir returns the lowest-numbered directory of base that no open
// grid uses, and marks it used by g (s.mu held; it lets go of s.mu while
// it waits). A directory that a closed grid still holds (its worker
// closing: CloseGrid, a sweep, a failed connect) is waited for, not
// skipped: its grid's successor, the grid its coordinator opens when
// it lost that one (a node of it restarted), is to recover it, and
// would find a fresh directory past it (".1") and nothing in it. The
// wait ends with ctx, with g's closing, or after ConnectTimeout.
func (s *Server) claimDir(ctx context.Context, g *grid, base string) (string, *dirHold, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	defer context.AfterFunc(g.ctx, cancel)()
	for {
		var busy *dirHold
		for n := 0; ; n++ {
			d := base + "." + strconv.Itoa(n)
			h := s.dirs[d]
			if h == nil {
				h = &dirHold{g: g, released: make(chan struct{})}
				s.dirs[d] = h
				return d, h, nil
			}
			if s.grids[h.g.id] != h.g {
				busy = h // closed, its worker closing: wait for it
				break
			}
			if h.g.state == connected && staleInstance(h.g.id, g.id) {
				// A grid of an earlier process of the same coordinator
				// (it restarted: a new instance in its grid ids): no
				// step comes for it again, and the membership's sweep
				// of it may come too late. Close it, then take its
				// directory.
				s.log.Warn("worker server: closing a grid of the coordinator's previous process for its directory", "grid", h.g.id, "for", g.id)
				s.forget(h.g)
				old := h.g
				s.mu.Unlock()
				if err := old.shut(); err != nil {
					s.log.Warn("close grid", "grid", old.id, "err", err)
				}
				s.mu.Lock()
				busy = h
				break
			}
		}
		if s.testHookClaimWait != nil {
			s.testHookClaimWait(base)
		}
		s.mu.Unlock()
		select {
		case <-busy.released:
		case <-ctx.Done():
		}
		s.mu.Lock()
		if err := ctx.Err(); err != nil {
			return "", nil, fmt.Errorf("grid directory: a closed grid still holds it: %w", context.Cause(ctx))
		}
		if s.closed {
			return "", nil, fmt.Errorf("worker server: %w", worker.ErrClosed)
		}
	}
}

// staleInstance reports whether grid ids old and cur ("name/instance/
// number") name the same coordinator with different instances.
func staleInstance(old, cur string) bool {
	on, oi, ok1 := cutGridID(old)
	cn, ci, ok2 := cutGridID(cur)
	return ok1 && ok2 && on == cn && oi != ci
}

// cutGridID splits "name/instance/number" into name and instance.
func cutGridID(id string) (name, instance string, ok bool) {
	i := strings.LastIndexByte(id, '/')
	if i <= 0 {
		return "", "", false
	}
	j := strings.LastIndexByte(id[:i], '/')
	if j <= 0 {
		return "", "", false
	}
	return id[:j], id[j+1 : i], true
}

// encodeRecovered is a node's ConnectGridReply.recovered entry.
func encodeRecovered(e *enc, r worker.RecoveredSeq) *workerv1.RecoveredSeq {
	out := &workerv1.RecoveredSeq{Key: r.Key, Seq: r.Seq, Grid: r.Grid, Placement: r.Placement, Layout: encodeLayout(e, r.Layout),
		Had: e.u32("had", r.Had), LostTokens: e.u32("lost tokens", r.LostTokens())}
	for _, n := range r.Lens {
		out.Lens = append(out.Lens, e.u32("lens", n))
	}
	for _, n := range r.RolledBack {
		out.RolledBack = append(out.RolledBack, e.u32("rolled back", n))
	}
	for _, n := range r.HadLens {
		out.HadLens = append(out.HadLens, e.u32("had lens", n))
	}
	out.HadExact = r.HadExact
	return out
}

// decodeRecovered is the client's side of encodeRecovered.
func decodeRecovered(d *dec, r *workerv1.RecoveredSeq, layers int) worker.RecoveredSeq {
	out := worker.RecoveredSeq{Key: r.GetKey(), Seq: r.GetSeq(), Grid: r.GetGrid(), Placement: r.GetPlacement(), Layout: decodeLayout(d, r.GetLayout()),
		Recovered: decode.Recovered{Had: toInt(d, "had", r.GetHad())}}
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
	if hl := r.GetHadLens(); len(hl) != 0 {
		if len(hl) != layers {
			d.fail("recovered sequence %d: %d lengths before the stop for %d layers", r.GetKey(), len(hl), layers)
			return out
		}
		for _, n := range hl {
			out.HadLens = append(out.HadLens, toInt(d, "had_lens", n))
		}
	}
	if he := r.GetHadExact(); len(he) != 0 {
		if len(he) != layers || len(out.HadLens) != layers {
			d.fail("recovered sequence %d: %d exact flags for %d layers and %d lengths before the stop", r.GetKey(), len(he), layers, len(out.HadLens))
			return out
		}
		out.HadExact = he
	}
	return out
}

// NotRecovered is what a node reported it could not recover of a grid
// when the grid connected (ConnectGridReply.damaged and quarantined).
type NotRecovered struct {
	// Quarantined, when not empty, says why the node found the grid's
	// data directory damaged and moved it aside: the grid opened on a
	// fresh one, so the node recovered none of its sequences.
	Quarantined string
	// Damaged are the sequences the node found and did not recover, by
	// increasing key: those its recovery found damaged, or, after a
	// quarantine, those the moved directory's table names.
	Damaged []DamagedSeq
}

// DamagedSeq is a sequence a node found in its data directory and did
// not recover.
type DamagedSeq struct {
	// Key is the node's handle it had; Seq and Grid name it as
	// worker.RecoveredSeq's do (Grid "" when its entry was unreadable).
	Key, Seq uint64
	Grid     string
	// Reason is why, without server paths.
	Reason string
}

// NotRecovered returns what the client's node reported it could not
// recover of the grid when it connected (ServerConfig.DataDir).
func (c *Client) NotRecovered() NotRecovered { return c.notRecovered }

// scrubPaths returns err's message with the data directory root and the
// grid's directory dir taken out (a reason that reaches clients names no
// server path): file names are then relative to the grid's directory.
func scrubPaths(err error, root, dir string) string {
	msg := err.Error()
	for _, p := range []string{dir, root} {
		if p == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, p+string(filepath.Separator), "")
		msg = strings.ReplaceAll(msg, p, "<data dir>")
	}
	return msg
}

// scrubDamage takes the server's paths out of err's message when err is
// a sequence's damage found at its first use (pagestore.ErrDamaged:
// the message names the slab file under the data directory), as
// scrubPaths does for a recovery's reasons; errors.Is still sees every
// sentinel it wraps. Other errors are returned as they are.
func (s *Server) scrubDamage(g *grid, err error) error {
	if err == nil || g.dir == "" || !errors.Is(err, pagestore.ErrDamaged) {
		return err
	}
	return &scrubbedError{msg: scrubPaths(err, s.cfg.DataDir, g.dir), err: err}
}

// scrubbedError is err with the message msg.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

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
