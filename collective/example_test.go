package collective_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/questrt/questrt/collective"
)

// Two CP ranks propose candidates for one row with budget 3 and derive the
// same global top-3; then they merge their partial states at rank 0.
func ExampleGroup_SelectExact() {
	members := collective.NewInprocGroup(2)
	defer func() {
		for _, m := range members {
			m.Close()
		}
	}()
	local := [][][]collective.Candidate{
		{{{Score: 0.9, Page: 0}, {Score: 0.5, Page: 2}, {Score: 0.1, Page: 4}}}, // rank 0: even pages
		{{{Score: 0.7, Page: 1}, {Score: 0.5, Page: 3}}},                        // rank 1: odd pages
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tag := collective.MakeTag(1, 0, collective.OpSelect)
	out := make([][][]int32, 2)
	var wg sync.WaitGroup
	for r, m := range members {
		wg.Go(func() {
			g := collective.NewGroup(m)
			sel, err := g.SelectExact(ctx, tag, local[r], []int{3}, nil)
			if err != nil {
				panic(err)
			}
			out[r] = sel
		})
	}
	wg.Wait()
	fmt.Println("rank 0:", out[0][0])
	fmt.Println("rank 1:", out[1][0])
	// Output:
	// rank 0: [0 1 2]
	// rank 1: [0 1 2]
}

func ExampleGroup_Reduce() {
	members := collective.NewInprocGroup(2)
	defer func() {
		for _, m := range members {
			m.Close()
		}
	}()
	// One head, D = 2. Rank 1 selected no pages: its state is empty.
	o := [][]float32{{1, 2}, {0, 0}}
	lse := [][]float32{{0.5}, {float32(negInf)}}
	ctx := context.Background()
	var wg sync.WaitGroup
	for r, m := range members {
		wg.Go(func() {
			g := collective.NewGroup(m)
			if err := g.Reduce(ctx, collective.MakeTag(1, 0, collective.OpReduce), 0, 2, o[r], lse[r]); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(o[0], lse[0])
	// Output:
	// [1 2] [0.5]
}
