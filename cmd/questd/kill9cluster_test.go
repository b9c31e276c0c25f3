package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/engine"
)

// kill9SoakEnv, set to a number of kills (at most 200), runs
// TestQuestdKill9InStep and TestQuestdKill9InAppend with that many
// kills and a fresh seed (see TestQuestdKill9InStep for what the soak
// found); kill9SeedEnv repeats a seed.
const (
	kill9SoakEnv = "QUESTRT_KILL9_SOAK"
	kill9SeedEnv = "QUESTRT_KILL9_SEED"
)

// kill9Settings returns the kills and seed of a kill -9 test: kills and
// seed, or the soak's from kill9SoakEnv and kill9SeedEnv.
func kill9Settings(t *testing.T, kills int, seed uint64) (int, uint64) {
	t.Helper()
	if s := os.Getenv(kill9SoakEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 200 {
			t.Fatalf("%s=%q: want a number of kills, 1..200", kill9SoakEnv, s)
		}
		kills, seed = n, uint64(time.Now().UnixNano())
	}
	if s := os.Getenv(kill9SeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", kill9SeedEnv, s, err)
		}
		seed = n
	}
	t.Logf("%d kills, seed %d (%s=%d repeats it)", kills, seed, kill9SeedEnv, seed)
	return kills, seed
}

// kill9Node is one questd of a kill -9 test: its arguments and current
// process.
type kill9Node struct {
	name string
	args []string
	p    *questdProc
}

// kill9Cluster is the cluster of the kill -9 tests: three questd
// processes n0..n2 on loopback with smallNode's model, CP 3, --data-dir
// each, fast failure detection, and an in-process engine of the same
// config (the reference, closed with the test).
type kill9Cluster struct {
	nodes []*kill9Node
	ref   *engine.Engine
	ec    engine.Config
}

// startKill9Cluster starts the three nodes, each with extra arguments
// added, and the reference.
func startKill9Cluster(t *testing.T, extra ...string) *kill9Cluster {
	t.Helper()
	k := &kill9Cluster{nodes: make([]*kill9Node, 3)}
	for i := range k.nodes {
		a := slices.Clone(smallNode)
		a[slices.Index(a, "m0")] = fmt.Sprintf("n%d", i)
		a = append(a, "--cp", "3", "--data-dir", t.TempDir(), "--log-format", "json", "--dead-node-reclaim", "100ms")
		k.nodes[i] = &kill9Node{name: fmt.Sprintf("n%d", i), args: append(a, extra...)}
	}
	for i := range k.nodes {
		k.start(t, i)
	}
	cfg, err := load(t, nil, k.nodes[0].args...)
	if err != nil {
		t.Fatal(err)
	}
	k.ec = cfg.engineConfig()
	if k.ref, err = engine.New(k.ec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.ref.Close() })
	return k
}

// start starts node i (again), joining another node that runs.
func (k *kill9Cluster) start(t *testing.T, i int) {
	t.Helper()
	args := k.nodes[i].args
	for j, o := range k.nodes {
		if j != i && o.p != nil && o.p.ready != nil {
			args = append(slices.Clone(args), "--join", o.p.ready["gossip"])
			break
		}
	}
	k.nodes[i].p = startQuestd(t, args...)
}

// dial closes old (when set) and dials n0, the coordinator.
func (k *kill9Cluster) dial(ctx context.Context, t *testing.T, old *client.Client) *client.Client {
	t.Helper()
	if old != nil {
		old.Close()
	}
	c, err := client.Dial(ctx, k.nodes[0].p.ready["grpc"], client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitMembers waits (20 s at most) until n0, through c, lists the three
// nodes alive.
func (k *kill9Cluster) waitMembers(ctx context.Context, t *testing.T, c *client.Client) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		st, err := c.Status(ctx)
		up := 0
		if err == nil {
			for _, m := range st.GetMembers() {
				if m.GetState() == "alive" {
					up++
				}
			}
		}
		if up == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("n0 lists %d members alive after 20 s (%v)", up, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
