package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/questrt/questrt/plan"
)

// TestCrashInStep kills (copies the data directories of) every worker
// of a persisting grid at each point inside its decode steps that
// Config.CrashPoint names, in turn, then recovers from the copies as a
// coordinator would (the smallest bound over the workers, the ranks
// that hold more rolled back) and checks against the acknowledged
// tokens (those of the steps whose EndStep had returned on every
// worker):
//   - nothing unacknowledged kept: the recovered length is at most the
//     acknowledged one, or one more when the crash came in an EndStep
//     after the worker storing the step's token had ended it (a commit
//     whose answer was lost); the same in every layer (atomic);
//   - nothing acknowledged lost unreported: Had is at least the
//     acknowledged length (the tail a crash loses is reported), and at
//     most one more (the interrupted step's token);
//   - what was kept is exactly the acknowledged prefix: summary records
//     bit for bit equal to a grid that never crashed, rolled back to
//     the recovered length;
//
// and that no sequence is freed or damaged. The steps cross a page
// boundary, so that a step's token reaches the disk (a sealed page)
// before its step ends.
func TestCrashInStep(t *testing.T) {
	for _, split := range []bool{false, true} {
		cfg := testConfig(Exact)
		// Count the crash points of the workload.
		total := runCrashWorkload(t, cfg, split, -1)
		if total < 10 {
			t.Fatalf("split %v: %d crash points, want a step's worth", split, total)
		}
		for c := 1; c <= total; c++ {
			t.Run(fmt.Sprintf("split%v/point%d", split, c), func(t *testing.T) {
				runCrashWorkload(t, cfg, split, c)
			})
		}
	}
}

// runCrashWorkload runs the workload on a persisting grid that crashes
// at the crash-th crash point (none when crash < 0) and checks the
// recovery; it returns the number of crash points it passed.
func runCrashWorkload(t *testing.T, cfg Config, split bool, crash int) int {
	ctx := context.Background()
	var mu sync.Mutex
	n, ack, crashedAt := 0, -1, ""
	var g *grid
	var dirs, crashed []string
	cfg.CrashPoint = func(point string) {
		mu.Lock()
		defer mu.Unlock()
		if !strings.HasPrefix(point, "step/") {
			return
		}
		n++
		if n == crash {
			for w := range dirs {
				copyDir(t, dirs[w], crashed[w])
			}
			ack, crashedAt = g.lens[1], point
		}
	}
	g = newGrid(t, cfg, split)
	live := newGrid(t, testConfig(Exact), split)
	for range g.workers {
		dirs, crashed = append(dirs, t.TempDir()), append(crashed, t.TempDir())
	}
	g.reopen(dirs)
	rg, rl := rand.New(rand.NewPCG(27, 1)), rand.New(rand.NewPCG(27, 1))
	const prompt, steps = 13, 5 // positions 13..17: page 0 completes at 15
	g.create(1, plan.Striped)
	live.create(1, plan.Striped)
	g.appendAll(rg, 1, prompt)
	live.appendAll(rl, 1, prompt)
	for range steps {
		g.stepAndCompare(rg, []uint64{1}, []int{64}, 0, cfg.Layers, true)
		mu.Lock()
		done := ack >= 0
		mu.Unlock()
		if !done {
			live.stepAndCompare(rl, []uint64{1}, []int{64}, 0, cfg.Layers, true)
		}
	}
	if crash < 0 {
		return n
	}
	if ack < 0 {
		t.Fatalf("crash point %d of %d not reached", crash, n)
	}
	if live.lens[1] != ack {
		t.Fatalf("the reference has %d tokens, %d acknowledged", live.lens[1], ack)
	}
	g.reopen(crashed)
	var bound []int // per layer, the smallest over the workers
	had, rolled := 0, 0
	for _, wk := range g.workers {
		rep := wk.(*Local).Recovery()
		if len(rep.Sequences) != 1 || len(rep.Damaged) != 0 {
			t.Fatalf("crash at %s: recovery %+v", crashedAt, rep)
		}
		r := rep.Sequences[0]
		b := MaxLens(r.Layout, cfg.PageSize, wk.(*Local).Ranks(), r.Lens)
		if bound == nil {
			bound = b
		}
		for l := range b {
			bound[l] = min(bound[l], b[l])
		}
		had = max(had, r.Had)
		for _, k := range r.RolledBack {
			rolled = max(rolled, k)
		}
	}
	lens := bound[0]
	for _, k := range bound {
		if k != lens {
			t.Fatalf("crash at %s: recovered lengths %v: the step was not atomic across layers", crashedAt, bound)
		}
	}
	// The step in flight is done once every layer of every rank that
	// stores its token took it: its last layer's answer (what a client
	// is told) needs every rank's last layer. A crash after its last
	// append may find it kept (a step whose answer was lost), in every
	// layer; a crash in an EndStep (every Layer call had returned: the
	// client may have its answer) must find it kept when it reached the
	// disk (it sealed page 0: the step at length 15), never rolled back.
	inflight := lens == ack+1
	if lens > ack && (!inflight || crashedAt == "step/marked") || had < ack || had > ack+1 {
		t.Fatalf("crash at %s: recovered %d tokens of %d, %d acknowledged", crashedAt, lens, had, ack)
	}
	if crashedAt == "step/end" && (ack+1)%cfg.PageSize == 0 && (!inflight || rolled > 0) {
		t.Fatalf("crash at %s: recovered %d tokens (rolled back %d) of %d: the step at length %d ran every layer on every rank, its token sealed a page: rolled back after its answer",
			crashedAt, lens, rolled, had, ack)
	}
	if rolled > 0 && (had != ack+1 || inflight) {
		t.Fatalf("crash at %s: %d tokens rolled back, but had %d of %d acknowledged, kept %d", crashedAt, rolled, had, ack, lens)
	}
	if inflight {
		live.stepAndCompare(rl, []uint64{1}, []int{64}, 0, cfg.Layers, true)
		ack++
	}
	for _, wk := range g.workers {
		l := wk.(*Local)
		r := l.Recovery().Sequences[0]
		g.must(l.Claim(ctx, r.Key, 1))
		if r.Len() > lens {
			for _, rk := range l.Ranks() {
				_, err := l.Rollback(ctx, RollbackRequest{Seq: 1, Rank: rk, Len: r.Len(), Drop: r.Len() - lens})
				g.must(err)
			}
		}
	}
	if ack > lens {
		live.rollback(1, ack-lens)
	}
	if a, b := fmt.Sprint(g.summaries(1)), fmt.Sprint(live.summaries(1)); a != b {
		t.Fatalf("crash at %s: the %d recovered tokens differ from the reference's", crashedAt, lens)
	}
	for _, w := range g.workers {
		g.must(w.Check(ctx, CheckRequest{Seq: 1, Layer: 0, Len: lens, Append: 1}))
	}
	return n
}
