package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/grpctransport"
)

// byteCounter counts, per (sender, receiver, op of the tag), the payload
// bytes and messages its members send and receive; barrier rounds (layer
// 1) are left out.
type byteCounter struct {
	mu   sync.Mutex
	sent map[[3]int][2]int64 // [from, to, op] -> bytes, messages
	recv map[[3]int][2]int64
}

func newByteCounter() *byteCounter {
	return &byteCounter{sent: map[[3]int][2]int64{}, recv: map[[3]int][2]int64{}}
}

func (c *byteCounter) add(m map[[3]int][2]int64, from, to int, tag uint64, n int) {
	if (tag>>8)&0xffff != 0 {
		return // a barrier
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := [3]int{from, to, int(tag & 0xff)}
	v := m[k]
	m[k] = [2]int64{v[0] + int64(n), v[1] + 1}
}

// op sums sent (or received) bytes and messages of op over all pairs, and
// returns them per pair too.
func (c *byteCounter) op(m map[[3]int][2]int64, op collective.Op) (total [2]int64, pairs map[[2]int][2]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pairs = map[[2]int][2]int64{}
	for k, v := range m {
		if k[2] == int(op) {
			pairs[[2]int{k[0], k[1]}] = v
			total[0] += v[0]
			total[1] += v[1]
		}
	}
	return total, pairs
}

type countedTransport struct {
	collective.Transport
	c *byteCounter
}

func (t *countedTransport) Send(ctx context.Context, to int, tag uint64, msg []byte) error {
	err := t.Transport.Send(ctx, to, tag, msg)
	if err == nil {
		t.c.add(t.c.sent, t.Rank(), to, tag, len(msg))
	}
	return err
}

func (t *countedTransport) Recv(ctx context.Context, from int, tag uint64) ([]byte, error) {
	b, err := t.Transport.Recv(ctx, from, tag)
	if err == nil {
		t.c.add(t.c.recv, from, t.Rank(), tag, len(b))
	}
	return b, err
}

// countedGroup returns a NewTransports whose members count into c: an
// in-process group, or a gRPC one on 127.0.0.1.
func countedGroup(t *testing.T, c *byteCounter, grpc bool) func(n int) ([]collective.Transport, error) {
	return func(n int) ([]collective.Transport, error) {
		var trs []collective.Transport
		if grpc {
			cfg := grpctransport.DefaultConfig()
			cfg.Plaintext = true
			g, err := grpctransport.NewLocalGroup(context.Background(), n, cfg)
			if err != nil {
				return nil, err
			}
			for _, m := range g {
				trs = append(trs, m)
			}
		} else {
			trs = collective.NewInprocGroup(n)
		}
		for i, tr := range trs {
			trs[i] = &countedTransport{Transport: tr, c: c}
		}
		return trs, nil
	}
}

// TestBenchBaselineSameBytes: the baseline rounds move exactly the bytes
// of the operations they stand for, message by message, as the
// transports count them: between every pair of ranks the all-gather
// baseline sends and receives what SelectExact does, and the gather
// baseline what Reduce does; the result's own counts agree. The pages do
// not divide evenly among the ranks, so the ranks' frames differ in
// length.
func TestBenchBaselineSameBytes(t *testing.T) {
	for _, grpc := range []bool{false, true} {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("grpc=%v/n=%d", grpc, n), func(t *testing.T) {
				cnt := newByteCounter()
				c := smallBench()
				c.Shards, c.Batches, c.Steps, c.Warmup = []int{n}, []int{2}, 7, 2
				c.Pages, c.PageBudget = 100, 40 // stripes of 34, 33, 33 pages: 34, 33, 33 candidates
				c.Transport, c.NewTransports = "counted", countedGroup(t, cnt, grpc)
				var res collective.BenchResult
				if err := collective.BenchCollective(context.Background(), c, func(r collective.BenchResult) error {
					res = r
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				steps := int64(c.Steps + c.Warmup)
				for _, p := range []struct {
					name     string
					op, base collective.Op
					bytes    int64
				}{
					{"select", collective.OpSelect, collective.OpBaseGather, res.SelectBytes},
					{"merge", collective.OpReduce, collective.OpBaseRoot, res.MergeBytes},
				} {
					for _, dir := range []map[[3]int][2]int64{cnt.sent, cnt.recv} {
						opTotal, opPairs := cnt.op(dir, p.op)
						baseTotal, basePairs := cnt.op(dir, p.base)
						if opTotal != baseTotal || opTotal[0] == 0 {
							t.Errorf("%s: the operation moved %v (bytes, messages), its baseline %v", p.name, opTotal, baseTotal)
						}
						if len(opPairs) != len(basePairs) {
							t.Errorf("%s: %d pairs of ranks talk, %d in the baseline", p.name, len(opPairs), len(basePairs))
						}
						for pair, v := range opPairs {
							if basePairs[pair] != v {
								t.Errorf("%s: ranks %v: %v, baseline %v", p.name, pair, v, basePairs[pair])
							}
						}
					}
					if total, _ := cnt.op(cnt.sent, p.op); total[0] != p.bytes*steps {
						t.Errorf("%s: the transports sent %d bytes in %d steps, the result says %d a step", p.name, total[0], steps, p.bytes)
					}
				}
				if res.BaselineBytes != res.SelectBytes || res.BaselineMsgs != res.SelectMsgs ||
					res.MergeBaselineBytes != res.MergeBytes || res.MergeBaselineMsgs != res.MergeMsgs {
					t.Errorf("result: select %d bytes %d msgs, baseline %d %d; merge %d %d, baseline %d %d",
						res.SelectBytes, res.SelectMsgs, res.BaselineBytes, res.BaselineMsgs,
						res.MergeBytes, res.MergeMsgs, res.MergeBaselineBytes, res.MergeBaselineMsgs)
				}
				// The ping-pong: ranks 0 and 1, one message each way per
				// step, as long as rank 0's select frame.
				pp, pairs := cnt.op(cnt.sent, collective.OpPingPong)
				_, sel := cnt.op(cnt.sent, collective.OpSelect)
				if pp[1] != 2*steps || len(pairs) != 2 || pairs[[2]int{0, 1}] != sel[[2]int{0, 1}] || res.PingPongBytes*steps != sel[[2]int{0, 1}][0] {
					t.Errorf("ping-pong: %v over %v, select 0->1 %v, %d bytes", pp, pairs, sel[[2]int{0, 1}], res.PingPongBytes)
				}
				if !(res.BaselineP50 > 0 && res.BaselineP50 <= res.BaselineP99 && res.MergeBaselineP50 > 0 && res.PingPongP50 > 0 && res.PingPongP50 <= res.PingPongP99) {
					t.Errorf("baseline latencies %+v", res)
				}
				if want := res.SelectP50 / res.BaselineP50; math.Abs(res.OverheadVsBaseline-want) > 1e-9*want {
					t.Errorf("overhead_vs_baseline %v, want select p50 / baseline p50 = %v", res.OverheadVsBaseline, want)
				}
			})
		}
	}
}

// TestBenchBaselineOneRank: a group of one sends nothing, and reports no
// ping-pong.
func TestBenchBaselineOneRank(t *testing.T) {
	c := smallBench()
	c.Shards, c.Batches = []int{1}, []int{1}
	err := collective.BenchCollective(context.Background(), c, func(r collective.BenchResult) error {
		if r.BaselineBytes != 0 || r.PingPongP50 != 0 || r.PingPongBytes != 0 {
			return fmt.Errorf("one rank: %+v", r)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

func smallSweep() collective.SweepConfig {
	c := collective.DefaultSweepConfig()
	c.Shards, c.MinBytes, c.MaxBytes, c.Factor, c.Steps, c.Warmup = []int{2, 3}, 8, 4096, 4, 10, 1
	return c
}

// TestBenchSweep: one line per distinct message size, with nccl-tests'
// columns: size = N x the message, algbw = size / time, busbw = algbw x
// (N-1)/N; every rank sends its message to every other rank.
func TestBenchSweep(t *testing.T) {
	for _, grpc := range []bool{false, true} {
		t.Run(fmt.Sprint("grpc=", grpc), func(t *testing.T) {
			c := smallSweep()
			cnt := newByteCounter()
			c.Transport, c.NewTransports = "counted", countedGroup(t, cnt, grpc)
			var res []collective.SweepResult
			if err := collective.BenchSweep(context.Background(), c, func(r collective.SweepResult) error {
				res = append(res, r)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// Sizes 8, 32, 128, 512, 2048: messages of 4, 16, 64, 256,
			// 1024 bytes at 2 ranks and 2, 10, 42, 170, 682 at 3.
			want := map[int][]int64{2: {4, 16, 64, 256, 1024}, 3: {2, 10, 42, 170, 682}}
			if len(res) != 10 {
				t.Fatalf("%d lines, want 10: %+v", len(res), res)
			}
			var sent int64
			for i, r := range res {
				n := 2 + i/5
				m := want[n][i%5]
				if r.Op != "allgather" || r.Shards != n || r.MsgBytes != m || r.Bytes != int64(n)*m || r.Processes != 1 || r.Steps != 10 {
					t.Errorf("line %d: %+v, want shards %d, %d-byte messages", i, r, n, m)
				}
				if r.SentBytes != int64(n*(n-1))*m || r.SentMsgs != int64(n*(n-1)) {
					t.Errorf("line %d: sent %d bytes in %d messages a round, want %d in %d", i, r.SentBytes, r.SentMsgs, int64(n*(n-1))*m, n*(n-1))
				}
				if !(r.TimeUS > 0 && r.P50 > 0 && r.P50 <= r.P99 && r.P99 <= r.Max) {
					t.Errorf("line %d: times %+v", i, r)
				}
				alg := float64(r.Bytes) / (r.TimeUS * 1e-6) / 1e9
				if math.Abs(r.AlgBW-alg) > 1e-9*alg || math.Abs(r.BusBW-alg*float64(n-1)/float64(n)) > 1e-9*alg {
					t.Errorf("line %d: algbw %v busbw %v, want %v and %v", i, r.AlgBW, r.BusBW, alg, alg*float64(n-1)/float64(n))
				}
				sent += r.SentBytes * int64(c.Steps+c.Warmup)
			}
			if total, _ := cnt.op(cnt.sent, collective.OpSweep); total[0] != sent {
				t.Errorf("the transports sent %d bytes, the lines say %d", total[0], sent)
			}
		})
	}
}

// TestSweepRank: SweepRank on every member of a group, combined with
// SweepCombine, gives the lines BenchSweep gives (but for the times).
func TestSweepRank(t *testing.T) {
	c := smallSweep()
	n := 3
	trs := collective.NewInprocGroup(n)
	defer func() {
		for _, tr := range trs {
			tr.Close()
		}
	}()
	samples := make([]collective.SweepSamples, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { samples[r], errs[r] = collective.SweepRank(context.Background(), c, trs[r]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	samples[0], samples[2] = samples[2], samples[0]
	res, err := collective.SweepCombine(c, samples)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 5 || res[4].MsgBytes != 682 || res[4].SentBytes != 6*682 || res[0].TimeUS <= 0 {
		t.Errorf("combined %+v", res)
	}
	if _, err := collective.SweepCombine(c, samples[1:]); err == nil {
		t.Error("two ranks' samples of a three-rank sweep combined")
	}
}

// TestSweepConfigValidate: a factor below 2, sizes out of range and a
// smallest size above the largest are range errors naming the field.
func TestSweepConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		set          func(*collective.SweepConfig)
		field, limit string
	}{
		{func(c *collective.SweepConfig) { c.Factor = 1 }, "Factor", ""},
		{func(c *collective.SweepConfig) { c.Factor = 0 }, "Factor", ""},
		{func(c *collective.SweepConfig) { c.Factor = collective.MaxSweepFactor + 1 }, "Factor", ""},
		{func(c *collective.SweepConfig) { c.MinBytes = 0 }, "MinBytes", ""},
		{func(c *collective.SweepConfig) { c.MaxBytes = collective.MaxSweepBytes + 1 }, "MaxBytes", ""},
		{func(c *collective.SweepConfig) { c.MaxBytes = -1 }, "MaxBytes", ""},
		{func(c *collective.SweepConfig) { c.MinBytes, c.MaxBytes = 64, 8 }, "MinBytes", "MaxBytes"},
		{func(c *collective.SweepConfig) { c.Shards = []int{0} }, "Shards", ""},
		{func(c *collective.SweepConfig) { c.Steps = 0 }, "Steps", ""},
	} {
		c := smallSweep()
		tc.set(&c)
		err := c.Validate()
		var re *collective.BenchRangeError
		if !errors.As(err, &re) || re.Field != tc.field || re.Limit != tc.limit {
			t.Errorf("%+v: %v, want a range error on %s (limit %q)", c, err, tc.field, tc.limit)
		}
		if err := collective.BenchSweep(context.Background(), c, func(collective.SweepResult) error {
			t.Error("emitted a result")
			return nil
		}); err == nil {
			t.Errorf("%+v: BenchSweep ran", c)
		}
	}
	c := smallSweep()
	c.MinBytes, c.MaxBytes, c.Factor = 8, 8, 2
	if s := c.Sizes(); len(s) != 1 || s[0] != 8 {
		t.Errorf("sizes of 8..8: %v", s)
	}
	c.MinBytes, c.MaxBytes, c.Factor = 1, collective.MaxSweepBytes, 2
	if s := c.Sizes(); len(s) != 31 || s[30] != collective.MaxSweepBytes {
		t.Errorf("sizes of 1..1GiB by 2: %d, last %d", len(s), s[len(s)-1])
	}
	if s := c.MsgSizes(16); s[0] != 1 || s[1] != 2 || len(s) != 31-4 {
		t.Errorf("messages of 16 ranks: %v", s)
	}
}
