package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/faultproxy"
	"github.com/questrt/questrt/plan"
)

// The chaos tests: the netns cluster of TestNetnsCluster (three questd in
// network namespaces on a bridge, the test in the root namespace), with
// every node's gRPC traffic from the other nodes put through a
// fault-injecting proxy of internal/faultproxy (this kernel has no
// sch_netem):
//
//	node j ──> 10.231.K.254:P_i (proxy i, in the test process) ──> node i 10.231.K.(i+1):7070
//
// Node i advertises its proxy's address (--grpc-advertise), so every
// worker API call and every forwarded client call to node i, its own
// coordinator's included, crosses proxy i; the gossip (memberlist, UDP
// and TCP) and the test's own client calls go direct. Scenarios, each
// over a stream of steps from three concurrent streams (one per
// coordinator, stepped in turn through the coordinator and through the
// next node, so that calls are forwarded too):
//
//   - partition: node 1's veth goes down (gossip and gRPC), then up;
//   - loss: 5% of the chunks (TCP segments) of every proxied connection
//     stall 200 ms, a retransmission (what 5% packet loss looks like
//     through TCP; see faultproxy's doc), both ways;
//   - loss_reset (skipped with chaosSkipResetEnv): 1% of the chunks
//     reset their connection instead;
//   - spikes: 50 ms more latency on 5% of the chunks and in a 200 ms
//     window every second;
//   - kill_restart: kill -9 of node 2, restarted under its name.
//
// Every step either fails with a documented code (UNAVAILABLE or
// DEADLINE_EXCEEDED: decode.proto; NOT_FOUND only for a sequence of the
// killed coordinator once it restarted) within the client's deadline, or
// returns exactly what the in-process engine returns on the same data;
// a step that failed without new tokens changes nothing (its sequence's
// length still equals the reference's, and its later steps still match).
// Steps of sequences placed only on healthy nodes never fail. After each
// fault the cluster converges: every node lists 3 alive, and a sequence
// created through each node spans the three and decodes correctly.
// Nothing leaks: the test's goroutines (goleak), the processes (ended by
// PID), the namespaces and links (deleted, checked).
//
// Two bugs these tests found, fixed in coord (knownIssue names
// them should they come back): the wedge of chaosSkipResetEnv, and after
// a partition heals, now and then (6 of 22 runs before the fix), a grid
// swept by the healed node while its view still showed the coordinator
// gone: the coordinator's creates on that placement then failed
// NOT_FOUND ("unknown grid") for good and the partition scenario did not
// converge.
//
// QUESTRT_CHAOS_OUT=file appends each scenario's counts as one JSON line.

const (
	// chaosCallTimeout is the client's deadline of every call: the
	// step deadline of the nodes and 1 s.
	chaosCallTimeout = netnsStepTimeout + time.Second
	// chaosFailBound bounds the time a failed step may take.
	chaosFailBound = chaosCallTimeout + 500*time.Millisecond
	// chaosConverge bounds the convergence after a fault. A partitioned
	// node declares the others dead as they declare it; once healed, a
	// pair that declared each other dead at the same incarnation
	// reconciles only through a push/pull carrying one's verdict to a
	// node that passes the suspicion on (memberlist's state sync, every
	// 30 s by default): 20 s was not always enough (CI: n1 still listed
	// n2 dead after 20 s). 45 s covers one push/pull of the healed node.
	chaosConverge = 45 * time.Second
	// chaosStreams is the number of concurrent step streams.
	chaosStreams = 3
	// chaosSkipResetEnv, set, skips the loss_reset scenario. Its resets
	// can land on an EndStep, whose error engine.end ignores: the worker
	// keeps that step open and refuses the grid's next BeginStep
	// (worker.ErrStepOpen), which the coordinator takes as the grid's
	// loss (coord's check; before that fix the grid was wedged
	// for good).
	chaosSkipResetEnv = "QUESTRT_CHAOS_SKIP_RESET"
)

// chaosCluster is the running cluster, its proxies and the reference.
type chaosCluster struct {
	ctx     context.Context
	nw      *netnsNet
	proxies []*faultproxy.Proxy
	procs   *[]*netnsProc
	args    [][]string // questd arguments of each node (restart)
	ec      engine.Config
	kv, qd  int

	mu      sync.Mutex
	clients []*client.Client // current client of each node
	old     []*client.Client // replaced clients, closed at cleanup
	proc    []*netnsProc     // current process of each node

	refMu sync.Mutex
	ref   *engine.Engine
}

func (cc *chaosCluster) client(i int) *client.Client {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.clients[i]
}

// dial dials node i directly (not through its proxy) and makes it the
// node's client.
func (cc *chaosCluster) dial(t *testing.T, i int) {
	t.Helper()
	dctx, cancel := context.WithTimeout(cc.ctx, 10*time.Second)
	defer cancel()
	c, err := client.Dial(dctx, cc.nw.ip[i]+":7070", client.Options{})
	if err != nil {
		t.Fatalf("dial n%d: %v", i, err)
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.clients[i] != nil {
		cc.old = append(cc.old, cc.clients[i])
	}
	cc.clients[i] = c
}

// alive returns the members node i lists alive, sorted.
func (cc *chaosCluster) alive(i int) ([]string, error) {
	sctx, cancel := context.WithTimeout(cc.ctx, time.Second)
	defer cancel()
	st, err := cc.client(i).Status(sctx)
	if err != nil {
		return nil, err
	}
	var up []string
	for _, m := range st.GetMembers() {
		if m.GetState() == "alive" {
			up = append(up, m.GetName())
		}
	}
	slices.Sort(up)
	return up, nil
}

// waitAlive waits until every node of idx lists exactly want alive.
func (cc *chaosCluster) waitAlive(t *testing.T, idx []int, want []string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for _, i := range idx {
		for {
			up, err := cc.alive(i)
			if err == nil && slices.Equal(up, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("n%d lists %v alive (%v), want %v within %v", i, up, err, want, within)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return time.Since(start)
}

// setFaults sets f on every proxy.
func (cc *chaosCluster) setFaults(t *testing.T, f faultproxy.Faults) {
	t.Helper()
	for _, p := range cc.proxies {
		if err := p.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
}

// proxyStats sums the proxies' counters.
func (cc *chaosCluster) proxyStats() faultproxy.Stats {
	var s faultproxy.Stats
	for _, p := range cc.proxies {
		ps := p.Stats()
		s.Accepted += ps.Accepted
		s.DialFailures += ps.DialFailures
		s.Open += ps.Open
		s.Chunks += ps.Chunks
		s.Bytes += ps.Bytes
		s.Spiked += ps.Spiked
		s.Stalled += ps.Stalled
		s.Resets += ps.Resets
	}
	return s
}

// chaosSeq is a sequence on the cluster and its twin in the reference.
type chaosSeq struct {
	id    string
	rid   engine.SeqID
	nodes []string
	coord int
}

// create makes a sequence coordinated by node coord with 20 to 60 tokens
// in each layer, and its reference twin once every call succeeded. A
// half-made sequence is released (best effort).
func (cc *chaosCluster) create(rng *rand.Rand, coord int) (*chaosSeq, error) {
	cl := cc.client(coord)
	ctx, cancel := context.WithTimeout(cc.ctx, chaosCallTimeout)
	id, on, err := cl.Create(ctx, plan.Striped)
	cancel()
	if err != nil {
		return nil, err
	}
	tokens := 20 + rng.IntN(40)
	var ks, vs [][]float32
	for l := range cc.ec.Layers {
		k, v := netnsRandVec(rng, tokens*cc.kv), netnsRandVec(rng, tokens*cc.kv)
		ks, vs = append(ks, k), append(vs, v)
		ctx, cancel := context.WithTimeout(cc.ctx, chaosCallTimeout)
		err := cl.Append(ctx, id, l, k, v)
		cancel()
		if err != nil {
			cc.releaseQuiet(cl, id)
			return nil, err
		}
	}
	cc.refMu.Lock()
	defer cc.refMu.Unlock()
	rid, err := cc.ref.Create(plan.Striped)
	if err != nil {
		return nil, fmt.Errorf("reference: %w", err)
	}
	for l := range cc.ec.Layers {
		if err := cc.ref.Append(rid, l, ks[l], vs[l]); err != nil {
			return nil, fmt.Errorf("reference: %w", err)
		}
	}
	return &chaosSeq{id: id, rid: rid, nodes: on, coord: coord}, nil
}

// releaseQuiet releases a sequence on the cluster, best effort (its node
// may be unreachable).
func (cc *chaosCluster) releaseQuiet(cl *client.Client, id string) {
	ctx, cancel := context.WithTimeout(cc.ctx, time.Second)
	defer cancel()
	_ = cl.Release(ctx, id)
}

// drop forgets s on the cluster (best effort) and in the reference.
func (cc *chaosCluster) drop(s *chaosSeq) {
	cc.releaseQuiet(cc.client(s.coord), s.id)
	cc.refMu.Lock()
	defer cc.refMu.Unlock()
	cc.ref.Release(s.rid)
}

// stepResult is the outcome of one step.
type stepResult struct {
	err   error
	took  time.Duration
	wrong string // what differs from the reference, when it does
}

// step runs one step of s's layer through node via, with new tokens when
// fresh, and on success checks it against the reference (which is then
// stepped too).
func (cc *chaosCluster) step(rng *rand.Rand, s *chaosSeq, via, layer int, fresh bool) stepResult {
	q := netnsRandVec(rng, cc.qd)
	var k, v []float32
	if fresh {
		k, v = netnsRandVec(rng, cc.kv), netnsRandVec(rng, cc.kv)
	}
	ctx, cancel := context.WithTimeout(cc.ctx, chaosCallTimeout)
	start := time.Now()
	got, err := cc.client(via).Step(ctx, layer, []client.Item{{Seq: s.id, Q: q, K: k, V: v}}, client.StepOptions{})
	r := stepResult{err: err, took: time.Since(start)}
	cancel()
	if err != nil {
		return r
	}
	var want engine.Result
	cc.refMu.Lock()
	rerr := cc.ref.Step(context.Background(), layer, []engine.Request{{Seq: s.rid, Q: q, K: k, V: v}}, engine.StepOptions{}, &want)
	cc.refMu.Unlock()
	if rerr != nil {
		r.wrong = fmt.Sprintf("the reference step failed: %v", rerr)
		return r
	}
	near := func(a, b float32) bool {
		return math.Abs(float64(a-b)) <= 1e-5*(1+math.Abs(float64(b)))
	}
	switch {
	case len(got.O) != len(want.O) || len(got.LSE) != len(want.LSE) || len(got.Plans) != 1:
		r.wrong = fmt.Sprintf("%d outputs, %d LSE, %d plans; in process %d, %d, 1", len(got.O), len(got.LSE), len(got.Plans), len(want.O), len(want.LSE))
	case got.Plans[0] != want.Plans[0]:
		r.wrong = fmt.Sprintf("plan %+v, in process %+v", got.Plans[0], want.Plans[0])
	default:
		for i := range want.O {
			if !near(got.O[i], want.O[i]) {
				r.wrong = fmt.Sprintf("o[%d] = %g, in process %g", i, got.O[i], want.O[i])
				return r
			}
		}
		for i := range want.LSE {
			if !near(got.LSE[i], want.LSE[i]) {
				r.wrong = fmt.Sprintf("lse[%d] = %g, in process %g", i, got.LSE[i], want.LSE[i])
				return r
			}
		}
	}
	return r
}

// lenMatches reports whether s's length on the cluster (asked of its
// coordinator) is the reference's: an error when the cluster cannot say.
func (cc *chaosCluster) lenMatches(s *chaosSeq) (bool, int, int, error) {
	ctx, cancel := context.WithTimeout(cc.ctx, time.Second)
	defer cancel()
	n, err := cc.client(s.coord).Len(ctx, s.id)
	if err != nil {
		return false, 0, 0, err
	}
	cc.refMu.Lock()
	want, rerr := cc.ref.Len(s.rid)
	cc.refMu.Unlock()
	if rerr != nil {
		return false, n, 0, rerr
	}
	return n == want, n, want, nil
}

// chaosCounts are a scenario's counts (one JSON line of
// QUESTRT_CHAOS_OUT).
type chaosCounts struct {
	Scenario string `json:"scenario"`
	Victim   string `json:"victim,omitempty"`
	// Steps: tried = succeeded + failed_cleanly + unexpected; wrong
	// counts the successes that differ from the reference (and the
	// sequences whose length changed after a failed step).
	Tried        int            `json:"steps_tried"`
	Succeeded    int            `json:"succeeded"`
	Failed       int            `json:"failed_cleanly"`
	FailedByCode map[string]int `json:"failed_by_code"`
	Unexpected   int            `json:"failed_other_code"`
	// Wedged counts the failures among Unexpected that are the wedge of
	// chaosSkipResetEnv (FAILED_PRECONDITION: a step is open).
	Wedged int `json:"failed_step_open"`
	Wrong  int `json:"wrong"`
	// Healthy counts the steps of sequences placed only on healthy nodes,
	// through healthy nodes, during the scenario; HealthyFailed the
	// failures among them (must be 0).
	Healthy       int `json:"healthy_steps"`
	HealthyFailed int `json:"healthy_failed"`
	// Creates made by the streams and how they failed (a failed create
	// is retried; it is no step).
	Creates       int            `json:"creates_tried"`
	CreatesFailed map[string]int `json:"creates_failed_by_code"`
	// Step latencies (ms): median and max of the successes, max of the
	// failures.
	OKMedianMs  float64 `json:"ok_median_ms"`
	OKMaxMs     float64 `json:"ok_max_ms"`
	FailedMaxMs float64 `json:"failed_max_ms"`
	// The proxies' fault counters during the scenario.
	Stalled int64 `json:"chunks_stalled"`
	Spiked  int64 `json:"chunks_spiked"`
	Resets  int64 `json:"conn_resets"`
	// Convergence after the fault: time to 3 alive everywhere, then to a
	// correct sequence through every node, and the attempts it took.
	AliveMs    float64 `json:"converge_alive_ms"`
	ConvergeMs float64 `json:"converge_steps_ms"`
	Attempts   int     `json:"converge_attempts"`
	DurationMs float64 `json:"duration_ms"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// chaosState is what the scenario did to its victim so far.
type chaosState struct {
	mu sync.Mutex
	// down: the victim is faulty, or not converged yet since.
	down bool
	// restarted: the victim restarted (its old sequences are unknown).
	restarted bool
}

func (s *chaosState) set(down, restarted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down, s.restarted = down, restarted
}

// chaosRun is a stream of steps in progress: chaosStreams goroutines,
// stream i over sequences coordinated by node i.
type chaosRun struct {
	cc     *chaosCluster
	t      *testing.T
	victim int // the faulty node, -1 for none (every link faulty)
	state  *chaosState

	stop chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	counts chaosCounts
	okLat  []time.Duration
	errs   int // errors reported (bounded)
}

// healthy reports whether a step of s through via is one of the
// healthy-step property: a victim scenario, and neither via nor any node
// of s is the victim while it is down.
func (r *chaosRun) healthy(s *chaosSeq, via int) bool {
	if r.victim < 0 {
		return false
	}
	r.state.mu.Lock()
	defer r.state.mu.Unlock()
	v := fmt.Sprintf("n%d", r.victim)
	return !r.state.down || (via != r.victim && s.coord != r.victim && !slices.Contains(s.nodes, v))
}

// notFound reports whether NOT_FOUND is a clean failure for a sequence
// coordinated by node i: the victim, since it restarted (its sequences
// died with it).
func (r *chaosRun) notFound(i int) bool {
	r.state.mu.Lock()
	defer r.state.mu.Unlock()
	return r.state.restarted && i == r.victim
}

// startStream starts the streams.
func (cc *chaosCluster) startStream(t *testing.T, name string, victim int, state *chaosState, seed uint64) *chaosRun {
	r := &chaosRun{cc: cc, t: t, victim: victim, state: state, stop: make(chan struct{}),
		counts: chaosCounts{Scenario: name, FailedByCode: map[string]int{}, CreatesFailed: map[string]int{}}}
	if victim >= 0 {
		r.counts.Victim = fmt.Sprintf("n%d", victim)
	}
	for i := range chaosStreams {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		r.wg.Go(func() { r.run(i, rng) })
	}
	return r
}

// errorf reports a test error from a stream (at most 10).
func (r *chaosRun) errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs++
	if r.errs <= 10 {
		r.t.Errorf(format, args...)
	}
}

// sleep waits d or until the run stops; false when it stopped.
func (r *chaosRun) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.stop:
		return false
	}
}

// chaosMaxGrowth bounds the rounds with new tokens a chaos sequence
// takes (at most 60 + 150 tokens, 53 pages of 4 over the CP ranks):
// three streams' sequences then fit the reference engine's 128 pages a
// rank. CI saw the reference's pool exhausted after a 41 s partition
// phase (the convergence wait is 45 s).
const chaosMaxGrowth = 150

// run is stream i: create a sequence through node i, step both layers
// in rounds (new tokens every other round) through node i and then
// through the next node, until the run stops (60 s at most: a bound).
func (r *chaosRun) run(i int, rng *rand.Rand) {
	cc := r.cc
	hard := time.Now().Add(60 * time.Second)
	var s *chaosSeq
	defer func() {
		if s != nil {
			cc.drop(s)
		}
	}()
	grown := 0 // rounds with new tokens on s
	for round := 0; time.Now().Before(hard); round++ {
		select {
		case <-r.stop:
			return
		default:
		}
		if s != nil && grown >= chaosMaxGrowth {
			// A sequence grows a token a layer every other round: past
			// this it starts afresh, so neither a grid's pool nor the
			// reference's (every stream's sequences in one engine of
			// the same capacity) fills however long a phase runs.
			cc.drop(s)
			s = nil
		}
		if s == nil {
			grown = 0
			var err error
			s, err = cc.create(rng, i)
			r.mu.Lock()
			r.counts.Creates++
			if err != nil {
				r.counts.CreatesFailed[status.Code(err).String()]++
			}
			r.mu.Unlock()
			if err != nil {
				if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded && !(c == codes.NotFound && r.notFound(i)) {
					r.errorf("create through n%d: %v (code %v)%s", i, err, c, knownIssue(err))
				}
				if !r.sleep(100 * time.Millisecond) {
					return
				}
				continue
			}
		}
		via := i
		if round%2 == 1 {
			via = (i + 1) % len(cc.nw.ip)
		}
		fresh := round%4 < 2
		if fresh {
			grown++
		}
		for layer := range cc.ec.Layers {
			// Healthy all along: at the start and at the end of the step.
			healthy := r.healthy(s, via)
			res := cc.step(rng, s, via, layer, fresh)
			healthy = healthy && r.healthy(s, via)
			if !r.record(s, via, layer, fresh, healthy, res) {
				// The sequence is kept after a failed step without new
				// tokens while its length still equals the reference's.
				keep := false
				if !fresh {
					ok, got, want, err := cc.lenMatches(s)
					keep = err == nil && ok
					if err == nil && !ok {
						r.mu.Lock()
						r.counts.Wrong++
						r.mu.Unlock()
						r.errorf("%s: length %d after a failed step without new tokens, in process %d", s.id, got, want)
					}
				}
				if !keep {
					cc.drop(s)
					s = nil
				}
				if !r.sleep(50 * time.Millisecond) {
					return
				}
				break
			}
		}
		if !r.sleep(15 * time.Millisecond) {
			return
		}
	}
}

// record counts one step; it reports whether the step succeeded
// correctly.
func (r *chaosRun) record(s *chaosSeq, via, layer int, fresh, healthy bool, res stepResult) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &r.counts
	c.Tried++
	if healthy {
		c.Healthy++
	}
	what := fmt.Sprintf("%s (on %v) layer %d via n%d (new tokens %v)", s.id, s.nodes, layer, via, fresh)
	if res.err == nil {
		if res.wrong != "" {
			c.Wrong++
			r.errs++
			if r.errs <= 10 {
				r.t.Errorf("WRONG RESULT: %s: %s", what, res.wrong)
			}
			return false
		}
		c.Succeeded++
		r.okLat = append(r.okLat, res.took)
		return true
	}
	code := status.Code(res.err)
	clean := code == codes.Unavailable || code == codes.DeadlineExceeded || (code == codes.NotFound && r.notFound(s.coord))
	c.FailedMaxMs = max(c.FailedMaxMs, ms(res.took))
	r.errs0(healthy, what, res, clean)
	if clean {
		c.Failed++
		c.FailedByCode[code.String()]++
	} else {
		c.Unexpected++
		if wedged(res.err) {
			c.Wedged++
		}
	}
	if healthy {
		c.HealthyFailed++
	}
	return false
}

// errs0 reports the errors of a failed step (r.mu held).
func (r *chaosRun) errs0(healthy bool, what string, res stepResult, clean bool) {
	report := func(format string, args ...any) {
		r.errs++
		if r.errs <= 10 {
			r.t.Errorf(format, args...)
		}
	}
	if !clean {
		report("%s: %v: want UNAVAILABLE or DEADLINE_EXCEEDED%s", what, res.err, knownIssue(res.err))
	}
	if res.took > chaosFailBound {
		report("%s: failed after %v, more than %v", what, res.took, chaosFailBound)
	}
	if healthy {
		report("%s: placed on healthy nodes only, through a healthy node, failed: %v", what, res.err)
	}
}

// knownIssue explains the failures of the questrt issues these tests
// found (empty for others).
func knownIssue(err error) string {
	switch {
	case err == nil:
		return ""
	case wedged(err):
		return " (REGRESSION, see chaosSkipResetEnv: a grid wedged by a lost EndStep was not taken as lost)"
	case status.Code(err) == codes.NotFound && strings.Contains(err.Error(), "unknown grid"):
		return " (REGRESSION: after a partition heals, a node whose view still shows the coordinator gone sweeps the grid the " +
			"coordinator just opened on it (node.sweep); the coordinator must take the worker's unknown grid as the grid's loss " +
			"and answer UNAVAILABLE (create on a fresh grid), coord's check and Create; TestSweptGridIsLost)"
	}
	return ""
}

// wedged reports whether err is the lost-EndStep wedge of chaosSkipResetEnv.
func wedged(err error) bool {
	return status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "a step is open")
}

// finish stops the streams, waits for them and returns the counts.
func (r *chaosRun) finish() chaosCounts {
	close(r.stop)
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.okLat) > 0 {
		r.counts.OKMedianMs = ms(netnsMedian(r.okLat))
		r.counts.OKMaxMs = ms(slices.Max(r.okLat))
	}
	return r.counts
}

// converge waits until every node lists 3 alive, then until a sequence
// created through each node spans the three and decodes two rounds of
// both layers (through it and through the next node) exactly as the
// reference. Failures on the way are retried (new sequence); wrong
// results are errors.
func (cc *chaosCluster) converge(t *testing.T, c *chaosCounts, seed uint64) {
	t.Helper()
	all := []string{"n0", "n1", "n2"}
	c.AliveMs = ms(cc.waitAlive(t, []int{0, 1, 2}, all, chaosConverge))
	start := time.Now()
	deadline := start.Add(chaosConverge)
	rng := rand.New(rand.NewPCG(seed, 99))
	var last error
	for i := range len(cc.nw.ip) {
	attempt:
		for {
			if time.Now().After(deadline) {
				t.Fatalf("no correct sequence through n%d within %v of 3 alive: last %v%s", i, chaosConverge, last, knownIssue(last))
			}
			c.Attempts++
			s, err := cc.create(rng, i)
			if err != nil {
				last = err
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if names := slices.Sorted(slices.Values(s.nodes)); !slices.Equal(names, all) {
				last = fmt.Errorf("%s placed on %v", s.id, s.nodes)
				cc.drop(s)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for round := range 2 {
				for layer := range cc.ec.Layers {
					res := cc.step(rng, s, (i+round)%len(cc.nw.ip), layer, round == 0)
					if res.wrong != "" {
						c.Wrong++
						t.Errorf("WRONG RESULT after convergence: %s layer %d: %s", s.id, layer, res.wrong)
					}
					if res.err != nil || res.wrong != "" {
						last = res.err
						cc.drop(s)
						time.Sleep(100 * time.Millisecond)
						continue attempt
					}
				}
			}
			cc.drop(s)
			break
		}
	}
	c.ConvergeMs = ms(time.Since(start))
}

// report logs c and appends it to QUESTRT_CHAOS_OUT.
func chaosReport(t *testing.T, c chaosCounts) {
	t.Helper()
	t.Logf("%s: %d steps tried: %d succeeded, %d failed cleanly %v, %d other code (%d step open), %d WRONG; healthy steps %d (failed %d); "+
		"creates %d (failed %v); ok median %.1fms max %.1fms, failed max %.1fms; proxies: %d stalled, %d spiked, %d resets; "+
		"converged: 3 alive in %.0fms, correct steps through every node %.0fms later (%d attempts); %.1fs",
		c.Scenario, c.Tried, c.Succeeded, c.Failed, c.FailedByCode, c.Unexpected, c.Wedged, c.Wrong, c.Healthy, c.HealthyFailed,
		c.Creates, c.CreatesFailed, c.OKMedianMs, c.OKMaxMs, c.FailedMaxMs, c.Stalled, c.Spiked, c.Resets,
		c.AliveMs, c.ConvergeMs, c.Attempts, c.DurationMs/1000)
	path := os.Getenv("QUESTRT_CHAOS_OUT")
	if path == "" {
		return
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("QUESTRT_CHAOS_OUT: %v", err)
		return
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		t.Errorf("QUESTRT_CHAOS_OUT: %v", err)
	}
}

// TestChaos runs the chaos scenarios described at the top of this file on
// one netns cluster, in order; a scenario that fails ends the test.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("chaos test: needs root (ip netns)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("chaos test: ip (iproute2) not found: %v", err)
	}
	began := time.Now()
	// Registered first, so run last: after the clients, processes,
	// proxies and namespaces are gone.
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, leaks)
		t.Logf("wall time %v (cleanup included)", time.Since(began).Round(time.Millisecond))
	})
	var nw *netnsNet
	t.Cleanup(func() {
		if nw == nil {
			return
		}
		// The namespaces and the root namespace's veth are gone.
		out, err := netnsIP("ip", "netns", "list")
		if err != nil {
			t.Errorf("ip netns list: %v", err)
		}
		for _, ns := range append([]string{nw.sw}, nw.nodes...) {
			for _, f := range strings.Fields(out) {
				if f == ns {
					t.Errorf("namespace %s left behind", ns)
				}
			}
		}
		if _, err := netnsIP("ip", "link", "show", "dev", nw.host); err == nil {
			t.Errorf("link %s left behind", nw.host)
		}
	})
	const n = 3
	nw = netnsSetup(t, n)
	t.Logf("namespaces %s %v, nodes at %v, test (client and proxies) at %s", nw.sw, nw.nodes, nw.ip, nw.hostIP)

	ctx := t.Context()
	ec := netnsEngineConfig()
	cc := &chaosCluster{ctx: ctx, nw: nw, ec: ec, kv: ec.KVHeads * ec.HeadDim, qd: ec.QHeads * ec.HeadDim,
		clients: make([]*client.Client, n), proc: make([]*netnsProc, n)}
	// Proxy i, in the root namespace on the bridge's subnet, forwards to
	// node i's gRPC address. Closed after the processes stop.
	t.Cleanup(func() {
		for i, p := range cc.proxies {
			p.Close()
			t.Logf("proxy %d (%s -> %s): %+v", i, p.Addr(), p.Target(), p.Stats())
		}
	})
	for i := range n {
		p, err := faultproxy.Listen(context.Background(), nw.hostIP+":0",
			faultproxy.Config{Target: nw.ip[i] + ":7070", Seed: uint64(os.Getpid())*10 + uint64(i)})
		if err != nil {
			t.Fatal(err)
		}
		cc.proxies = append(cc.proxies, p)
	}

	var procs []*netnsProc
	cc.procs = &procs
	// The nodes' logs (netnsStart writes them under t.TempDir) are
	// removed after the processes stop, so that their tails can be shown.
	_ = t.TempDir()
	t.Cleanup(func() {
		netnsStopAll(t, procs)
		// Every process we started has ended: reaped, its PID gone.
		for _, p := range procs {
			select {
			case <-p.done:
			default:
				t.Errorf("%s (pid %d) not ended", p.name, p.cmd.Process.Pid)
				continue
			}
			if err := syscall.Kill(p.cmd.Process.Pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("%s: pid %d still exists after its end: %v", p.name, p.cmd.Process.Pid, err)
			}
		}
	})
	fast := []string{"--plaintext", "--probe-interval", "100ms", "--probe-timeout", "50ms", "--suspicion-mult", "2",
		"--gossip-interval", "50ms", "--dead-node-reclaim", "100ms", "--drain-timeout", "1s",
		"--max-pages", "8192"} // 64 grids a node: lost grids on unreachable nodes wait for their sweep
	var join string
	for i := range n {
		args := append(slices.Clone(fast), netnsGeometryFlags...)
		args = append(args, "--grpc-addr", nw.ip[i]+":7070", "--gossip-addr", nw.ip[i]+":7946",
			"--grpc-advertise", cc.proxies[i].Addr().String())
		if i > 0 {
			args = append(args, "--join", join)
		}
		cc.args = append(cc.args, args)
		r := netnsStart(t, cc.procs, nw.nodes[i], fmt.Sprintf("n%d", i), args...)
		if r.GRPC != cc.proxies[i].Addr().String() {
			t.Fatalf("n%d ready line %+v: want grpc %s (--grpc-advertise)", i, r, cc.proxies[i].Addr())
		}
		if i == 0 {
			join = r.Gossip
		}
		cc.proc[i] = procs[len(procs)-1]
	}
	t.Cleanup(func() {
		cc.mu.Lock()
		defer cc.mu.Unlock()
		for _, c := range append(cc.old, cc.clients...) {
			if c != nil {
				c.Close()
			}
		}
	})
	for i := range n {
		cc.dial(t, i)
	}
	ref, err := engine.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	cc.ref = ref
	t.Cleanup(func() { ref.Close() })

	all := []string{"n0", "n1", "n2"}
	cc.waitAlive(t, []int{0, 1, 2}, all, 15*time.Second)
	// Every node's meta names its proxy: node-to-node gRPC crosses them.
	st, err := cc.client(0).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.GetMembers() {
		var i int
		fmt.Sscanf(m.GetName(), "n%d", &i)
		if m.GetGrpcAddr() != cc.proxies[i].Addr().String() {
			t.Fatalf("n0 lists %s at %s, want its proxy %s", m.GetName(), m.GetGrpcAddr(), cc.proxies[i].Addr())
		}
	}
	seed := uint64(os.Getpid())
	t.Logf("cluster of 3 formed; seed %d", seed)
	var base chaosCounts
	cc.converge(t, &base, seed)
	if ps := cc.proxyStats(); ps.Accepted == 0 || ps.Bytes == 0 {
		t.Fatalf("proxies %+v: no node-to-node traffic went through them", ps)
	}

	// scenario runs body over a stream of steps and reports the counts.
	scenario := func(name string, victim int, body func(t *testing.T, r *chaosRun, st *chaosState)) bool {
		return t.Run(name, func(t *testing.T) {
			start := time.Now()
			before := cc.proxyStats()
			st := &chaosState{}
			r := cc.startStream(t, name, victim, st, seed+uint64(len(name)))
			defer func() {
				// On a failure the streams still end.
				select {
				case <-r.stop:
				default:
					r.finish()
				}
			}()
			body(t, r, st)
			c := r.finish()
			cc.setFaults(t, faultproxy.Faults{})
			after := cc.proxyStats()
			c.Stalled, c.Spiked, c.Resets = after.Stalled-before.Stalled, after.Spiked-before.Spiked, after.Resets-before.Resets
			if !t.Failed() {
				cc.converge(t, &c, seed+uint64(len(name)))
			}
			c.DurationMs = ms(time.Since(start))
			chaosReport(t, c)
			if c.Wrong != 0 {
				t.Errorf("%s: %d wrong results", name, c.Wrong)
			}
			if c.Tried == 0 || c.Succeeded == 0 {
				t.Errorf("%s: %d steps tried, %d succeeded: the stream did not run", name, c.Tried, c.Succeeded)
			}
		})
	}
	// hold waits d, or fails the test when the test's context ends.
	hold := func(t *testing.T, d time.Duration) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			t.Fatal("test context ended")
		}
	}
	link := func(t *testing.T, i int, state string) {
		t.Helper()
		if _, err := netnsIP("ip", "-n", nw.nodes[i], "link", "set", "dev", nw.dev[i], state); err != nil {
			t.Fatal(err)
		}
	}

	// (a) Partition n1 (its veth down: gossip, gRPC and the test's
	// client all cut) for 3 s, then heal.
	if !scenario("partition", 1, func(t *testing.T, r *chaosRun, st *chaosState) {
		hold(t, time.Second)
		st.set(true, false)
		link(t, 1, "down")
		healed := false
		defer func() {
			if !healed {
				link(t, 1, "up")
			}
		}()
		d := cc.waitAlive(t, []int{0, 2}, []string{"n0", "n2"}, 10*time.Second)
		t.Logf("n0 and n2 list n1 not alive %v after its link went down", d.Round(time.Millisecond))
		hold(t, 3*time.Second-d)
		link(t, 1, "up")
		healed = true
		// A node that comes back is unhealthy until it converges.
		d = cc.waitAlive(t, []int{0, 1, 2}, all, chaosConverge)
		t.Logf("3 alive everywhere %v after the link came back", d.Round(time.Millisecond))
		hold(t, 1500*time.Millisecond)
		st.set(false, false)
	}) {
		return
	}

	// (b) 5% packet loss on every node-to-node link: 5% of the chunks
	// (TCP segments) of every proxied connection, both ways, stall for a
	// retransmission of 200 ms.
	if !scenario("loss", -1, func(t *testing.T, r *chaosRun, _ *chaosState) {
		cc.setFaults(t, faultproxy.Faults{LossProb: 0.05, Loss: faultproxy.LossStall, LossDelay: 200 * time.Millisecond})
		hold(t, 5*time.Second)
		cc.setFaults(t, faultproxy.Faults{})
		hold(t, 500*time.Millisecond)
	}) {
		return
	}

	// (c) 50 ms latency spikes on every node-to-node link: on 5% of the
	// chunks, and on every chunk in a 200 ms window each second.
	if !scenario("spikes", -1, func(t *testing.T, r *chaosRun, _ *chaosState) {
		cc.setFaults(t, faultproxy.Faults{SpikeDelay: 50 * time.Millisecond, SpikeProb: 0.05,
			SpikeEvery: time.Second, SpikeFor: 200 * time.Millisecond})
		hold(t, 5*time.Second)
		cc.setFaults(t, faultproxy.Faults{})
		hold(t, 500*time.Millisecond)
		r.mu.Lock()
		slow := slices.ContainsFunc(r.okLat, func(d time.Duration) bool { return d >= 50*time.Millisecond })
		r.mu.Unlock()
		if !slow {
			t.Errorf("no step took 50 ms or more under 50 ms latency spikes")
		}
	}) {
		return
	}

	// (d) kill -9 of n2 during the stream, then a restart under its name
	// on the same addresses.
	if !scenario("kill_restart", 2, func(t *testing.T, r *chaosRun, st *chaosState) {
		hold(t, time.Second)
		st.set(true, false)
		victim := cc.proc[2]
		if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case <-victim.done:
		case <-time.After(5 * time.Second):
			t.Fatalf("n2 (pid %d) still runs 5s after SIGKILL", victim.cmd.Process.Pid)
		}
		killed := time.Now()
		d := cc.waitAlive(t, []int{0, 1}, []string{"n0", "n1"}, 10*time.Second)
		t.Logf("n2 (pid %d) killed: %v; n0 and n1 list it not alive %v later", victim.cmd.Process.Pid, victim.err, d.Round(time.Millisecond))
		hold(t, time.Second)
		st.set(true, true)
		rd := netnsStart(t, cc.procs, nw.nodes[2], "n2", cc.args[2]...)
		cc.mu.Lock()
		cc.proc[2] = (*cc.procs)[len(*cc.procs)-1]
		cc.mu.Unlock()
		t.Logf("n2 restarted (pid %d, ready %+v) %v after the kill", cc.proc[2].cmd.Process.Pid, rd, time.Since(killed).Round(time.Millisecond))
		cc.dial(t, 2)
		d = cc.waitAlive(t, []int{0, 1, 2}, all, chaosConverge)
		t.Logf("3 alive everywhere %v after the restart", d.Round(time.Millisecond))
		hold(t, 1500*time.Millisecond)
		st.set(false, true)
	}) {
		return
	}

	// (b') Loss that resets connections: 1% of the chunks reset theirs.
	if os.Getenv(chaosSkipResetEnv) != "" {
		t.Run("loss_reset", func(t *testing.T) { t.Skipf("%s is set", chaosSkipResetEnv) })
		return
	}
	scenario("loss_reset", -1, func(t *testing.T, r *chaosRun, _ *chaosState) {
		cc.setFaults(t, faultproxy.Faults{LossProb: 0.01, Loss: faultproxy.LossReset})
		hold(t, 4*time.Second)
		cc.setFaults(t, faultproxy.Faults{})
		hold(t, 500*time.Millisecond)
	})
}
