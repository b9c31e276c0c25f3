package main

import (
	"reflect"
	"testing"
)

// TestCPUShares: n nodes get disjoint shares of len/n CPUs each, in
// order; no shares for one node or for more nodes than CPUs.
func TestCPUShares(t *testing.T) {
	for _, tc := range []struct {
		allowed []int
		n       int
		want    [][]int
	}{
		{[]int{0, 1}, 2, [][]int{{0}, {1}}},
		{[]int{0, 1, 2, 3, 4}, 2, [][]int{{0, 1}, {2, 3}}},
		{[]int{3, 5, 7, 9}, 2, [][]int{{3, 5}, {7, 9}}},
		{[]int{0, 1, 2}, 3, [][]int{{0}, {1}, {2}}},
		{[]int{0}, 2, nil},
		{[]int{0, 1}, 3, nil},
		{[]int{0, 1}, 1, nil},
		{nil, 2, nil},
	} {
		got := cpuShares(tc.allowed, tc.n)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("cpuShares(%v, %d) = %v, want %v", tc.allowed, tc.n, got, tc.want)
		}
		if got != nil {
			// A later append to one share must not reach the next.
			got[0] = append(got[0], -1)
			if len(got) > 1 && got[1][0] == -1 {
				t.Errorf("cpuShares(%v, %d): shares overlap in memory", tc.allowed, tc.n)
			}
		}
	}
}
