package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/tmpfstest"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// persistRecorder records what Config.OnPersistError gets.
type persistRecorder struct {
	mu  sync.Mutex
	got []*pagestore.IOError
}

func (r *persistRecorder) report(e *pagestore.IOError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, e)
}

func (r *persistRecorder) all() []*pagestore.IOError {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pagestore.IOError(nil), r.got...)
}

// newPersistLocal opens a one-rank persisting worker on dir that reports
// to rec.
func newPersistLocal(t *testing.T, dir string, rec *persistRecorder, capacity int) (*Local, Config) {
	t.Helper()
	cfg := testConfig(Exact)
	cfg.CP, cfg.DataDir, cfg.OnPersistError, cfg.Capacity = 1, dir, rec.report, capacity
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	t.Cleanup(func() { be.Close() })
	tr := collective.NewInprocGroup(1)
	t.Cleanup(func() { tr[0].Close() })
	l, err := NewLocal(cfg, []RankSpec{{Rank: Rank{}, Backend: be, Transport: tr[0]}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, cfg
}

// appendTokens appends n random tokens to every layer of seq (one rank)
// and returns the first error.
func appendTokens(l *Local, cfg Config, rng *rand.Rand, seq uint64, start, n int) error {
	tok := cfg.KVHeads * cfg.HeadDim
	for layer := range cfg.Layers {
		m := AppendRequest{Seq: seq, Layer: layer, Start: start, Tokens: n, K: randVec(rng, n*tok), V: randVec(rng, n*tok)}
		if err := l.Append(context.Background(), m); err != nil {
			return err
		}
	}
	return nil
}

// TestPersistErrorsReported: the failures of a worker's files reach
// Config.OnPersistError with the file, and its callers get an error
// wrapping pagestore.ErrPersist (and ErrIO for an errno) whose message
// names no path: a page store's (its directory gone: the slab file
// cannot be created) and the sequence table's.
func TestPersistErrorsReported(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "grid")
	rec := &persistRecorder{}
	l, cfg := newPersistLocal(t, dir, rec, 64)
	lay := plan.Layout{CP: 1, TP: 1, Placement: plan.Striped, BlockPages: 2}
	if err := l.Create(context.Background(), CreateRequest{Seq: 1, Layout: lay}); err != nil {
		t.Fatal(err)
	}
	rankDir := RankDir(dir, Rank{})
	if err := os.RemoveAll(rankDir); err != nil {
		t.Fatal(err)
	}
	err := appendTokens(l, cfg, rand.New(rand.NewPCG(1, 1)), 1, 0, cfg.PageSize)
	if !errors.Is(err, pagestore.ErrIO) || !errors.Is(err, syscall.ENOENT) || errors.Is(err, pagestore.ErrDiskFull) || !errors.Is(err, ErrChanged) {
		t.Fatalf("append whose page cannot be written: %v, want ErrIO (ENOENT) and ErrChanged (it took effect in memory)", err)
	}
	if strings.Contains(err.Error(), dir) {
		t.Errorf("message names a path: %q", err)
	}
	got := rec.all()
	if len(got) != 1 || got[0].Op != "write page" || !strings.HasPrefix(got[0].Path, rankDir) || got[0].Closing {
		t.Fatalf("reported %+v, want one page write in %s", got, rankDir)
	}
	t.Logf("reported: %s of %s: %v", got[0].Op, got[0].Path, got[0].Err)

	l.db.Close() // the sequence table fails from here on
	err = l.Create(context.Background(), CreateRequest{Seq: 2, Layout: lay})
	var ie *pagestore.IOError
	if !errors.As(err, &ie) || !errors.Is(err, pagestore.ErrPersist) || strings.Contains(err.Error(), dir) {
		t.Fatalf("create with the sequence table closed: %v, want a pagestore.IOError naming no path", err)
	}
	got = rec.all()
	if len(got) != 2 || got[1].Op != "commit sequence table" || got[1].Path != filepath.Join(dir, tableName) {
		t.Fatalf("reported %+v, want the sequence table's commit second", got)
	}
}

// TestPersistDiskFullTmpfs: a persisting worker on a real 512 KiB tmpfs
// (mounted in a user and mount namespace of its own; skipped where that
// is not permitted) fills it: the append that fails wraps
// pagestore.ErrDiskFull and ENOSPC and says "disk full" without a path,
// Config.OnPersistError got the file, and the Close that cannot save the
// tails fails with ErrDiskFull, its failures reported as a Close's.
func TestPersistDiskFullTmpfs(t *testing.T) {
	tmpfstest.Run(t, 512, persistDiskFullIn)
}

func persistDiskFullIn(t *testing.T, dir string) {
	rec := &persistRecorder{}
	l, cfg := newPersistLocal(t, filepath.Join(dir, "grid"), rec, 512)
	rng := rand.New(rand.NewPCG(2, 2))
	lay := plan.Layout{CP: 1, TP: 1, Placement: plan.Striped, BlockPages: 2}
	var fail error
	tokens := 0
	for seq := uint64(1); fail == nil && seq <= 256; seq++ {
		if fail = l.Create(context.Background(), CreateRequest{Seq: seq, Layout: lay}); fail != nil {
			break
		}
		// A page and a half: one sealed page written, a tail.
		n := cfg.PageSize + cfg.PageSize/2
		if fail = appendTokens(l, cfg, rng, seq, 0, n); fail == nil {
			tokens += n
		}
	}
	if fail == nil {
		t.Fatalf("no error after %d tokens on a 512 KiB tmpfs", tokens)
	}
	t.Logf("tmpfs: the first failure after %d tokens: %v", tokens, fail)
	if !errors.Is(fail, pagestore.ErrDiskFull) || !errors.Is(fail, syscall.ENOSPC) || !strings.Contains(fail.Error(), "disk full (no space left on device)") || strings.Contains(fail.Error(), dir) {
		t.Errorf("the first failure on a full tmpfs: %v", fail)
	}
	got := rec.all()
	if len(got) == 0 || !strings.HasPrefix(got[0].Path, dir) || !errors.Is(got[0], pagestore.ErrDiskFull) {
		t.Fatalf("reported %+v", got)
	}
	t.Logf("tmpfs: reported %s of %s", got[0].Op, got[0].Path)
	n := len(got)
	err := l.Close()
	if !errors.Is(err, pagestore.ErrDiskFull) || strings.Contains(err.Error(), dir) {
		t.Errorf("Close on the full tmpfs: %v", err)
	}
	closing := rec.all()[n:]
	if len(closing) == 0 {
		t.Error("the Close reported nothing")
	}
	for _, e := range closing {
		if !e.Closing {
			t.Errorf("a Close's failure without Closing: %+v", e)
		}
	}
}
