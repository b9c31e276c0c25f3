package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// The soak (kill9SoakEnv) of TestQuestdKill9InStep puts the
// coordinator n0 among the victims (by default only n1 and n2: under a
// loaded machine a busy node is still taken for a dead one now and
// then, and a coordinator's restart adds the most of that churn; seen
// once in the soak, seed 4 on 2 cores shared with other builds: the
// restarted coordinator's grid swept by a node whose memberlist marked
// the live coordinator failed). Two causes of a freed sequence after a
// coordinator restart are fixed: a Recover on a view that lacked a node
// opened a grid that kept the recovered directory from the full
// placement's grid (seed 1), and a node swept the restarted
// coordinator's new grid while its view still showed the old instance
// (seeds 3 and 5).
//
// Recovery's per-layer losses are exact where Recovered.LostExact says
// so, and checked exactly; the others would be upper bounds, checked as
// bounds and counted, and there must be none: a kill -9 leaves every
// node's per-layer length record (pagestore's lengths file, format 2).
// Before it, the record held only the longest layer, and a node killed
// inside a step's first layer, the survivors keeping that layer's token,
// the next layer never reached, had the layers the step did not reach
// estimated one token too many (seed 27, QUESTRT_KILL9_SOAK=30, round
// 8: 24 estimated, one too many). A token whose step answered
// is never reported rolled back (a node killed after the answer and
// before its EndStep used to roll it back: worker.Local.stepDone).

// TestQuestdKill9InStep: three questd processes with --data-dir on
// loopback, one CP = 3 sequence over them (coordinated by n0) decoded
// step after step (Begin, a Layer call per layer, End) beside an
// in-process engine of the same config that never fails (the
// reference). Several times (seeded: the victim node and the moment) a
// node is killed with SIGKILL inside a step, at a random point between
// the step's start and its usual duration, then restarted under its
// name on its data directory. Every step either completes with
// outputs and LSE bit-identical to the reference's, or fails. After
// each restart the coordinator's Recovered adopts the sequence: its
// per-layer lengths never exceed what was acknowledged (or, for a step
// that committed on every node although its answer was lost, one
// token more), its per-layer losses marked exact (LostExact) are exact
// (Lost - RolledBack are the acknowledged tokens each layer lacks) and
// the others upper bounds of them, its length is the
// shortest layer's (uneven layers are adopted, not refused), and after
// the client appends each layer's missing tokens again, the next steps
// are bit-identical to the reference's from that length.
func TestQuestdKill9InStep(t *testing.T) {
	kills, seed := kill9Settings(t, 6, 27)
	rng := rand.New(rand.NewPCG(seed, 27))
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(30+15*kills)*time.Second)
	defer cancel()

	// The cluster: smallNode's model with CP 3, fast failure detection.
	kc := startKill9Cluster(t)
	nodes, ref, ec := kc.nodes, kc.ref, kc.ec
	start := func(i int) { kc.start(t, i) }
	kv, qd, L := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim, ec.Layers
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	c := kc.dial(ctx, t, nil)
	dial := func() { c = kc.dial(ctx, t, c) }
	defer func() { c.Close() }()
	// Every node lists the three alive before the first sequence.
	waitMembers := func() { kc.waitMembers(ctx, t, c) }
	waitMembers()

	// The sequence, its reference twin, and every token of each layer
	// that the reference holds (hist: the keys and values to append
	// again after a loss).
	seq, on, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rid, err := ref.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sequence %s on %v", seq, on)
	hist := make([][2][]float32, L)
	n0 := 20 + rng.IntN(20)
	for l := range L {
		k, v := vec(n0*kv), vec(n0*kv)
		if err := c.Append(ctx, seq, l, k, v); err != nil {
			t.Fatal(err)
		}
		if err := ref.Append(rid, l, k, v); err != nil {
			t.Fatal(err)
		}
		hist[l] = [2][]float32{k, v}
	}
	acked := n0 // the reference's length: the acknowledged tokens

	// step runs one decode step on the cluster, killing node victim
	// (when >= 0) after delay; on success the reference steps too and
	// the outputs must be equal bit for bit. It returns the step's
	// inputs and its error.
	var took []time.Duration
	type inputs struct {
		q, k, v [][]float32
		issued  int // the layers whose Layer call was made
	}
	step := func(victim int, delay time.Duration) (inputs, error) {
		t.Helper()
		in := inputs{q: make([][]float32, L), k: make([][]float32, L), v: make([][]float32, L)}
		for l := range L {
			in.q[l], in.k[l], in.v[l] = vec(qd), vec(kv), vec(kv)
		}
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		if victim >= 0 {
			// A step done before the delay: the kill comes right after it.
			pid := nodes[victim].p.cmd.Process.Pid
			kill := func() { _ = syscall.Kill(pid, syscall.SIGKILL) }
			tm := time.AfterFunc(delay, kill)
			defer func() {
				if tm.Stop() {
					kill()
				}
			}()
		}
		began := time.Now()
		outs := make([][]float32, L)
		lses := make([][]float32, L)
		err := func() error {
			st, err := c.Begin(sctx, decode.Batch{Rows: []decode.Row{{Seq: c.Handle(seq), New: true}}})
			if err != nil {
				return err
			}
			for l := range L {
				var res decode.Result
				in.issued = l + 1
				if err := st.Layer(sctx, l, decode.Host(in.q[l]), decode.Host(in.k[l]), decode.Host(in.v[l]), &res); err != nil {
					_ = st.End(sctx)
					return fmt.Errorf("layer %d: %w", l, err)
				}
				outs[l], lses[l] = slices.Clone(res.O.Data), slices.Clone(res.LSE)
			}
			return st.End(sctx)
		}()
		if err != nil {
			return in, err
		}
		took = append(took, time.Since(began))
		for l := range L {
			var want engine.Result
			if err := ref.Step(ctx, l, []engine.Request{{Seq: rid, Q: in.q[l], K: in.k[l], V: in.v[l]}}, engine.StepOptions{}, &want); err != nil {
				t.Fatalf("reference step: %v", err)
			}
			if !equalBits(outs[l], want.O) || !equalBits(lses[l], want.LSE) {
				t.Fatalf("step at length %d, layer %d: the output differs from the reference's", acked, l)
			}
			hist[l][0], hist[l][1] = append(hist[l][0], in.k[l]...), append(hist[l][1], in.v[l]...)
		}
		acked++
		return in, nil
	}
	// usual is the median duration of the successful steps so far.
	usual := func() time.Duration {
		d := slices.Clone(took)
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return max(d[len(d)/2], time.Millisecond)
	}

	var failed, succeeded, killedInside, keptFailed, rolledBack, estimated, overEstimated int
	// The coordinator n0 is a victim in the soak only (kill9SoakEnv).
	victims := []int{1, 2}
	if os.Getenv(kill9SoakEnv) != "" {
		victims = []int{0, 1, 2}
	}
	for round := range kills {
		for range 2 + rng.IntN(3) {
			if _, err := step(-1, 0); err != nil {
				t.Fatalf("round %d: a step with every node up failed: %v", round, err)
			}
			succeeded++
		}
		if round%len(victims) == 0 {
			rng.Shuffle(len(victims), func(i, j int) { victims[i], victims[j] = victims[j], victims[i] })
		}
		victim := victims[round%len(victims)]
		delay := time.Duration(rng.Int64N(int64(usual()) + 1))
		in, err := step(victim, delay)
		v := nodes[victim]
		select {
		case <-v.p.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: %s (pid %d) still runs 10 s after its SIGKILL", round, v.name, v.p.cmd.Process.Pid)
		}
		if err == nil {
			succeeded++
			t.Logf("round %d: %s killed %v into a step of usually %v: the step completed first", round, v.name, delay, usual())
		} else {
			failed++
			killedInside++
			t.Logf("round %d: %s killed %v into a step of usually %v: %v", round, v.name, delay, usual(), err)
		}
		start(victim)
		if victim == 0 {
			dial()
		}
		waitMembers()

		// Recovered adopts the sequence (retried while the restart
		// settles: a node still joining, a recovery not finished).
		var r client.Recovered
		found := false
		for deadline := time.Now().Add(30 * time.Second); !found; {
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			recs, dmg, err := c.Recovered(rctx)
			rcancel()
			// A coordinator that stayed up adopts it under a new id (its
			// lost grid's name of it is taken) and still lists what it
			// adopted before; a restarted one adopts it under its id.
			for _, x := range recs {
				if x.RenamedFrom == seq || (victim == 0 && x.ID == seq) {
					r, found = x, true
				}
			}
			for _, d := range dmg {
				if d.ID == seq {
					t.Fatalf("round %d: %s not adopted: %+v", round, seq, d)
				}
			}
			if !found && time.Now().After(deadline) {
				t.Fatalf("round %d: %s not recovered 30 s after the restart (recovered %+v, damaged %+v, %v)", round, seq, recs, dmg, err)
			}
			if !found {
				time.Sleep(100 * time.Millisecond)
			}
		}
		t.Logf("round %d: recovered %+v (acknowledged %d)", round, r, acked)
		// What each layer held of the client's tokens at the stop: its
		// length now and the tokens it lost less those an interrupted
		// step had appended (rolled back). That is the acknowledged
		// tokens, or one more in a layer that the failed step reached
		// (a failed step's token stays in the layers that took it: the
		// workers' EndStep keeps them, worker/step.go), never more.
		if len(r.Lens) != L || len(r.Lost) != L || (r.RolledBack != nil && len(r.RolledBack) != L) {
			t.Fatalf("round %d: %d lengths, %d losses, %d rolled back for %d layers", round, len(r.Lens), len(r.Lost), len(r.RolledBack), L)
		}
		if r.Len != slices.Min(r.Lens) {
			t.Fatalf("round %d: length %d, shortest layer %d", round, r.Len, slices.Min(r.Lens))
		}
		maxHad := acked
		if err != nil && in.issued > 0 {
			maxHad++
		}
		if r.Had > maxHad || r.Had < slices.Max(r.Lens) {
			t.Fatalf("round %d: had %d tokens, recovered %v: %d acknowledged, at most %d appended", round, r.Had, r.Lens, acked, maxHad)
		}
		if r.LostExact != nil && len(r.LostExact) != L {
			t.Fatalf("round %d: %d exact flags for %d layers", round, len(r.LostExact), L)
		}
		want := acked
		held := make([]int, L)
		for l := range L {
			rb := 0
			if r.RolledBack != nil {
				rb = r.RolledBack[l]
			}
			rolledBack += rb
			held[l] = r.Lens[l] + r.Lost[l] - rb
			if rb < 0 || rb > r.Lost[l] {
				t.Fatalf("round %d: layer %d lost %d, rolled back %d", round, l, r.Lost[l], rb)
			}
			// The layer held acked tokens of the client's, or acked+1
			// where the failed step reached it.
			reached := err != nil && l < in.issued
			if r.LostExact == nil || !r.LostExact[l] {
				// Estimated: an upper bound of what it held, never
				// past the tokens ever appended.
				estimated++
				if held[l] < acked || held[l] > acked+1 || (held[l] == acked+1 && err == nil) {
					t.Fatalf("round %d: layer %d recovered %d, lost %d (estimated), rolled back %d: bound %d, %d acknowledged, at most %d appended",
						round, l, r.Lens[l], r.Lost[l], rb, held[l], acked, maxHad)
				}
				if held[l] == acked+1 && !reached {
					overEstimated++
					t.Logf("round %d: layer %d reported lost %d (estimated), one more than it lost (the failed step reached %d layers)", round, l, r.Lost[l], in.issued)
				}
				continue
			}
			if held[l] != acked && (!reached || held[l] != acked+1) {
				t.Fatalf("round %d: layer %d recovered %d, lost %d (exact), rolled back %d: it held %d tokens of the client's at the stop, %d acknowledged (the failed step reached %d layers)",
					round, l, r.Lens[l], r.Lost[l], rb, held[l], acked, in.issued)
			}
			want = max(want, held[l])
		}
		if want > acked {
			// The failed step's token stayed: the reference and the
			// history take it in every layer, the cluster gets it again
			// below in the layers that lack it.
			keptFailed++
			for l := range L {
				if err := ref.Append(rid, l, in.k[l], in.v[l]); err != nil {
					t.Fatal(err)
				}
				hist[l][0], hist[l][1] = append(hist[l][0], in.k[l]...), append(hist[l][1], in.v[l]...)
			}
			acked++
		}
		if n, err := c.Len(ctx, r.ID); err != nil || n != slices.Min(r.Lens) {
			t.Fatalf("round %d: length of %s: %d, %v; want %d", round, r.ID, n, err, slices.Min(r.Lens))
		}
		// The missing tokens again, layer by layer.
		if r.ID != seq {
			_ = c.Release(ctx, seq) // the lost grid's name of it
			seq = r.ID
		}
		for l := range L {
			if n := r.Lens[l]; n < acked {
				if err := c.Append(ctx, seq, l, hist[l][0][n*kv:], hist[l][1][n*kv:]); err != nil {
					t.Fatalf("round %d: append layer %d again from %d: %v", round, l, n, err)
				}
			}
		}
	}
	for range 3 {
		if _, err := step(-1, 0); err != nil {
			t.Fatalf("after the last restart: %v", err)
		}
		succeeded++
	}
	t.Logf("%d kills: %d inside a step (step failed), %d after it; %d steps bit-identical to the reference; %d failed steps whose token stayed in the layers it reached; %d tokens rolled back; %d layer losses estimated, %d of them one more than the layer lost; length %d",
		kills, killedInside, kills-killedInside, succeeded, keptFailed, rolledBack, estimated, overEstimated, acked)
	if failed == 0 {
		t.Logf("no kill landed inside a step")
	}
	if estimated > 0 {
		t.Errorf("%d layer losses estimated (%d one too many): every node's per-layer length record survives a kill -9, so every loss must be exact", estimated, overEstimated)
	}
}
