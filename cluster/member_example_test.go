package cluster_test

import (
	"context"
	"fmt"
	"time"

	"github.com/questrt/questrt/cluster"
)

// Two nodes on loopback: the second joins the first, both see each other
// with their metadata, and the second leaves gracefully.
func ExampleNewMembership() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	cfg := cluster.DefaultMemberConfig()
	cfg.Name = "node-a"
	cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0 // any free port
	cfg.Meta = cluster.NodeMeta{GRPCAddr: "127.0.0.1:7070", Version: "dev", Backend: "cpu", Devices: 1}
	a, err := cluster.NewMembership(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Shutdown()

	cfg.Name = "node-b"
	cfg.Meta.GRPCAddr = "127.0.0.1:7071"
	cfg.Join = []string{a.Addr().String()}
	b, err := cluster.NewMembership(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Shutdown()

	view, sub := a.Subscribe(16)
	defer sub.Close()
	for len(view.Up()) < 2 {
		<-sub.Events()
		view = a.View()
	}
	for _, m := range view.Members {
		fmt.Println(m.Name, m.State, m.Meta.GRPCAddr)
	}

	if err := b.Leave(ctx); err != nil {
		fmt.Println(err)
	}
	for ev := range sub.Events() {
		if ev.Type == cluster.EventLeft {
			fmt.Println(ev.Member.Name, ev.Type)
			break
		}
	}
	// Output:
	// node-a alive 127.0.0.1:7070
	// node-b alive 127.0.0.1:7071
	// node-b left
}
