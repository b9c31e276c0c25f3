package coord

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/worker/remote"
)

// TestOpenError: the code a client gets for a grid that could not open,
// with errors built as the coordinator sees them (a node's answer
// through remote.ToStatus and FromStatus, gRPC's own statuses through
// FromStatus), through Status as the client API answers.
func TestOpenError(t *testing.T) {
	answered := func(err error) error { return remote.FromStatus(remote.ToStatus(err).Err()) }
	live := context.Background()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want codes.Code
	}{
		{"a node forgot the grid", live, answered(fmt.Errorf("connect grid: %w", remote.ErrUnknownGrid)), codes.Unavailable},
		{"a node gave its connect up (CI's TestChaos/partition)", live, answered(fmt.Errorf("connect grid: %w", context.Canceled)), codes.Unavailable},
		{"the caller cancelled", gone, remote.FromStatus(status.Error(codes.Canceled, "made up by gRPC")), codes.Canceled},
		{"a node is unreachable", live, remote.FromStatus(status.Error(codes.Unavailable, "made up by gRPC")), codes.Unavailable},
	} {
		err := openError(tc.ctx, tc.err)
		if got := status.Code(statusCtx(tc.ctx, fmt.Errorf("open grid g on [a b]: %w", err))); got != tc.want {
			t.Errorf("%s: %v answers %v, want %v", tc.name, tc.err, got, tc.want)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: %v no longer wraps %v", tc.name, err, tc.err)
		}
	}
}
