package node_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// gossipRelay stands between a node's gossip address and the others: it
// listens on one port over UDP and TCP (the address the node advertises)
// and forwards what arrives to the node's real gossip port. Paused, it
// drops every UDP packet and closes every TCP connection, so the others'
// probes of the node go unanswered (memberlist suspects it) while the
// node itself and its gRPC server keep working: a busy node, as the
// others' failure detection sees it. Close stops its goroutines and waits
// for them.
type gossipRelay struct {
	udp    *net.UDPConn
	tcp    net.Listener
	target string
	paused atomic.Bool
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// freeGossipPort binds a port free over both UDP and TCP on 127.0.0.1
// and returns both listeners.
func freeGossipPort(t *testing.T) (*net.UDPConn, net.Listener) {
	t.Helper()
	for range 20 {
		u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", u.LocalAddr().(*net.UDPAddr).Port))
		if err == nil {
			return u, l
		}
		u.Close()
	}
	t.Fatal("no port free over both UDP and TCP")
	return nil, nil
}

// newGossipRelay starts a relay to 127.0.0.1:targetPort on a port of its
// own, closed when the test ends.
func newGossipRelay(t *testing.T, targetPort int) *gossipRelay {
	u, l := freeGossipPort(t)
	r := &gossipRelay{udp: u, tcp: l, target: fmt.Sprintf("127.0.0.1:%d", targetPort), conns: map[net.Conn]struct{}{}}
	to, err := net.ResolveUDPAddr("udp", r.target)
	if err != nil {
		t.Fatal(err)
	}
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, _, err := u.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if !r.paused.Load() {
				_, _ = u.WriteToUDP(buf[:n], to)
			}
		}
	}()
	go func() {
		defer r.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if r.paused.Load() {
				c.Close()
				continue
			}
			r.wg.Add(1)
			go r.pipe(c)
		}
	}()
	t.Cleanup(r.close)
	return r
}

func (r *gossipRelay) port() int { return r.udp.LocalAddr().(*net.UDPAddr).Port }

// pipe copies c to the target and back until either side closes.
func (r *gossipRelay) pipe(c net.Conn) {
	defer r.wg.Done()
	defer c.Close()
	d, err := net.DialTimeout("tcp", r.target, time.Second)
	if err != nil {
		return
	}
	defer d.Close()
	r.mu.Lock()
	if r.conns == nil {
		r.mu.Unlock()
		return
	}
	r.conns[c], r.conns[d] = struct{}{}, struct{}{}
	r.mu.Unlock()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(d, c)
		d.Close()
		close(done)
	}()
	_, _ = io.Copy(c, d)
	c.Close()
	<-done
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, d)
	r.mu.Unlock()
}

func (r *gossipRelay) close() {
	r.udp.Close()
	r.tcp.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}

// A node the others suspect but whose gRPC streams work is busy, not
// dead (issue 27 item 7): while its gossip is cut off long enough for
// every other node's probes of it to fail, and shorter than the
// suspicion timeout, the grid that uses it is not dropped and decode
// steps through it keep completing, before, during and after the
// suspicion. A coordinator that took a suspect node for a lost one
// would fail the steps with UNAVAILABLE (ErrGridLost).
func TestSuspectNodeKeepsGrid(t *testing.T) {
	ec := geometry(3, 1, plan.Exact)
	// The victim, node 2, binds a port of its own and advertises the
	// relay's, so that every probe of it goes through the relay.
	ul, tl := freeGossipPort(t)
	victimPort := ul.LocalAddr().(*net.UDPAddr).Port
	ul.Close()
	tl.Close()
	relay := newGossipRelay(t, victimPort)
	// Suspicion times out after SuspicionMult x ProbeInterval = 4 s in a
	// 3-node cluster; the gossip is cut for much less than that.
	nodes := nodetest.Start(t, "s", 3, ec, func(i int, c *node.Config) {
		c.Member.ProbeInterval, c.Member.ProbeTimeout, c.Member.SuspicionMult = 200*time.Millisecond, 100*time.Millisecond, 20
		if i == 2 {
			c.Member.BindPort, c.Member.AdvertiseAddr, c.Member.AdvertisePort = victimPort, "127.0.0.1", relay.port()
		}
	})
	victim := nodes[2]
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(27, 7))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	c := dial(t, nodes[0])
	id, on, err := c.Create(ctx, plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	if len(on) != 3 {
		t.Fatalf("sequence on %v, want all three nodes", on)
	}
	for l := range ec.Layers {
		if err := c.Append(ctx, id, l, randVec(rng, 40*kv), randVec(rng, 40*kv)); err != nil {
			t.Fatal(err)
		}
	}
	steps := 0
	step := func(when string) {
		t.Helper()
		for l := range ec.Layers {
			if _, err := c.Step(ctx, l, []client.Item{{Seq: id, Q: randVec(rng, qd), K: randVec(rng, kv), V: randVec(rng, kv)}}, client.StepOptions{}); err != nil {
				t.Fatalf("step %d (%s), layer %d: %v", steps, when, l, err)
			}
		}
		steps++
	}
	step("before")

	// Cut the victim's gossip until both other nodes suspect it, stepping
	// all along.
	suspected := func(nd *node.Node) bool {
		m, _ := nd.Membership().View().Member(victim.Name())
		return m.State == cluster.StateSuspect
	}
	seen := map[string]bool{}
	relay.paused.Store(true)
	cut := time.Now()
	for len(seen) < 2 {
		if time.Since(cut) > 2500*time.Millisecond {
			relay.paused.Store(false)
			t.Fatalf("after %v of cut gossip, suspected by %v only: no suspicion to test", time.Since(cut), seen)
		}
		for _, nd := range nodes[:2] {
			if suspected(nd) {
				seen[nd.Name()] = true
			}
		}
		step("gossip cut")
	}
	during := steps - 1
	for range 3 {
		step("victim suspect")
	}
	relay.paused.Store(false)
	t.Logf("suspected by both other nodes %v after the cut; %d steps completed while the gossip was cut", time.Since(cut), steps-1)

	// The victim refutes: alive again everywhere, never dead.
	deadline := time.Now().Add(5 * time.Second)
	for {
		alive := true
		for _, nd := range nodes {
			m, _ := nd.Membership().View().Member(victim.Name())
			if m.State == cluster.StateDead || m.State == cluster.StateLeft {
				t.Fatalf("%s declared %s %v: the suspicion outlived its timeout (a loaded machine?)", nd.Name(), victim.Name(), m.State)
			}
			alive = alive && m.State == cluster.StateAlive
		}
		if alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the victim is not alive again everywhere 5 s after its gossip came back")
		}
		step("refuting")
	}
	step("after")
	if during < 1 {
		t.Errorf("no step ran while the gossip was cut")
	}
}
