package client

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
)

// flakyRecovered answers Recovered with errs in turn, then a reply
// listing one sequence; every other method is nil (unused).
type flakyRecovered struct {
	decodev1.DecodeClient
	errs  []error
	calls int
}

func (f *flakyRecovered) Recovered(ctx context.Context, _ *decodev1.RecoveredRequest, _ ...grpc.CallOption) (*decodev1.RecoveredReply, error) {
	f.calls++
	if f.calls <= len(f.errs) {
		return nil, f.errs[f.calls-1]
	}
	return &decodev1.RecoveredReply{Sequences: []*decodev1.RecoveredSequence{{Sequence: "n0/1.1", Length: 4, Lens: []uint64{4}}}}, nil
}

// TestRecoveredRetries: Recovered asks again while the node answers
// UNAVAILABLE (up to Options.RecoveredAttempts calls, within ctx), and
// not after another code.
func TestRecoveredRetries(t *testing.T) {
	unavail := status.Error(codes.Unavailable, "recover: recovery not finished after 30s; retry")
	other := status.Error(codes.FailedPrecondition, "no")
	for _, tc := range []struct {
		name      string
		attempts  int
		errs      []error
		ctx       time.Duration
		wantCalls int
		wantCode  codes.Code
	}{
		{"unavailable twice", 0, []error{unavail, unavail}, 10 * time.Second, 3, codes.OK},
		{"retries off", 1, []error{unavail}, 10 * time.Second, 1, codes.Unavailable},
		{"attempts used up", 3, []error{unavail, unavail, unavail, unavail}, 10 * time.Second, 3, codes.Unavailable},
		{"not unavailable", 0, []error{other}, 10 * time.Second, 1, codes.FailedPrecondition},
		{"context ends", 0, []error{unavail, unavail, unavail, unavail}, 250 * time.Millisecond, 2, codes.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &flakyRecovered{errs: tc.errs}
			attempts := tc.attempts
			if attempts == 0 {
				attempts = DefaultRecoveredAttempts
			}
			c := &Client{api: f, attempts: attempts}
			ctx, cancel := context.WithTimeout(context.Background(), tc.ctx)
			defer cancel()
			recs, _, err := c.Recovered(ctx)
			if f.calls != tc.wantCalls {
				t.Errorf("%d calls, want %d", f.calls, tc.wantCalls)
			}
			if tc.wantCode == codes.OK {
				if err != nil || len(recs) != 1 {
					t.Fatalf("recovered %+v, %v; want one sequence", recs, err)
				}
				return
			}
			if got := status.Code(err); tc.wantCode == codes.DeadlineExceeded {
				if ctx.Err() == nil || err == nil {
					t.Fatalf("err %v; want the context's end", err)
				}
			} else if got != tc.wantCode {
				t.Fatalf("err %v (%v); want %v", err, got, tc.wantCode)
			}
		})
	}
}
