package pagestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/tmpfstest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
)

// TestIOErrorClassify: an *IOError wraps ErrPersist, ErrDiskFull for
// ENOSPC and EDQUOT (also when bbolt formatted the error away), ErrIO
// for another error number, neither otherwise, and the cause; its
// message names the operation and the condition and no path.
func TestIOErrorClassify(t *testing.T) {
	pathErr := func(errno syscall.Errno) error {
		return &os.PathError{Op: "write", Path: "/srv/data/grids/m0/g.1/rank-tp0-cp0/slab-000000", Err: errno}
	}
	for _, c := range []struct {
		err       error
		kind      error
		condition string
	}{
		{pathErr(syscall.ENOSPC), pagestore.ErrDiskFull, "disk full (no space left on device)"},
		{pathErr(syscall.EDQUOT), pagestore.ErrDiskFull, "disk full (disk quota exceeded)"},
		{fmt.Errorf("disktier /srv/data: write slot 3 to /srv/data/slab-000000 at 0: %w", pathErr(syscall.EIO)), pagestore.ErrIO, "input/output error"},
		{pathErr(syscall.EROFS), pagestore.ErrIO, "read-only file system"},
		{errors.New("file resize error: no space left on device"), pagestore.ErrDiskFull, "disk full (file resize error: no space left on device)"},
		{fmt.Errorf("disktier /srv/data: write slot 3: %w", tier.ErrClosed), nil, "disktier <path>: write slot 3: tier: closed"},
	} {
		e := &pagestore.IOError{Op: "write page", Path: "/srv/data/slab-000000", Err: c.err}
		var err error = e
		if !errors.Is(err, pagestore.ErrPersist) || !errors.Is(err, c.err) {
			t.Errorf("%v: does not wrap ErrPersist and its cause", c.err)
		}
		for _, k := range []error{pagestore.ErrDiskFull, pagestore.ErrIO} {
			if errors.Is(err, k) != (k == c.kind) {
				t.Errorf("%v: errors.Is(%v) = %v, want %v", c.err, k, !(k == c.kind), k == c.kind)
			}
		}
		if got := pagestore.IOKind(c.err); got != c.kind {
			t.Errorf("IOKind(%v) = %v, want %v", c.err, got, c.kind)
		}
		if want := "pagestore: persist: write page: " + c.condition; err.Error() != want {
			t.Errorf("%v: message %q, want %q", c.err, err.Error(), want)
		}
		if strings.Contains(err.Error(), "/srv") {
			t.Errorf("%v: message %q names a path", c.err, err.Error())
		}
	}
}

// faults is an error injector for pagestore.SetFault and a recorder of
// the errors reported to Config.OnPersistError.
type faults struct {
	mu       sync.Mutex
	fail     map[string]error // by op: the error every op returns; "*": every op
	reported []*pagestore.IOError
}

func (f *faults) set(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == nil {
		f.fail = map[string]error{}
	}
	if err == nil {
		delete(f.fail, op)
		return
	}
	f.fail[op] = err
}

// inject is the store's fault function: the operation's file gets the
// error as an *os.PathError, as the operating system reports it.
func (f *faults) inject(op, path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err, ok := f.fail[op]
	if !ok {
		err, ok = f.fail["*"]
	}
	if !ok {
		return nil
	}
	if errno, isErrno := err.(syscall.Errno); isErrno {
		return &os.PathError{Op: "write", Path: filepath.Join(path, "injected"), Err: errno}
	}
	return err
}

func (f *faults) report(e *pagestore.IOError) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reported = append(f.reported, e)
}

func (f *faults) got() []*pagestore.IOError {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pagestore.IOError(nil), f.reported...)
}

// openFaulty opens a persisting store on dir with f injecting and
// recording.
func openFaulty(t *testing.T, dir string, f *faults, mode pagestore.Durability) *pagestore.Store {
	t.Helper()
	c := pConfig(dir)
	c.Durability, c.SyncInterval = mode, 10*time.Millisecond
	c.OnPersistError = f.report
	s := openP(t, c)
	pagestore.SetFault(s, f.inject)
	return s
}

// checkNoPath fails if the message of err names dir or any file.
func checkNoPath(t *testing.T, err error, dir string) {
	t.Helper()
	if msg := err.Error(); strings.Contains(msg, dir) || strings.Contains(msg, "injected") || strings.Contains(msg, "store.db") {
		t.Errorf("message names a path: %q", msg)
	}
}

// TestDiskFullAppend: an append whose page seal meets a full disk
// (ENOSPC on the page's write, then EDQUOT on the metadata commit)
// returns an error wrapping ErrDiskFull, ErrPersist and the errno whose
// message says "disk full" and names no path; the failure is reported
// once, with the file; the append took effect in memory; once space is
// back the very next append persists what the failed one did not (a
// kill then loses only the tail).
func TestDiskFullAppend(t *testing.T) {
	dir := t.TempDir()
	f := &faults{}
	s := openFaulty(t, dir, f, pagestore.SyncOnWrite)
	st := streams{}
	id := s.Create()
	appendN(t, s, st, id, 1, 3)

	for _, c := range []struct {
		op, file string
		errno    syscall.Errno
	}{
		{"write page", dir, syscall.ENOSPC},
		{"commit metadata", filepath.Join(dir, "store.db"), syscall.EDQUOT},
	} {
		for len(st[id])%pS != pS-1 {
			appendN(t, s, st, id, 1, 1)
		}
		f.set(c.op, c.errno)
		before := len(f.got())
		// The page seals at the last layer's append of the 4th token.
		k, v := tokenKV(1, len(st[id]))
		var err error
		for l := range pLayers {
			if err = s.Append(id, l, k, v); err != nil && l != pLayers-1 {
				t.Fatalf("%s: layer %d: %v", c.op, l, err)
			}
		}
		st[id] = append(st[id], tokRef{1, len(st[id])})
		switch {
		case err == nil:
			t.Fatalf("%s %v: the sealing append succeeded", c.op, c.errno)
		case !errors.Is(err, pagestore.ErrDiskFull) || !errors.Is(err, pagestore.ErrPersist) || !errors.Is(err, c.errno) || errors.Is(err, pagestore.ErrIO):
			t.Errorf("%s %v: %v does not wrap ErrDiskFull, ErrPersist and the errno (only)", c.op, c.errno, err)
		case !strings.Contains(err.Error(), "disk full ("+c.errno.Error()+")") || !strings.Contains(err.Error(), c.op):
			t.Errorf("%s %v: message %q does not say what failed and why", c.op, c.errno, err)
		}
		checkNoPath(t, err, dir)
		rep := f.got()[before:]
		if len(rep) != 1 || rep[0].Op != c.op || rep[0].Path != filepath.Join(c.file, "injected") || rep[0].Closing || !errors.Is(rep[0], pagestore.ErrDiskFull) {
			t.Errorf("%s: reported %+v, want one %s of %s", c.op, rep, c.op, filepath.Join(c.file, "injected"))
		}
		if n := mustLen(t, s, id); n != len(st[id]) {
			t.Errorf("%s: length %d after the failed append, want %d (it took effect in memory)", c.op, n, len(st[id]))
		}
		f.set(c.op, nil)
		appendN(t, s, st, id, 1, 1) // seals nothing, persists what failed
		// A kill now (a copy of the directory): only the tail is lost.
		r := openP(t, pConfig(copyDir(t, dir)))
		n := len(st[id])
		if rep := r.Recovery(); len(rep.Sequences) != 1 || rep.Sequences[0].Len != n/pS*pS || rep.Sequences[0].LostTokens != n%pS || len(rep.Damaged) != 0 {
			t.Errorf("%s: a kill at %d tokens, once space is back: %+v, want %d tokens and %d lost", c.op, n, rep, n/pS*pS, n%pS)
		}
		r.Close()
	}
	reported := len(f.got())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(f.got()); n != reported {
		t.Errorf("%d more errors reported by a Close on a disk with space", n-reported)
	}
}

// TestDiskFullClose: a Close on a full disk returns an error wrapping
// ErrDiskFull that says not every sequence was saved, and reports the
// failures with Closing set (none before); a reopen finds the sequence
// at its last committed length, its tail tokens lost.
func TestDiskFullClose(t *testing.T) {
	dir := t.TempDir()
	f := &faults{}
	s := openFaulty(t, dir, f, pagestore.SyncOnWrite)
	st := streams{}
	id := s.Create()
	appendN(t, s, st, id, 1, 6) // one sealed page and 2 tail tokens
	f.set("*", syscall.ENOSPC)
	err := s.Close()
	if err == nil || !errors.Is(err, pagestore.ErrDiskFull) || !strings.Contains(err.Error(), "not every sequence saved in full") {
		t.Fatalf("Close on a full disk: %v", err)
	}
	checkNoPath(t, err, dir)
	rep := f.got()
	if len(rep) == 0 {
		t.Fatal("nothing reported")
	}
	for _, e := range rep {
		if !e.Closing || !errors.Is(e, pagestore.ErrDiskFull) || !strings.HasPrefix(e.Path, dir) {
			t.Errorf("reported %+v (%v), want Closing, disk full, a path in %s", e, e, dir)
		}
	}
	r := openP(t, pConfig(dir))
	defer r.Close()
	rec := r.Recovery()
	if len(rec.Sequences) != 1 || rec.Sequences[0].Len != 4 || rec.Sequences[0].LostTokens != 2 || rec.Sequences[0].TailPersisted {
		t.Fatalf("after a Close on a full disk: %+v, want 4 tokens and the 2 of the tail lost", rec)
	}
}

// TestDiskFullPeriodic: with SyncPeriodic no append fails, but the
// flusher's failures are reported (not dropped), Sync returns them, and
// the first flush once space is back persists everything.
func TestDiskFullPeriodic(t *testing.T) {
	dir := t.TempDir()
	f := &faults{}
	s := openFaulty(t, dir, f, pagestore.SyncPeriodic)
	for _, op := range []string{"write page", "sync page slabs", "commit metadata"} {
		f.set(op, syscall.ENOSPC)
	}
	st := streams{}
	id := s.Create()
	appendN(t, s, st, id, 1, 9) // two sealed pages
	deadline := time.Now().Add(5 * time.Second)
	for len(f.got()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	rep := f.got()
	if len(rep) == 0 || !errors.Is(rep[0], pagestore.ErrDiskFull) || rep[0].Closing {
		t.Fatalf("the flusher's failures: reported %+v", rep)
	}
	err := s.Sync(context.Background())
	if !errors.Is(err, pagestore.ErrDiskFull) {
		t.Fatalf("Sync on a full disk: %v", err)
	}
	checkNoPath(t, err, dir)
	for _, op := range []string{"write page", "sync page slabs", "commit metadata"} {
		f.set(op, nil)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatalf("Sync once space is back: %v", err)
	}
	image := copyDir(t, dir)
	s.Close()
	r := openP(t, pConfig(image))
	defer r.Close()
	if rec := r.Recovery(); len(rec.Sequences) != 1 || rec.Sequences[0].Len != 8 || rec.Sequences[0].LostTokens != 1 {
		t.Fatalf("after the kill: %+v, want 8 tokens and 1 lost", rec)
	}
}

// TestLengthsFileErrors: the lengths file is best effort: its write
// failures fail no append and are reported once until a write succeeds.
func TestLengthsFileErrors(t *testing.T) {
	f := &faults{}
	s := openFaulty(t, t.TempDir(), f, pagestore.SyncOnWrite)
	defer s.Close()
	st := streams{}
	id := s.Create()
	f.set("write lengths file", syscall.EIO)
	appendN(t, s, st, id, 1, 5) // 10 writes of the lengths file
	rep := f.got()
	if len(rep) != 1 || rep[0].Op != "write lengths file" || !errors.Is(rep[0], pagestore.ErrIO) || errors.Is(rep[0], pagestore.ErrDiskFull) {
		t.Fatalf("reported %+v, want one I/O error of the lengths file", rep)
	}
	f.set("write lengths file", nil)
	appendN(t, s, st, id, 1, 1)
	f.set("write lengths file", syscall.EIO)
	appendN(t, s, st, id, 1, 2)
	if n := len(f.got()); n != 2 {
		t.Fatalf("%d reports after a success and new failures, want 2", n)
	}
}

// TestDiskFullTmpfs: on a real 256 KiB tmpfs (mounted in a user and
// mount namespace of its own: the test skips where that is not
// permitted) appends fill the disk: the first failure wraps ErrDiskFull
// and ENOSPC, says "disk full" and names no path, and was reported with
// a file in the directory; a Close then reports its failures as a
// Close's.
func TestDiskFullTmpfs(t *testing.T) {
	tmpfstest.Run(t, 256, diskFullInTmpfs)
}

// diskFullInTmpfs is TestDiskFullTmpfs inside the namespace, dir the
// tmpfs.
func diskFullInTmpfs(t *testing.T, dir string) {
	f := &faults{}
	c := pConfig(filepath.Join(dir, "store"))
	c.Capacity = 512
	c.OnPersistError = f.report
	s, err := pagestore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	st := streams{}
	var seqs []pagestore.SeqID
	var fail error
	tokens := 0
	for fail == nil && len(seqs) < 100 {
		id := s.Create()
		seqs = append(seqs, id)
		for i := 0; i < 40 && fail == nil; i++ {
			k, v := tokenKV(uint64(id), i)
			for l := range pLayers {
				if fail = s.Append(id, l, k, v); fail != nil {
					break
				}
			}
			st[id] = append(st[id], tokRef{uint64(id), i})
			tokens++
		}
	}
	if fail == nil {
		t.Fatalf("no error after %d tokens on a 256 KiB tmpfs", tokens)
	}
	t.Logf("tmpfs: the first failure after %d tokens: %v", tokens, fail)
	if !errors.Is(fail, pagestore.ErrDiskFull) || !errors.Is(fail, syscall.ENOSPC) || !strings.Contains(fail.Error(), "disk full (no space left on device)") {
		t.Errorf("the first failure on a full tmpfs: %v", fail)
	}
	checkNoPath(t, fail, dir)
	rep := f.got()
	if len(rep) == 0 || !strings.HasPrefix(rep[0].Path, dir) || rep[0].Closing || !errors.Is(rep[0], pagestore.ErrDiskFull) {
		t.Fatalf("reported %+v", rep)
	}
	t.Logf("tmpfs: reported %s of %s: %v", rep[0].Op, rep[0].Path, rep[0].Err)
	n := len(rep)
	err = s.Close()
	if !errors.Is(err, pagestore.ErrDiskFull) {
		t.Errorf("Close on the full tmpfs: %v", err)
	}
	for _, e := range f.got()[n:] {
		if !e.Closing {
			t.Errorf("a Close's failure without Closing: %+v", e)
		}
	}
	if len(f.got()) == n {
		t.Error("the Close reported nothing")
	}
}
