package collective_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/questrt/questrt/collective"
)

func TestBenchCollective(t *testing.T) {
	cfg := collective.BenchConfig{
		Shards: []int{1, 3}, Batches: []int{1, 2}, Steps: 30, Warmup: 2,
		KVHeads: 2, QHeads: 4, HeadDim: 8, PageBudget: 16, Pages: 512,
	}
	res, err := collective.BenchCollective(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d results, want 4", len(res))
	}
	for _, r := range res {
		n, rows, states := int64(r.Shards), int64(r.Batch*2), int64(r.Batch*4)
		// Every rank proposes K candidates per row to every other rank.
		if want := n * (n - 1) * (16 + rows*4 + rows*16*8); r.SelectBytes != want {
			t.Errorf("%+v: select bytes %d, want %d", r, r.SelectBytes, want)
		}
		if want := (n - 1) * (12 + 4*(states*8+states)); r.MergeBytes != want {
			t.Errorf("%+v: merge bytes %d, want %d", r, r.MergeBytes, want)
		}
		if r.SelectMsgs != n*(n-1) || r.MergeMsgs != n-1 {
			t.Errorf("%+v: messages per step", r)
		}
		if r.Steps != 30 || r.Transport != "inproc" || r.Rows != int(rows) || r.States != int(states) || r.K != 16 {
			t.Errorf("%+v: config fields", r)
		}
		if !(r.SelectP50 > 0 && r.SelectP50 <= r.SelectP95 && r.SelectP95 <= r.SelectP99 && r.SelectP99 <= r.SelectMax) ||
			!(r.MergeP50 > 0 && r.MergeP50 <= r.MergeP95 && r.MergeP95 <= r.MergeP99 && r.MergeP99 <= r.MergeMax) {
			t.Errorf("%+v: percentiles not positive and ordered", r)
		}
	}
	js, err := json.Marshal(res[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"shards"`, `"batch"`, `"transport"`, `"steps"`, `"select_p50_us"`, `"select_p95_us"`, `"select_p99_us"`,
		`"merge_p50_us"`, `"merge_p95_us"`, `"merge_p99_us"`, `"select_bytes"`, `"merge_bytes"`} {
		if !strings.Contains(string(js), key) {
			t.Errorf("JSON %s lacks %s", js, key)
		}
	}
}

func TestBenchConfigValidate(t *testing.T) {
	if err := collective.DefaultBenchConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
	for _, c := range []collective.BenchConfig{
		{Shards: []int{0}},
		{Batches: []int{-1}},
		{Steps: -5},
		{Transport: "grpc"},
		{Warmup: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
		if _, err := collective.BenchCollective(context.Background(), c); err == nil {
			t.Errorf("%+v: BenchCollective ran", c)
		}
	}
}

func TestBenchCollectiveCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := collective.BenchConfig{Shards: []int{4}, Batches: []int{1}, Steps: 1000}
	if _, err := collective.BenchCollective(ctx, cfg); err == nil {
		t.Error("cancelled bench returned no error")
	}
}

// benchOp runs op on n ranks per iteration: ranks 1..n-1 on long-lived
// goroutines, rank 0 on the benchmark's. Allocations count all ranks.
func benchOp(b *testing.B, n int, op func(g *collective.Group, tag uint64, r int) error) {
	gs, done := newGroups(n, nil)
	defer done()
	start := make([]chan uint64, n)
	errs := make(chan error, n)
	for r := 1; r < n; r++ {
		start[r] = make(chan uint64)
		go func() {
			for tag := range start[r] {
				errs <- op(gs[r], tag, r)
			}
		}()
	}
	defer func() {
		for r := 1; r < n; r++ {
			close(start[r])
		}
	}()
	b.ReportAllocs()
	tag := uint64(0)
	for b.Loop() {
		tag++
		for r := 1; r < n; r++ {
			start[r] <- tag
		}
		if err := op(gs[0], tag, 0); err != nil {
			b.Fatal(err)
		}
		for r := 1; r < n; r++ {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkSelectExact(b *testing.B) {
	for _, c := range []struct{ n, batch int }{{2, 1}, {8, 1}, {16, 16}} {
		n, rows, k := c.n, 8*c.batch, 128
		b.Run(fmt.Sprintf("shards=%d/batch=%d", n, c.batch), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			local := make([][][]collective.Candidate, n)
			budgets := make([]int, rows)
			for row := range budgets {
				budgets[row] = k
			}
			for r := range n {
				local[r] = make([][]collective.Candidate, rows)
				for row := range rows {
					for i := range k {
						local[r][row] = append(local[r][row], collective.Candidate{Score: rng.Float32(), Page: int32(i*n + r)})
					}
				}
			}
			dst := make([][][]int32, n)
			benchOp(b, n, func(g *collective.Group, tag uint64, r int) error {
				var err error
				dst[r], err = g.SelectExact(bg(), tag, local[r], budgets, dst[r])
				return err
			})
		})
	}
}

func BenchmarkReduce(b *testing.B) {
	for _, n := range []int{2, 8} {
		b.Run(fmt.Sprintf("shards=%d", n), func(b *testing.B) {
			const heads, d = 32, 128
			st := randomStates(rand.New(rand.NewPCG(1, 1)), n, heads, d, 0)
			benchOp(b, n, func(g *collective.Group, tag uint64, r int) error {
				return g.Reduce(bg(), tag, 0, d, st.o[r], st.lse[r])
			})
		})
	}
}
