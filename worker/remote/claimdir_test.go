package remote

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/plan"
)

// TestClaimWaitsForClosingGrid: a CP = 2 grid over two persisting nodes
// a and b; b stops (its part persisted) and restarts on its directory.
// The coordinator closes the lost grid on a, and a's worker takes its
// time to close (held here, at the moment a gives the directory back);
// meanwhile the coordinator opens the grid that replaces it. a's
// ConnectGrid must wait for the lost grid's directory and recover the
// sequence from it, where it used to take the next directory (".1"),
// fresh, and report nothing: the sequence, recovered on b alone, was
// then freed as incomplete.
func TestClaimWaitsForClosingGrid(t *testing.T) {
	ec := engineConfig(2, 1, plan.Exact)
	wc := workerConfig(ec)
	dirs := []string{t.TempDir(), t.TempDir()}
	nodes := persistNodes(t, dirs, nil)
	a := nodes[0]
	var held atomic.Bool
	entered, proceed := make(chan string, 1), make(chan struct{})
	a.srv.testHookRelease = func(dir string) {
		if held.CompareAndSwap(false, true) { // the lost grid's release only
			entered <- dir
			<-proceed
		}
	}
	waiting := make(chan struct{}, 8)
	a.srv.testHookClaimWait = func(string) { waiting <- struct{}{} }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	clients, eng := openCP2(t, ec, wc, nodes, "coord-a/1/1")
	seq, err := eng.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(27, 4))
	const n = 9 // pages of 4: two sealed, one token in the tail
	kv := ec.KVHeads * ec.HeadDim
	for l := range ec.Layers {
		if err := eng.Append(seq, l, randVec(rng, n*kv), randVec(rng, n*kv)); err != nil {
			t.Fatal(err)
		}
	}
	nodes[1].conn.Close()
	nodes[1].stop() // b's part persisted as its grid closes
	b := persistNodes(t, dirs[1:], nil)[0]
	eng.Close()

	closed := make(chan error, 1)
	go func() { closed <- CloseGrid(ctx, clients[0]) }()
	var dir string
	select {
	case dir = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the lost grid's close on a never reached its directory's release")
	}
	type opening struct {
		clients []*Client
		err     error
	}
	opened := make(chan opening, 1)
	go func() {
		nr := spread(ec, conns([]*node{a, b}), 0)
		nr[0].Name, nr[1].Name = "na", "nb"
		cl, err := OpenGrid(ctx, nr, GridRef{Grid: "coord-a/1/2", View: 2}, wc)
		opened <- opening{cl, err}
	}()
	select {
	case <-waiting:
	case o := <-opened: // took another directory without waiting
		opened <- o
	case <-time.After(5 * time.Second):
	}
	close(proceed)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	o := <-opened
	if o.err != nil {
		t.Fatal(o.err)
	}
	defer CloseGrid(context.Background(), o.clients...)
	for i, c := range o.clients {
		rec := c.Recovered()
		if len(rec) != 1 || rec[0].Seq != uint64(seq) || rec[0].Grid != "coord-a/1/1" {
			t.Errorf("node %d of the new grid recovered %+v, want sequence %d of grid coord-a/1/1", i, rec, seq)
		}
	}
	got, err := filepath.Glob(filepath.Join(filepath.Dir(dir), "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != dir {
		t.Errorf("node a holds grid directories %v, want only %s (the lost grid's)", got, dir)
	}
}
