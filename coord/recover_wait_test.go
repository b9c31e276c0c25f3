package coord_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// TestRecoveredWaitsForAdoption: both nodes of a grid stop with 16
// persisted sequences and restart; a Create opens the grid (the first
// request after a restart) and, while its adoption is under way, the
// client calls Recovered: its first answer lists every sequence (it
// waits for the adoption instead of answering what was adopted so far).
func TestRecoveredWaitsForAdoption(t *testing.T) {
	ec := geometry(2, 1)
	dirs := []string{t.TempDir(), t.TempDir()}
	persist := func(i int, c *node.Config) { c.DataDir = dirs[i] }
	nodes := nodetest.Start(t, "n", 2, ec, persist)
	c := dial(t, nodes[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(3, 4))
	kv := ec.KVHeads * ec.HeadDim
	const N = 16
	want := map[string]bool{}
	for range N {
		a, _, err := c.Create(ctx, plan.Striped)
		if err != nil {
			t.Fatal(err)
		}
		for l := range ec.Layers {
			if err := c.Append(ctx, a, l, randVec(rng, 9*kv), randVec(rng, 9*kv)); err != nil {
				t.Fatal(err)
			}
		}
		want[a] = true
	}
	for _, nd := range nodes {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		nd.Stop(sctx)
		scancel()
	}
	nodes = nodetest.Start(t, "n", 2, ec, persist)
	c = dial(t, nodes[0])
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if _, _, err := c.Create(ctx, plan.Striped); err != nil {
			t.Errorf("create after the restart: %v", err)
		}
	})
	// The grid is registered before its adoption runs: call Recovered
	// then.
	for nodes[0].Coordinator().Grids() == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	recs, dmg, err := c.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range recs {
		got[r.ID] = true
	}
	for id := range want {
		if !got[id] {
			t.Errorf("first Recovered after the restart: %s missing (%d of %d listed, damaged %+v)", id, len(recs), N, dmg)
		}
	}
	if len(dmg) > 0 {
		t.Errorf("damaged %+v", dmg)
	}
}

// TestRecoveredBoundedWait: a grid whose peer accepts connections and
// never answers (its opening would wait for OpenTimeout, a minute):
// Recovered answers UNAVAILABLE saying to retry after RecoverWait, not
// at the caller's deadline; the opening it left goes on and Close ends
// it.
func TestRecoveredBoundedWait(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			cn, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, cn) // never read, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		lis.Close()
		<-accepted
		mu.Lock()
		for _, cn := range held {
			cn.Close()
		}
		mu.Unlock()
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	view := cluster.View{Version: 1}
	for _, n := range []string{"n0", "n1"} {
		view.Members = append(view.Members, cluster.Member{Name: n, State: cluster.StateAlive,
			Meta: cluster.NodeMeta{GRPCAddr: n + ":1", FreePages: 1 << 20, TotalPages: 1 << 20}})
	}
	const wait = 300 * time.Millisecond
	co, err := coord.New(coord.Config{Name: "n0", Engine: geometry(2, 1), View: func() cluster.View { return view },
		Conn: func(string) (grpc.ClientConnInterface, error) { return cc, nil }, OpenTimeout: time.Minute, RecoverWait: wait})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	srv, err := coord.NewServer(coord.ServerConfig{Coordinator: co})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // the second call waits for the same recovery
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		_, err = srv.Recovered(ctx, &decodev1.RecoveredRequest{})
		took := time.Since(start)
		cancel()
		st := status.Convert(err)
		t.Logf("call %d after %v: %v", i+1, took, err)
		if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "retry") {
			t.Fatalf("call %d: %v; want UNAVAILABLE saying to retry", i+1, err)
		}
		if took < wait || took > wait+2*time.Second {
			t.Errorf("call %d answered after %v; want about RecoverWait (%v)", i+1, took, wait)
		}
		if !errors.Is(mustRecover(co), coord.ErrRecovering) {
			t.Errorf("call %d: Coordinator.Recover does not say ErrRecovering", i+1)
		}
	}
	// A caller's deadline shorter than RecoverWait bounds the wait too,
	// and is answered as UNAVAILABLE before it passes.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	if _, err := srv.Recovered(ctx, &decodev1.RecoveredRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("caller deadline 150ms: %v; want UNAVAILABLE", err)
	}
	closed := make(chan struct{})
	go func() { co.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs on the recovery in progress")
	}
}

// mustRecover is Recover's error under a short bound.
func mustRecover(co *coord.Coordinator) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := co.Recover(ctx)
	return err
}
