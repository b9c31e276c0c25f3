package grpctransport_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/grpctransport"
)

// Two members on loopback run an all-gather of the collective package over
// gRPC streams.
func ExampleNewLocalGroup() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	base := grpctransport.DefaultConfig()
	base.Plaintext = true // loopback only
	members, err := grpctransport.NewLocalGroup(ctx, 2, base)
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		for _, m := range members {
			m.Close()
		}
	}()
	out := make(chan [][]byte, 1)
	go func() {
		got, err := collective.NewGroup(members[1]).AllGather(ctx, 1, []byte("from rank 1"))
		if err != nil {
			log.Fatal(err)
		}
		out <- got
	}()
	got, err := collective.NewGroup(members[0]).AllGather(ctx, 1, []byte("from rank 0"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("rank 0: %q\n", got)
	fmt.Printf("rank 1: %q\n", <-out)
	// Output:
	// rank 0: ["from rank 0" "from rank 1"]
	// rank 1: ["from rank 0" "from rank 1"]
}

// A member of a group spread over hosts: every member gets the same Group
// and Peers, its own Rank, and TLS (or Plaintext, when asked for). New
// returns once every peer is connected. (Not run: it needs the peers.)
func ExampleNew() {
	cfg := grpctransport.DefaultConfig()
	cfg.Group = "seq-42/view-7/tp-0" // one incarnation of one group
	cfg.Rank = 1
	cfg.Peers = []string{"node-a:7070", "node-b:7070", "node-c:7070"}
	cfg.ListenAddr = ":7070"
	cfg.Plaintext = true // or cfg.TLS = a *tls.Config for mutual TLS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := grpctransport.New(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	g := collective.NewGroup(tr)
	fmt.Println(g.Rank(), g.Size())
}
