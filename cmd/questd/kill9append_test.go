package main

import (
	"context"
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// TestQuestdKill9InAppend: issue 27's crash test inside appends. Three
// questd processes with --data-dir hold one CP 3 sequence (coordinated
// by n0); the client appends chunks of 8 to 40 tokens to one layer at a
// time (the chunks seal pages on every rank) and several times (seeded)
// a node, the coordinator n0 included, is killed with SIGKILL at a
// random point of an append, then restarted on its directory. Recovered must then report, per layer, a
// length no longer than what the client ever sent to that layer and,
// with the tokens it reports lost, at least what was acknowledged
// (nothing acknowledged lost unreported, nothing never sent kept); the
// client appends each layer again from its recovered length, and the
// next steps must equal, bit for bit, those of an in-process engine that
// took every chunk once (whatever a layer kept of an interrupted chunk
// is exactly that chunk's prefix). QUESTRT_KILL9_SOAK=N runs N kills
// with a fresh seed (QUESTRT_KILL9_SEED repeats one).
func TestQuestdKill9InAppend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills processes")
	}
	kills, seed := kill9Settings(t, 9, 28)
	rng := rand.New(rand.NewPCG(seed, 27))
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(30+15*kills)*time.Second)
	defer cancel()
	kc := startKill9Cluster(t, "--capacity-pages", "4096")
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
	waitMembers := func() { kc.waitMembers(ctx, t, c) }
	waitMembers()
	seq, _, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rid, err := ref.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	// hist: every token sent to each layer (the reference holds them
	// all); acked: the tokens of each layer acknowledged by the cluster.
	hist := make([][2][]float32, L)
	acked := make([]int, L)
	var took []time.Duration
	// appendChunk sends n new tokens to layer l, killing node victim
	// (when >= 0) after delay; the reference takes them whatever happens.
	appendChunk := func(l, n, victim int, delay time.Duration) error {
		k, v := vec(n*kv), vec(n*kv)
		if err := ref.Append(rid, l, k, v); err != nil {
			t.Fatal(err)
		}
		hist[l][0], hist[l][1] = append(hist[l][0], k...), append(hist[l][1], v...)
		if victim >= 0 {
			pid := nodes[victim].p.cmd.Process.Pid
			kill := func() { _ = syscall.Kill(pid, syscall.SIGKILL) }
			tm := time.AfterFunc(delay, kill)
			defer func() {
				if tm.Stop() {
					kill()
				}
			}()
		}
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		defer acancel()
		began := time.Now()
		if err := c.Append(actx, seq, l, k, v); err != nil {
			return err
		}
		took = append(took, time.Since(began))
		acked[l] += n
		return nil
	}
	for l := range L {
		if err := appendChunk(l, 20, -1, 0); err != nil {
			t.Fatal(err)
		}
	}
	usual := func() time.Duration {
		d := slices.Clone(took)
		slices.Sort(d)
		return max(d[len(d)/2], time.Millisecond)
	}
	inside := 0
	for round := range kills {
		for range 2 {
			if err := appendChunk(rng.IntN(L), 8+rng.IntN(33), -1, 0); err != nil {
				t.Fatalf("round %d: an append with every node up failed: %v", round, err)
			}
		}
		victim, layer := round%3, rng.IntN(L)
		delay := time.Duration(rng.Int64N(int64(usual()) + 1))
		err := appendChunk(layer, 8+rng.IntN(33), victim, delay)
		v := nodes[victim]
		select {
		case <-v.p.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: %s still runs 10 s after its SIGKILL", round, v.name)
		}
		if err != nil {
			inside++
		}
		t.Logf("round %d: %s killed %v into an append to layer %d (usually %v): %v", round, v.name, delay, layer, usual(), err)
		start(victim)
		if victim == 0 {
			dial()
		}
		waitMembers()

		var r client.Recovered
		found := false
		for deadline := time.Now().Add(30 * time.Second); !found; time.Sleep(100 * time.Millisecond) {
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			recs, dmg, err := c.Recovered(rctx)
			rcancel()
			// A coordinator that stayed up adopts it under a new id, a
			// restarted one under its id.
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
				t.Fatalf("round %d: %s not recovered 30 s after the restart (%v)", round, seq, err)
			}
		}
		t.Logf("round %d: recovered %+v (acknowledged %v, sent %d)", round, r, acked, len(hist[layer][0])/kv)
		if len(r.Lens) != L || len(r.Lost) != L {
			t.Fatalf("round %d: %d lengths, %d losses for %d layers", round, len(r.Lens), len(r.Lost), L)
		}
		if r.ID != seq {
			_ = c.Release(ctx, seq) // the lost grid's name of it
			seq = r.ID
		}
		for l := range L {
			sent := len(hist[l][0]) / kv
			rb := 0
			if r.RolledBack != nil {
				rb = r.RolledBack[l]
			}
			held := r.Lens[l] + r.Lost[l] - rb
			if r.Lens[l] > sent || held < acked[l] || held > sent {
				t.Fatalf("round %d: layer %d recovered %d, lost %d, rolled back %d: %d acknowledged, %d sent", round, l, r.Lens[l], r.Lost[l], rb, acked[l], sent)
			}
			if n := r.Lens[l]; n < sent {
				if err := c.Append(ctx, seq, l, hist[l][0][n*kv:], hist[l][1][n*kv:]); err != nil {
					t.Fatalf("round %d: append layer %d again from %d: %v", round, l, n, err)
				}
			}
			acked[l] = sent
		}
		// Two steps, bit for bit the reference's.
		for range 2 {
			for l := range L {
				q, k, v := vec(qd), vec(kv), vec(kv)
				got, err := c.Step(ctx, l, []client.Item{{Seq: seq, Q: q, K: k, V: v}}, client.StepOptions{})
				if err != nil {
					t.Fatalf("round %d: step layer %d: %v", round, l, err)
				}
				var want engine.Result
				if err := ref.Step(ctx, l, []engine.Request{{Seq: rid, Q: q, K: k, V: v}}, engine.StepOptions{}, &want); err != nil {
					t.Fatal(err)
				}
				if !equalBits(got.O, want.O) {
					t.Fatalf("round %d: step layer %d after the recovery differs from the reference's", round, l)
				}
				hist[l][0], hist[l][1] = append(hist[l][0], k...), append(hist[l][1], v...)
				acked[l]++
			}
		}
	}
	t.Logf("%d kills, %d inside an append", kills, inside)
	if inside == 0 {
		t.Errorf("no kill landed inside an append")
	}
}
