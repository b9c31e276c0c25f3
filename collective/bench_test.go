package collective_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
)

// smallBench is a quick configuration of the benchmark.
func smallBench() collective.BenchConfig {
	c := collective.DefaultBenchConfig()
	c.Shards, c.Batches, c.Steps, c.Warmup = []int{1, 3}, []int{1, 2}, 30, 2
	c.KVHeads, c.QHeads, c.HeadDim, c.PageBudget, c.Pages = 2, 4, 8, 16, 512
	return c
}

func TestBenchCollective(t *testing.T) {
	var res []collective.BenchResult
	err := collective.BenchCollective(context.Background(), smallBench(), func(r collective.BenchResult) error {
		res = append(res, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d results, want 4", len(res))
	}
	for i, r := range res {
		if want := [][2]int{{1, 1}, {1, 2}, {3, 1}, {3, 2}}[i]; r.Shards != want[0] || r.Batch != want[1] {
			t.Errorf("result %d is shards %d batch %d, want %v (shards outer, batches inner)", i, r.Shards, r.Batch, want)
		}
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

// TestBenchCollectiveIncremental: each configuration's result reaches the
// caller before the next configuration starts (NewTransports is called as
// each one starts).
func TestBenchCollectiveIncremental(t *testing.T) {
	c := smallBench()
	c.Shards, c.Batches = []int{2, 3, 4}, []int{1}
	var events []string
	c.NewTransports = func(n int) ([]collective.Transport, error) {
		events = append(events, fmt.Sprint("start ", n))
		return collective.NewInprocGroup(n), nil
	}
	var progress strings.Builder
	c.Progress = &progress
	err := collective.BenchCollective(context.Background(), c, func(r collective.BenchResult) error {
		events = append(events, fmt.Sprint("result ", r.Shards))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"start 2", "result 2", "start 3", "result 3", "start 4", "result 4"}
	if !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
	if got := strings.Count(progress.String(), "\n"); got != 3 {
		t.Errorf("%d progress lines, want one per configuration:\n%s", got, progress.String())
	}
}

// TestBenchCollectiveEmitError: an error from emit stops the benchmark
// before the next configuration and is returned.
func TestBenchCollectiveEmitError(t *testing.T) {
	c := smallBench()
	starts := 0
	c.NewTransports = func(n int) ([]collective.Transport, error) {
		starts++
		return collective.NewInprocGroup(n), nil
	}
	stop := errors.New("stop")
	calls := 0
	err := collective.BenchCollective(context.Background(), c, func(collective.BenchResult) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 || starts != 1 {
		t.Errorf("error %v after %d results and %d configurations, want %v after 1 and 1", err, calls, starts, stop)
	}
}

func TestBenchConfigValidate(t *testing.T) {
	if err := collective.DefaultBenchConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
	type field struct {
		name     string
		set      func(c *collective.BenchConfig, v int)
		min, max int
	}
	fields := []field{
		{"Shards", func(c *collective.BenchConfig, v int) { c.Shards = []int{2, v} }, 1, collective.MaxBenchShards},
		{"Batches", func(c *collective.BenchConfig, v int) { c.Batches = []int{v} }, 1, collective.MaxBenchBatch},
		{"Steps", func(c *collective.BenchConfig, v int) { c.Steps = v }, 1, collective.MaxBenchSteps},
		{"Warmup", func(c *collective.BenchConfig, v int) { c.Warmup = v }, 0, collective.MaxBenchSteps},
		{"KVHeads", func(c *collective.BenchConfig, v int) { c.KVHeads = v }, 1, collective.MaxBenchHeads},
		{"QHeads", func(c *collective.BenchConfig, v int) { c.QHeads = v }, 1, collective.MaxBenchHeads},
		{"HeadDim", func(c *collective.BenchConfig, v int) { c.HeadDim = v }, 1, collective.MaxBenchHeadDim},
		{"Pages", func(c *collective.BenchConfig, v int) { c.Pages = v }, 1, collective.MaxBenchPages},
		{"PageBudget", func(c *collective.BenchConfig, v int) { c.PageBudget = v }, 1, 8192}, // the default Pages
	}
	for _, f := range fields {
		for _, v := range []int{f.min - 1, f.min - 2, f.max + 1, math.MaxInt, math.MinInt} {
			c := collective.DefaultBenchConfig()
			f.set(&c, v)
			err := c.Validate()
			var re *collective.BenchRangeError
			if !errors.As(err, &re) || re.Field != f.name || re.Value != v || re.Min != f.min || re.Max != f.max {
				t.Errorf("%s = %d: %v, want a BenchRangeError for %s [%d, %d]", f.name, v, err, f.name, f.min, f.max)
			}
			checkRefused(t, c)
		}
		if f.min == 0 { // the smallest value in range runs (Warmup 0)
			c := smallBench()
			f.set(&c, f.min)
			if err := c.Validate(); err != nil {
				t.Errorf("%s = %d: %v", f.name, f.min, err)
			}
		}
	}
	for name, c := range map[string]collective.BenchConfig{
		"no shards":         func() collective.BenchConfig { c := smallBench(); c.Shards = nil; return c }(),
		"no batches":        func() collective.BenchConfig { c := smallBench(); c.Batches = []int{}; return c }(),
		"no transport":      func() collective.BenchConfig { c := smallBench(); c.Transport = ""; return c }(),
		"unknown transport": func() collective.BenchConfig { c := smallBench(); c.Transport = "grpc"; return c }(),
		"the zero config":   {},
	} {
		if c.Validate() == nil {
			t.Errorf("%s: no error", name)
		}
		checkRefused(t, c)
	}
}

// TestBenchConfigMemory: configurations whose data do not fit MaxMemory,
// or the machine, are refused before anything is allocated.
func TestBenchConfigMemory(t *testing.T) {
	c := collective.DefaultBenchConfig()
	need := c.MemoryBytes()
	// 16 ranks x 16 x 8 rows x 128 candidates, all-gathered, 8 bytes
	// each, and their sort keys: >= 64 MiB of data.
	if need < 128<<20 || need > 1<<30 {
		t.Errorf("default config needs %d bytes, want 128 MiB to 1 GiB", need)
	}
	bigger := c
	bigger.Shards = []int{32}
	if bigger.MemoryBytes() <= need {
		t.Errorf("32 shards need %d bytes, no more than 16 shards' %d", bigger.MemoryBytes(), need)
	}
	c.MaxMemory = need
	if err := c.Validate(); err != nil {
		t.Errorf("MaxMemory = need: %v", err)
	}
	c.MaxMemory = need - 1
	if err := c.Validate(); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Errorf("MaxMemory = need - 1: %v, want ErrTooLarge", err)
	}
	checkRefused(t, c)
	c.MaxMemory = -2
	if err := c.Validate(); err == nil {
		t.Error("MaxMemory -2 accepted")
	}
	// Every size at its limit: petabytes (or an overflow), refused
	// whatever the machine, and no panic on the way.
	huge := collective.DefaultBenchConfig()
	huge.Shards, huge.Batches = []int{collective.MaxBenchShards}, []int{collective.MaxBenchBatch}
	huge.KVHeads, huge.QHeads, huge.HeadDim = collective.MaxBenchHeads, collective.MaxBenchHeads, collective.MaxBenchHeadDim
	huge.Pages, huge.PageBudget, huge.Steps, huge.Warmup = collective.MaxBenchPages, collective.MaxBenchPages, collective.MaxBenchSteps, collective.MaxBenchSteps
	limits := []int64{1 << 40}
	if _, err := memlimit.Available(); err == nil {
		limits = append(limits, memlimit.Auto) // where unknown, Auto refuses only overflows
	}
	for _, limit := range limits {
		huge.MaxMemory = limit
		if err := huge.Validate(); !errors.Is(err, memlimit.ErrTooLarge) {
			t.Errorf("every size at its limit, MaxMemory %d: %v, want ErrTooLarge", limit, err)
		}
		checkRefused(t, huge)
	}
	// One size alone can be too much: D = 16384 for 16 x 1024 query heads.
	wide := collective.DefaultBenchConfig()
	wide.QHeads, wide.HeadDim, wide.MaxMemory = collective.MaxBenchHeads, collective.MaxBenchHeadDim, 1<<30
	if err := wide.Validate(); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Errorf("wide states: %v, want ErrTooLarge", err)
	}
}

// checkRefused: BenchCollective refuses c without starting a
// configuration (Progress gets a line as each one starts) or emitting
// anything.
func checkRefused(t *testing.T, c collective.BenchConfig) {
	t.Helper()
	var progress strings.Builder
	c.Progress = &progress
	err := collective.BenchCollective(context.Background(), c, func(collective.BenchResult) error {
		t.Error("emitted a result")
		return nil
	})
	if err == nil || progress.Len() > 0 {
		t.Errorf("BenchCollective = %v, progress %q; want refused before starting", err, progress.String())
	}
}

func TestBenchCollectiveCancelled(t *testing.T) {
	none := func(collective.BenchResult) error {
		t.Error("emitted a result")
		return nil
	}
	t.Run("before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c := smallBench()
		if err := collective.BenchCollective(ctx, c, none); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled bench: %v, want Canceled", err)
		}
	})
	t.Run("between configurations", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := smallBench()
		starts, results := 0, 0
		c.NewTransports = func(n int) ([]collective.Transport, error) {
			starts++
			return collective.NewInprocGroup(n), nil
		}
		err := collective.BenchCollective(ctx, c, func(collective.BenchResult) error {
			results++
			cancel()
			return nil
		})
		if !errors.Is(err, context.Canceled) || starts != 1 || results != 1 {
			t.Errorf("%v after %d configurations and %d results, want Canceled after 1 and 1", err, starts, results)
		}
	})
	t.Run("inside a configuration", func(t *testing.T) {
		// Far more steps than run before the cancel: a benchmark that
		// did not stop would emit its result after seconds.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := smallBench()
		c.Shards, c.Batches, c.Steps = []int{4}, []int{1}, 1<<18
		c.NewTransports = func(n int) ([]collective.Transport, error) {
			time.AfterFunc(20*time.Millisecond, cancel)
			return collective.NewInprocGroup(n), nil
		}
		if err := collective.BenchCollective(ctx, c, none); !errors.Is(err, context.Canceled) {
			t.Errorf("bench cancelled while running: %v, want Canceled", err)
		}
	})
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

// benchRanks runs BenchRank on every member of an in-process group, one
// goroutine each, as one process per rank would.
func benchRanks(ctx context.Context, c collective.BenchConfig, n, batch int) ([]collective.BenchSamples, error) {
	trs := collective.NewInprocGroup(n)
	defer func() {
		for _, t := range trs {
			t.Close()
		}
	}()
	out := make([]collective.BenchSamples, n)
	errs := make([]error, n)
	done := make(chan struct{})
	for r := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			out[r], errs[r] = collective.BenchRank(ctx, c, batch, trs[r])
		}()
	}
	for range n {
		<-done
	}
	return out, errors.Join(errs...)
}

// TestBenchRank: BenchRank on every member of a group, combined with
// BenchCombine, reports what BenchCollective reports for the same
// configuration: the same shape, bytes and messages, and ordered positive
// latencies; samples in any order combine the same.
func TestBenchRank(t *testing.T) {
	c := smallBench()
	for _, n := range []int{2, 3} {
		for _, batch := range []int{1, 2} {
			c.Shards, c.Batches = []int{n}, []int{batch}
			var want collective.BenchResult
			if err := collective.BenchCollective(context.Background(), c, func(r collective.BenchResult) error {
				want = r
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			samples, err := benchRanks(context.Background(), c, n, batch)
			if err != nil {
				t.Fatal(err)
			}
			for r, s := range samples {
				if s.Rank != r || len(s.SelectStart) != c.Steps || len(s.MergeEnd) != c.Steps || s.BaseNS <= 0 {
					t.Fatalf("rank %d samples: rank %d, %d and %d times, base %d", r, s.Rank, len(s.SelectStart), len(s.MergeEnd), s.BaseNS)
				}
			}
			slices.Reverse(samples)
			got, err := collective.BenchCombine(c, batch, samples)
			if err != nil {
				t.Fatal(err)
			}
			if want.Processes != 1 || got.Processes != 0 {
				t.Errorf("processes: BenchCollective %d, want 1; BenchCombine %d, want 0 (the caller's)", want.Processes, got.Processes)
			}
			if got.Shards != n || got.Batch != batch || got.Rows != want.Rows || got.States != want.States || got.K != want.K ||
				got.SelectBytes != want.SelectBytes || got.MergeBytes != want.MergeBytes ||
				got.SelectMsgs != want.SelectMsgs || got.MergeMsgs != want.MergeMsgs {
				t.Errorf("n=%d batch=%d: per rank %+v, in process %+v: want the same shape and traffic", n, batch, got, want)
			}
			if !(got.SelectP50 > 0 && got.SelectP50 <= got.SelectP99 && got.SelectP99 <= got.SelectMax && got.MergeP50 > 0 && got.StartSkewP50 >= 0) {
				t.Errorf("n=%d batch=%d: latencies %+v", n, batch, got)
			}
		}
	}
}

// TestBenchCombineRefuses: samples that do not cover every rank once
// with one sample per step are refused.
func TestBenchCombineRefuses(t *testing.T) {
	c := smallBench()
	samples, err := benchRanks(context.Background(), c, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	short := slices.Clone(samples)
	short[1].MergeEnd = short[1].MergeEnd[1:]
	dup := slices.Clone(samples)
	dup[2].Rank = 0
	for name, s := range map[string][]collective.BenchSamples{
		"none": nil, "rank out of range": samples[1:], "duplicate": dup, "short": short,
	} {
		if _, err := collective.BenchCombine(c, 1, s); err == nil {
			t.Errorf("%s: combined", name)
		}
	}
}

// TestBenchCombineSkew: the start skews are the median spread of the
// ranks' start times, the select's and its baseline's each from its own.
func TestBenchCombineSkew(t *testing.T) {
	c := smallBench()
	c.Steps = 3
	// Per step, rank 1 starts the select 10, 20, 30 us and the baseline
	// 1, 2, 3 us after rank 0.
	mk := func(rank int) collective.BenchSamples {
		s := collective.BenchSamples{Rank: rank, BaseNS: 1e9}
		for step := range int64(3) {
			at := step * 1e6
			sel, base := at, at+5e5
			if rank == 1 {
				sel += (step + 1) * 10e3
				base += (step + 1) * 1e3
			}
			s.SelectStart, s.SelectEnd = append(s.SelectStart, sel), append(s.SelectEnd, sel+1e5)
			s.MergeStart, s.MergeEnd = append(s.MergeStart, at+2e5), append(s.MergeEnd, at+3e5)
			s.BaselineStart, s.BaselineEnd = append(s.BaselineStart, base), append(s.BaselineEnd, base+1e5)
			s.MergeBaselineStart, s.MergeBaselineEnd = append(s.MergeBaselineStart, at+7e5), append(s.MergeBaselineEnd, at+8e5)
			s.PingPongStart, s.PingPongEnd = append(s.PingPongStart, at+9e5), append(s.PingPongEnd, at+95e4)
		}
		return s
	}
	res, err := collective.BenchCombine(c, 1, []collective.BenchSamples{mk(1), mk(0)})
	if err != nil {
		t.Fatal(err)
	}
	if res.StartSkewP50 != 20 || res.BaselineStartSkewP50 != 2 {
		t.Errorf("skew p50: select %v us, baseline %v us; want 20 and 2", res.StartSkewP50, res.BaselineStartSkewP50)
	}
}

// TestBenchRankCancelled: BenchRank stops within a step when ctx ends,
// with an error wrapping ctx's, and refuses invalid sizes.
func TestBenchRankCancelled(t *testing.T) {
	c := smallBench()
	c.Steps = 1 << 18
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := benchRanks(ctx, c, 3, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("BenchRank past its deadline: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to stop", d)
	}
	c = smallBench()
	c.Steps = 0
	tr := collective.NewInprocGroup(1)[0]
	defer tr.Close()
	var re *collective.BenchRangeError
	if _, err := collective.BenchRank(context.Background(), c, 1, tr); !errors.As(err, &re) || re.Field != "Steps" {
		t.Errorf("BenchRank with 0 steps: %v, want a range error on Steps", err)
	}
}
