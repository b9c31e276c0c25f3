package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/worker"
)

// The interaction commands of restarted workers and adoption (see
// TestInteraction).

// digest is a layer's outputs recorded under a label.
type digest struct{ o, lse []float32 }

// compare compares a layer's outputs with those recorded under label,
// or records them there.
func (env *interaction) compare(label string, o, lse []float32) string {
	have, ok := env.digests[label]
	if !ok {
		env.digests[label] = digest{slices.Clone(o), slices.Clone(lse)}
		return fmt.Sprintf("recorded as %s\n", label)
	}
	if bitsEqual(o, have.o) && bitsEqual(lse, have.lse) {
		return fmt.Sprintf("o and lse bit-identical to %s\n", label)
	}
	d := 0.0
	if len(o) == len(have.o) {
		for i := range o {
			d = max(d, math.Abs(float64(o[i]-have.o[i])))
		}
	}
	return fmt.Sprintf("o and lse DIFFER from %s (max |o - o'| = %.3g)\n", label, d)
}

func (env *interaction) runRestart(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "restart":
		var ws []int
		a, ok := d.Arg("w")
		if !ok {
			t.Fatal("restart: missing w=")
		}
		for _, s := range a.Vals {
			if s == "all" {
				ws = ws[:0]
				for w := range env.wrs {
					ws = append(ws, w)
				}
				break
			}
			w, err := strconv.Atoi(s)
			if err != nil || w < 0 || w >= len(env.wrs) {
				t.Fatalf("restart: bad worker %q", s)
			}
			ws = append(ws, w)
		}
		crash := map[int]bool{}
		if c, ok := d.Arg("crash"); ok {
			for _, w := range ws {
				crash[w] = len(c.Vals) == 0
			}
			for _, s := range c.Vals {
				w, err := strconv.Atoi(s)
				if err != nil || !slices.Contains(ws, w) {
					t.Fatalf("restart: crash=%q is not a restarted worker", s)
				}
				crash[w] = true
			}
		}
		return env.restart(t, ws, crash, d.HasArg("engine"))
	case "adopt":
		var name string
		d.ScanArgs(t, "name", &name)
		return env.adopt(name)
	case "seqs":
		return env.seqTable()
	case "parked":
		return env.parked()
	case "pending":
		var b strings.Builder
		for w, sp := range env.specs {
			p, ok := sp.Transport.(interface{ Pending() int })
			if !ok {
				t.Fatalf("transport %T does not count pending messages", sp.Transport)
			}
			fmt.Fprintf(&b, "w%d: %d pending\n", w, p.Pending())
		}
		return b.String()
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return ""
}

// restart closes workers ws (gracefully, or those in crash from a copy
// of their data directories taken first) and opens each again on its
// data directory and rank, behind the same recorder wrapper (the
// engine's host). Alone, a worker keeps its transport (its peers' stay
// connected to it). With engine the whole grid reopens, as a cluster
// reopens a grid: the engine closes, every worker closes, every worker
// reopens on new transports, and a new engine opens over them. It
// prints what every restarted worker recovered.
func (env *interaction) restart(t *testing.T, ws []int, crash map[int]bool, engine bool) string {
	var b strings.Builder
	if engine {
		if len(ws) != len(env.wrs) {
			t.Fatal("restart ... engine: the whole grid restarts (w=all)")
		}
		if env.step != nil {
			return "error: a step is open: end it first\n"
		}
		env.e.Close()
		env.e = nil
		b.WriteString("engine closed\n")
	}
	how := make([]string, len(env.wrs))
	for _, w := range ws {
		wc := env.wcfgs[w]
		if wc.DataDir == "" {
			t.Fatalf("restart: worker %d does not persist (engine ... persist)", w)
		}
		how[w] = "closed"
		if crash[w] {
			dir := env.t.TempDir()
			copyTree(t, wc.DataDir, dir)
			env.wcfgs[w].DataDir, how[w] = dir, "crashed"
		}
		env.locs[w].Close()
	}
	if engine {
		for _, tr := range env.trs {
			tr.Close()
		}
		env.trs = env.trs[:0]
		for range env.cfg.TP {
			env.trs = append(env.trs, collective.NewInprocGroup(env.cfg.CP)...)
		}
		for w := range env.specs {
			env.specs[w].Transport = env.trs[w]
		}
		b.WriteString("new transports\n")
	}
	for _, w := range ws {
		l, err := worker.NewLocal(env.wcfgs[w], []worker.RankSpec{env.specs[w]})
		if err != nil {
			fmt.Fprintf(&b, "w%d %s; reopen: error: %v\n", w, how[w], err)
			continue
		}
		env.locs[w], env.wrs[w].Worker = l, l
		rep := l.Recovery()
		fmt.Fprintf(&b, "w%d %s and reopened: %d recovered, %d damaged, %d orphan store sequences\n",
			w, how[w], len(rep.Sequences), len(rep.Damaged), rep.OrphanSeqs)
		for _, s := range rep.Sequences {
			fmt.Fprintf(&b, "w%d   recovered key=%d seq=%d grid=%s lens=%v had=%d lost=%d", w, s.Key, s.Seq, s.Grid, s.Lens, s.Had, s.LostTokens())
			if slices.Min(s.HadLens) != slices.Max(s.HadLens) {
				fmt.Fprintf(&b, " had-per-layer=%v", s.HadLens)
			}
			if s.RolledBack != nil {
				fmt.Fprintf(&b, " step-rolled-back=%v", s.RolledBack)
			}
			b.WriteString("\n")
		}
		for _, s := range rep.Damaged {
			fmt.Fprintf(&b, "w%d   damaged key=%d seq=%d: %v\n", w, s.Key, s.Seq, s.Err)
		}
	}
	if engine {
		e, err := Open(env.cfg, env.hosts)
		if err != nil {
			fmt.Fprintf(&b, "open engine: error: %v\n", err)
			return b.String()
		}
		env.e = e
		b.WriteString("engine opened over the workers\n")
	}
	b.WriteString(env.rec.flush())
	return b.String()
}

// adopt has the engine adopt the sequence the workers recovered under
// name's id (each worker's part: its recovered entry of that id, parked
// or not any more) and prints the parts, the workers' messages, the
// outcome, the parked keys and the sequence table.
func (env *interaction) adopt(name string) string {
	id, ok := env.names[name]
	if !ok {
		return fmt.Sprintf("error: no sequence %s\n", name)
	}
	r := Recovered{Seq: id, Parts: make([]RecoveredPart, len(env.locs))}
	var b strings.Builder
	found := false
	for w, l := range env.locs {
		r.Parts[w].Missing = true
		for _, s := range l.Recovery().Sequences {
			if SeqID(s.Seq) != id {
				continue
			}
			r.Layout, found = s.Layout, true
			r.Parts[w] = RecoveredPart{Key: s.Key, Recovered: decode.Recovered{Lens: s.Lens, Had: s.Had, HadLens: s.HadLens, RolledBack: s.RolledBack}}
		}
		p := r.Parts[w]
		switch {
		case p.Missing:
			fmt.Fprintf(&b, "part w%d: missing\n", w)
		case !slices.Contains(l.Parked(), p.Key):
			fmt.Fprintf(&b, "part w%d: key=%d lens=%v had=%d (not parked any more)\n", w, p.Key, p.Lens, p.Had)
		default:
			fmt.Fprintf(&b, "part w%d: key=%d lens=%v had=%d\n", w, p.Key, p.Lens, p.Had)
		}
	}
	if !found {
		return b.String() + fmt.Sprintf("error: no worker recovered %s (seq %d)\n", name, id)
	}
	a, err := env.e.Adopt(context.Background(), r)
	b.WriteString(env.rec.flush())
	if err != nil {
		fmt.Fprintf(&b, "error: %v\n", err)
	} else {
		fmt.Fprintf(&b, "adopted %s = seq %d: lens=%v had=%d lost=%d", name, id, a.Lens, a.Had, a.LostTokens())
		if slices.Min(a.Lost()) != slices.Max(a.Lost()) {
			fmt.Fprintf(&b, " lost-per-layer=%v", a.Lost())
		}
		if a.RolledBack != nil {
			fmt.Fprintf(&b, " rolled-back=%v", a.RolledBack)
		}
		b.WriteString("\n")
	}
	return b.String() + env.parked() + env.seqTable()
}

// seqTable prints the engine's sequence table in id order (read with
// no call in flight: commands run one at a time).
func (env *interaction) seqTable() string {
	ids := make([]SeqID, 0, len(env.e.seqs))
	for id := range env.e.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		return "engine: no sequences\n"
	}
	var b strings.Builder
	for _, id := range ids {
		sq := env.e.seqs[id]
		fmt.Fprintf(&b, "engine: seq %d lens=%v", id, sq.lens)
		if sq.broken {
			b.WriteString(" broken")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// parked prints every worker's parked keys.
func (env *interaction) parked() string {
	var parts []string
	for w, l := range env.locs {
		parts = append(parts, fmt.Sprintf("w%d=%v", w, l.Parked()))
	}
	return "parked: " + strings.Join(parts, " ") + "\n"
}
