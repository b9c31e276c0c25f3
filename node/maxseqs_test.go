package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/plan"
)

// TestSequencesBounded: a client creates empty sequences on a node until
// its grid (CP 1 x 128 pages: the floor of 1024 sequences,
// worker.Config.MaxSequences) is full; the next Create answers
// RESOURCE_EXHAUSTED naming the count, the sequences made still answer,
// and after a Release a Create fits again.
func TestSequencesBounded(t *testing.T) {
	nd := startCluster(t, 1, geometry(1, 1, plan.Exact))[0]
	c := dial(t, nd)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const limit = 1024
	var ids []string
	for range limit {
		id, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatalf("create %d: %v", len(ids), err)
		}
		ids = append(ids, id)
	}
	_, _, err := c.Create(ctx, plan.Striped)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), fmt.Sprintf("holds %d sequences", limit)) {
		t.Fatalf("create past the limit: %v, want RESOURCE_EXHAUSTED naming %d sequences", err, limit)
	}
	if n, err := c.Len(ctx, ids[limit-1]); err != nil || n != 0 {
		t.Errorf("length of the last sequence made: %d, %v; want 0", n, err)
	}
	if err := c.Release(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Create(ctx, plan.Striped); err != nil {
		t.Errorf("create after a release: %v", err)
	}
}
