package coord_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
)

// TestPersistErrorStatus: a worker's persistence error crosses the
// worker API and the client API as RESOURCE_EXHAUSTED for a full disk
// (ENOSPC, EDQUOT) and INTERNAL for another I/O error, its message
// naming the condition and no server path, and the coordinator's
// rebuilt error still wraps the pagestore sentinels.
func TestPersistErrorStatus(t *testing.T) {
	const slab = "/var/lib/questd/grids/m0/g.0/rank-tp0-cp0/slab-000000"
	for _, c := range []struct {
		errno syscall.Errno
		code  codes.Code
		kind  error
		text  string
	}{
		{syscall.ENOSPC, codes.ResourceExhausted, pagestore.ErrDiskFull, "disk full (no space left on device)"},
		{syscall.EDQUOT, codes.ResourceExhausted, pagestore.ErrDiskFull, "disk full (disk quota exceeded)"},
		{syscall.EIO, codes.Internal, pagestore.ErrIO, "input/output error"},
	} {
		err := fmt.Errorf("append seq 3 layer 1: page 7: %w", &pagestore.IOError{Op: "write page", Path: slab,
			Err: fmt.Errorf("disktier /var/lib/questd: write slot 7: %w", &os.PathError{Op: "write", Path: slab, Err: c.errno})})
		st := remote.ToStatus(err)
		back := remote.FromStatus(st.Err())
		if st.Code() != c.code || !errors.Is(back, c.kind) || !errors.Is(back, pagestore.ErrPersist) {
			t.Errorf("%v: worker API %v %q, rebuilt %v; want %v wrapping %v", c.errno, st.Code(), st.Message(), back, c.code, c.kind)
		}
		api, _ := status.FromError(coord.Status(fmt.Errorf("append m0/1.3: %w", back)))
		if api.Code() != c.code || !strings.Contains(api.Message(), c.text) || strings.Contains(api.Message(), "/var/lib") {
			t.Errorf("%v: client API %v %q, want %v saying %q and no path", c.errno, api.Code(), api.Message(), c.code, c.text)
		}
	}
}

// TestPersistErrorStatusCombined: a persistence error that also says the
// rank changed (an append that took effect in memory: the engine breaks
// the sequence) is FAILED_PRECONDITION at the client API, never the
// RESOURCE_EXHAUSTED that promises nothing changed; one that also says
// a peer is gone stays UNAVAILABLE on both APIs, so that the coordinator
// still counts the node as lost.
func TestPersistErrorStatusCombined(t *testing.T) {
	full := &pagestore.IOError{Op: "write page", Path: "/data/slab", Err: &os.PathError{Op: "write", Path: "/data/slab", Err: syscall.ENOSPC}}
	for _, c := range []struct {
		name        string
		err         error
		worker, api codes.Code
		wraps       []error
	}{
		{"changed", fmt.Errorf("append seq 3 layer 1: %w: %w", worker.ErrChanged, full), codes.ResourceExhausted, codes.FailedPrecondition,
			[]error{worker.ErrChanged, pagestore.ErrDiskFull, pagestore.ErrPersist}},
		{"closed", fmt.Errorf("append seq 3 layer 1: %w: %w", worker.ErrClosed, full), codes.Unavailable, codes.Unavailable,
			[]error{remote.ErrUnavailable, pagestore.ErrDiskFull}},
	} {
		st := remote.ToStatus(c.err)
		back := remote.FromStatus(st.Err())
		if st.Code() != c.worker {
			t.Errorf("%s: worker API %v, want %v", c.name, st.Code(), c.worker)
		}
		for _, w := range c.wraps {
			if !errors.Is(back, w) {
				t.Errorf("%s: rebuilt %v does not wrap %v", c.name, back, w)
			}
		}
		if api, _ := status.FromError(coord.Status(fmt.Errorf("append m0/1.3: %w", back))); api.Code() != c.api || !strings.Contains(api.Message(), "disk full") {
			t.Errorf("%s: client API %v %q, want %v saying disk full", c.name, api.Code(), api.Message(), c.api)
		}
	}
}

// TestDamagedStatus: a sequence found damaged at its first use on a
// node (pagestore.ErrDamaged, recovered pages verified on read) crosses
// the worker API and the client API as DATA_LOSS (from a node or from a
// worker in the coordinator's process), and the coordinator's rebuilt
// error still wraps pagestore.ErrDamaged.
func TestDamagedStatus(t *testing.T) {
	err := fmt.Errorf("keys: page table seq 1: seq 1: %w: page 0: disktier rank-tp0-cp0: read slot 0: %w", pagestore.ErrDamaged, tier.ErrCorrupt)
	st := remote.ToStatus(err)
	back := remote.FromStatus(st.Err())
	if st.Code() != codes.DataLoss || !errors.Is(back, pagestore.ErrDamaged) {
		t.Fatalf("worker API %v %q, rebuilt %v; want DATA_LOSS wrapping ErrDamaged", st.Code(), st.Message(), back)
	}
	// From a node (the rebuilt error) and from a worker in this process
	// (the error itself).
	for _, e := range []error{back, err} {
		if api, _ := status.FromError(coord.Status(fmt.Errorf("step m0/1.3: %w", e))); api.Code() != codes.DataLoss || !strings.Contains(api.Message(), "sequence damaged") {
			t.Fatalf("client API %v %q, want DATA_LOSS saying the sequence is damaged", api.Code(), api.Message())
		}
	}
}
