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

	"github.com/questrt/questrt/cluster/coord"
	"github.com/questrt/questrt/pagestore"
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
