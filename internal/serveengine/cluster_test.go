package serveengine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/worker/remote"
)

// TestClusterError: which of a coordinator's errors the server answers
// with 503 (completion.ErrClusterUnavailable) and which it may retry on a new
// grid (completion.ErrGridLost too), which are a want of the nodes' pages
// (completion.ErrClusterFull too), each still wrapping the original.
func TestClusterError(t *testing.T) {
	for _, c := range []struct {
		err                     error
		unavailable, lost, full bool
	}{
		{fmt.Errorf("grid g: %w", coord.ErrGridLost), true, true, false},
		{fmt.Errorf("%w: %w", coord.ErrGridLost, coord.ErrClosed), true, false, false},
		{coord.ErrClosed, true, false, false},
		{fmt.Errorf("node n: %w", remote.ErrUnavailable), true, false, false},
		{remote.ErrNodeFull, true, false, true},
		{remote.ErrUnknownGrid, true, false, false},
		{fmt.Errorf("place: %w", cluster.ErrNoCapacity), true, false, true},
		{errors.New("bad input"), false, false, false},
	} {
		got := ClusterError(c.err)
		if errors.Is(got, completion.ErrClusterUnavailable) != c.unavailable || errors.Is(got, completion.ErrGridLost) != c.lost ||
			errors.Is(got, completion.ErrClusterFull) != c.full || !errors.Is(got, c.err) {
			t.Errorf("ClusterError(%v) = %v: unavailable %v, lost %v, full %v, wraps the original %v; want %v, %v, %v, true",
				c.err, got, errors.Is(got, completion.ErrClusterUnavailable), errors.Is(got, completion.ErrGridLost), errors.Is(got, completion.ErrClusterFull),
				errors.Is(got, c.err), c.unavailable, c.lost, c.full)
		}
	}
}
