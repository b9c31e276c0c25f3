package coord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
)

// TestBlame: which nodes a failed step blames, and for what. Errors are
// built as a coordinator sees them: a node's answer through
// remote.ToStatus and FromStatus, gRPC's own statuses through FromStatus.
func TestBlame(t *testing.T) {
	answered := func(err error) error { return remote.FromStatus(remote.ToStatus(err).Err()) }
	madeUp := func(c codes.Code) error { return remote.FromStatus(status.Error(c, "made up by gRPC")) }
	var (
		refused  = madeUp(codes.Unavailable)                                // the node is unreachable
		deadline = madeUp(codes.DeadlineExceeded)                           // its call passed the deadline
		canceled = madeUp(codes.Canceled)                                   // cancelled after another failed
		aborted  = answered(fmt.Errorf("layer: %w", collective.ErrAborted)) // relays a failure elsewhere
		closed   = answered(fmt.Errorf("recv: %w", collective.ErrPeerClosed))
		order    = answered(fmt.Errorf("layer: %w", worker.ErrStep))
		unknown  = answered(remote.ErrUnknownGrid)
		gone     = fmt.Errorf("%w: %w", ErrGridLost, nodeGoneError{"c"})
	)
	for _, tc := range []struct {
		name  string
		cause error
		fails []peerFail
		want  []PeerError
	}{
		{"none", nil, nil, nil},
		{"one node unreachable, the others relay or were cancelled", nil,
			[]peerFail{{"a", aborted}, {"b", refused}, {"c", canceled}, {"a", closed}},
			[]PeerError{{"b", PeerUnavailable}}},
		{"timeouts", context.DeadlineExceeded,
			[]peerFail{{"a", deadline}, {"b", deadline}, {"a", deadline}},
			[]PeerError{{"a", PeerTimeout}, {"b", PeerTimeout}}},
		{"a step out of order and an unknown grid are other", nil,
			[]peerFail{{"a", order}, {"b", unknown}, {"c", aborted}},
			[]PeerError{{"a", PeerOther}, {"b", PeerOther}}},
		{"only relays: each reporter", nil,
			[]peerFail{{"a", closed}, {"b", aborted}},
			[]PeerError{{"a", PeerUnavailable}, {"b", PeerUnavailable}}},
		{"the view declared a node gone while the step ran", gone,
			[]peerFail{{"a", canceled}, {"b", closed}},
			[]PeerError{{"c", PeerUnavailable}}},
		{"the caller cancelled", context.Canceled,
			[]peerFail{{"a", canceled}, {"b", canceled}}, nil},
		{"a local error, no status", nil,
			[]peerFail{{"a", errors.New("connection reset")}},
			[]PeerError{{"a", PeerOther}}},
	} {
		if got := blame(tc.cause, tc.fails); !slices.Equal(got, tc.want) {
			t.Errorf("%s: blame = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := gone.Error(); got != "grid lost a node: node c is gone from the view" {
		t.Errorf("loss message %q", got)
	}
}
