package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/worker"
)

// QuarantineName is where a server moves a damaged grid directory dir
// found at time now: "<dir>.corrupt-<UTC time>". A later server opens
// the grid on a fresh directory; VerifyDataDir lists these as
// quarantined.
func QuarantineName(dir string, now time.Time) string {
	return dir + ".corrupt-" + now.UTC().Format("20060102T150405.000Z")
}

// quarantineMark is in the name of every moved-aside directory.
const quarantineMark = ".corrupt-"

// VerifyConfig configures VerifyDataDir. The zero value is the default.
type VerifyConfig struct {
	// Repair moves each grid directory that a server would refuse to
	// open (damaged metadata, a format record that disagrees with the
	// directory's name) aside to QuarantineName, as a server does, so
	// that the next server opens that grid on a fresh directory.
	// Damaged sequences of a grid that opens are left to the server's
	// recovery, which reports and deletes them. Default false: report
	// only.
	Repair bool
	// LockTimeout bounds the wait for bbolt's lock on each file; a file
	// still locked then fails the verification with ErrDataDirInUse.
	// Default (0) 500ms.
	LockTimeout time.Duration
	// Now is the clock of the quarantine names; default time.Now.
	Now func() time.Time
}

// VerifyReport is what VerifyDataDir found.
type VerifyReport struct {
	// Grids are the grid directories, by path.
	Grids []GridVerdict
	// Quarantined are directories moved aside before (QuarantineName),
	// relative to the data directory: not opened by a server, not
	// verified.
	Quarantined []string
}

// Damaged says whether any grid is damaged.
func (r VerifyReport) Damaged() bool {
	return slices.ContainsFunc(r.Grids, func(g GridVerdict) bool { return !g.OK() })
}

// GridVerdict is one grid directory's verification.
type GridVerdict struct {
	// Dir is the directory relative to the data directory.
	Dir string
	// Err is why the grid is damaged as a whole (nil when it opened).
	Err error
	// Refused: a server would refuse the directory and quarantine it
	// (Err wraps tier.ErrCorrupt or pagestore.ErrOtherFormat).
	Refused bool
	// MovedTo is where Repair moved it, relative to the data directory.
	MovedTo string
	// Empty: no format record, nothing persisted yet.
	Empty bool
	// Sequences are the sequences recovery found, each with every page
	// of every hosted rank read back and checked.
	Sequences []SeqVerdict
	// Damaged are the sequences recovery would report damaged and
	// delete; CorruptSlots the slab slots whose check failed.
	Damaged      []worker.DamagedSeq
	CorruptSlots int
}

// OK says whether neither the grid nor any of its sequences is damaged.
func (g GridVerdict) OK() bool {
	return !(g.Err != nil || len(g.Damaged) > 0 || g.CorruptSlots > 0 ||
		slices.ContainsFunc(g.Sequences, func(s SeqVerdict) bool { return s.Err != nil }))
}

// SeqVerdict is one recovered sequence of a grid.
type SeqVerdict struct {
	// Grid and Seq name it (worker.RecoveredSeq); Recovered its
	// recovered lengths as there (LostTokens(): tokens of a crash to
	// re-append, not damage).
	Grid string
	Seq  uint64
	decode.Recovered
	// Pages is the pages read back, over the layers and hosted ranks.
	Pages int
	// Err is the first page that did not read back.
	Err error
}

// shapeRe is the end of a grid directory's name (gridDirBase and
// claimDir): the pages per rank and the hosted ranks' hash, then ".<n>".
var shapeRe = regexp.MustCompile(`-cap([0-9]+)-r[0-9a-f]{12}\.[0-9]+$`)

// VerifyDataDir checks every grid directory of the server data
// directory dir (ServerConfig.DataDir) offline: it takes the directory's
// lock (ErrDataDirInUse while a server runs on it), checks every bbolt
// file read-only (metastore.CheckFile), checks each grid's format record
// against its directory's name, then opens the grid as a server would
// on a copy (under dir, removed after: the recovery writes) and reads
// back every page of every recovered sequence, checking the slab
// records. The data directory itself is changed only by Repair. An
// error means nothing was verified (no such directory, in use); damage
// is in the report.
func VerifyDataDir(ctx context.Context, dir string, cfg VerifyConfig) (VerifyReport, error) {
	var rep VerifyReport
	if cfg.LockTimeout <= 0 {
		cfg.LockTimeout = 500 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if fi, err := os.Stat(dir); err != nil {
		return rep, fmt.Errorf("verify data dir: %w", err)
	} else if !fi.IsDir() {
		return rep, fmt.Errorf("verify data dir: %s is not a directory", dir)
	}
	lock, err := lockDataDir(dir)
	if err != nil {
		return rep, fmt.Errorf("verify data dir: %w", err)
	}
	defer lock.unlock()
	grids, err := filepath.Glob(filepath.Join(dir, "grids", "*", "*"))
	if err != nil {
		return rep, fmt.Errorf("verify data dir: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "verify-*.tmp")
	if err != nil {
		return rep, fmt.Errorf("verify data dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer be.Close()
	for _, g := range grids {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		rel, _ := filepath.Rel(dir, g)
		if strings.Contains(filepath.Base(g), quarantineMark) {
			rep.Quarantined = append(rep.Quarantined, rel)
			continue
		}
		if fi, err := os.Stat(g); err != nil || !fi.IsDir() {
			continue
		}
		v, err := verifyGrid(ctx, g, filepath.Join(tmp, "grid"), be, cfg)
		if err != nil {
			return rep, fmt.Errorf("verify data dir: %s: %w", rel, err)
		}
		v.Dir = rel
		if v.Refused && cfg.Repair {
			moved := QuarantineName(g, cfg.Now())
			if err := os.Rename(g, moved); err != nil {
				return rep, fmt.Errorf("verify data dir: quarantine %s: %w", rel, err)
			}
			v.MovedTo, _ = filepath.Rel(dir, moved)
		}
		rep.Grids = append(rep.Grids, v)
	}
	return rep, nil
}

// verifyGrid checks one grid directory g, opening a copy in tmp; the
// error is one that stops the whole verification (a file in use).
func verifyGrid(ctx context.Context, g, tmp string, be kernels.Backend, cfg VerifyConfig) (GridVerdict, error) {
	var v GridVerdict
	refuse := func(err error) (GridVerdict, error) {
		v.Err, v.Refused = err, errors.Is(err, tier.ErrCorrupt) || errors.Is(err, pagestore.ErrOtherFormat)
		return v, nil
	}
	// Every bbolt file, read-only, before anything opens it for writing.
	var dbs []string
	err := filepath.WalkDir(g, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".db") {
			dbs = append(dbs, p)
		}
		return err
	})
	if err != nil {
		return v, err
	}
	for _, p := range dbs {
		err := metastore.CheckFile(p, cfg.LockTimeout)
		rel, _ := filepath.Rel(g, p)
		switch {
		case errors.Is(err, metastore.ErrInUse):
			return v, fmt.Errorf("%s: %w (bbolt's lock is held)", rel, ErrDataDirInUse)
		case errors.Is(err, metastore.ErrCorrupt):
			return refuse(fmt.Errorf("%s: %w: %w", rel, tier.ErrCorrupt, err))
		case err != nil:
			return v, fmt.Errorf("%s: %w", rel, err)
		}
	}
	f, ok, err := worker.ReadDataDirFormat(g, cfg.LockTimeout)
	if errors.Is(err, pagestore.ErrInUse) {
		return v, fmt.Errorf("%w: %w", ErrDataDirInUse, err)
	}
	if err != nil {
		return refuse(err)
	}
	if !ok {
		v.Empty = true
		return v, nil
	}
	m := shapeRe.FindStringSubmatch(filepath.Base(g))
	if m == nil {
		v.Err = fmt.Errorf("the directory's name is not a grid's (%s)", filepath.Base(g))
		return v, nil
	}
	capacity, _ := strconv.Atoi(m[1])
	c := worker.DefaultConfig() // the policy is not the directory's: any valid one
	c.Layers, c.Geometry, c.CP, c.TP, c.Capacity = f.Layers, f.Geometry, f.CP, f.TP, capacity
	// The directory's name is the shape a server opens it with; a
	// format record of another shape is refused as the server refuses it.
	want := strings.TrimSuffix(filepath.Base(g), filepath.Ext(g))
	if have := filepath.Base(gridDirBase("", "x", c, f.Ranks)); have != want {
		return refuse(fmt.Errorf("%w: the format record describes grid shape %s, the directory is %s", pagestore.ErrOtherFormat, have, want))
	}
	if err := c.Validate(); err != nil {
		return refuse(fmt.Errorf("%w: format record: %w", pagestore.ErrOtherFormat, err))
	}
	// A copy, opened as a server opens it: recovery writes.
	if err := os.RemoveAll(tmp); err != nil {
		return v, err
	}
	if err := copyTree(g, tmp); err != nil {
		return v, fmt.Errorf("copy to %s: %w", tmp, err)
	}
	defer os.RemoveAll(tmp)
	c.DataDir = tmp
	groups := map[int][]collective.Transport{}
	specs := make([]worker.RankSpec, len(f.Ranks))
	for i, r := range f.Ranks {
		if groups[r.TP] == nil {
			groups[r.TP] = collective.NewInprocGroup(c.CP)
		}
		specs[i] = worker.RankSpec{Rank: r, Backend: be, Transport: groups[r.TP][r.CP]}
	}
	defer func() {
		for _, g := range groups {
			for _, t := range g {
				t.Close()
			}
		}
	}()
	l, err := worker.NewLocal(c, specs)
	if err != nil {
		if errors.Is(err, tier.ErrCorrupt) || errors.Is(err, pagestore.ErrOtherFormat) {
			return refuse(err)
		}
		v.Err = err
		return v, nil
	}
	defer l.Close()
	rep := l.Recovery()
	v.Damaged, v.CorruptSlots = rep.Damaged, rep.CorruptSlots()
	for _, r := range rep.Sequences {
		s := SeqVerdict{Grid: r.Grid, Seq: r.Seq, Recovered: r.Recovered}
		if err := l.Claim(ctx, r.Key, r.Key); err != nil {
			s.Err = err
		} else {
			s.Pages, s.Err = readBack(ctx, l, c, f.Ranks, r.Key)
		}
		v.Sequences = append(v.Sequences, s)
	}
	return v, nil
}

// readBack reads every page of sequence seq on every hosted rank and
// layer; it returns the pages read and the first failure.
func readBack(ctx context.Context, l *worker.Local, c worker.Config, ranks []worker.Rank, seq uint64) (int, error) {
	blk := c.KVHeadsPerRank() * c.PageSize * c.HeadDim
	k, vv := make([]float32, blk), make([]float32, blk)
	pages := 0
	for _, r := range ranks {
		st := l.Shard(r).Store()
		id, err := l.StoreSeq(seq, r)
		if err != nil {
			return pages, err
		}
		table, err := st.AppendPageTable(nil, id)
		if err != nil {
			return pages, fmt.Errorf("rank %v: %w", r, err)
		}
		for layer := range c.Layers {
			n, err := st.LayerLen(id, layer)
			if err != nil {
				return pages, fmt.Errorf("rank %v: %w", r, err)
			}
			np := (n + c.PageSize - 1) / c.PageSize
			if np > len(table) {
				return pages, fmt.Errorf("rank %v layer %d: %d tokens, a page table of %d pages", r, layer, n, len(table))
			}
			for p := range np {
				if err := st.ReadKV(ctx, layer, table[p], k, vv); err != nil {
					return pages, fmt.Errorf("rank %v layer %d page %d: %w", r, layer, p, err)
				}
				pages++
			}
		}
	}
	return pages, nil
}

// copyTree copies the files of directory src into a new directory dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}
