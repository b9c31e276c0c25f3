package pagestore_test

import (
	"errors"
	"fmt"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// Example walks one sequence through prefill, a decode step read as a
// kernel would (page table once, then per layer), a fork and a rollback.
func Example() {
	s, err := pagestore.New(pagestore.Config{Layers: 2, Geometry: plan.Geometry{KVHeads: 1, HeadDim: 2, PageSize: 3}, Capacity: 4})
	if err != nil {
		panic(err)
	}
	id := s.Create()
	// Prefill 4 tokens of [KVHeads=1][HeadDim=2] in both layers.
	k := []float32{3, 1, 1, -2, -1, 0, 1, 2}
	v := make([]float32, len(k))
	for l := range 2 {
		if err := s.Append(id, l, k, v); err != nil {
			panic(err)
		}
	}
	// Decode step: the plan (page table) is built once, reused per layer.
	pt, _ := s.AppendPageTable(make([]int32, 0, 8), id)
	view, _ := s.View(id, 0)
	mn, mx := s.PageSummary(0, int(pt[0]), 0)
	fmt.Printf("pages %v view %+v page 0 min %v max %v\n", pt, view, mn, mx)

	child, _ := s.Fork(id)
	_ = s.Rollback(child, 2) // reopens shared page 0: copied, then rescanned
	cpt, _ := s.AppendPageTable(nil, child)
	fmt.Println("child pages", cpt)

	big := make([]float32, 2*9)
	err = s.Append(id, 0, big, big)
	fmt.Println(errors.Is(err, pagestore.ErrPoolExhausted))
	// Output:
	// pages [0 1] view {Len:4 Pages:2 LastPageLen:1} page 0 min [-1 -2] max [3 1]
	// child pages [2]
	// true
}
