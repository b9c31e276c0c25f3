package main

import (
	"os"
	"reflect"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// threadCPUs returns the CPUs of every thread of process pid, by thread.
func threadCPUs(t *testing.T, pid int) map[int][]int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][]int{}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			continue // the thread exited
		}
		var cpus []int
		for c := 0; c < len(set)*64; c++ {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
		out[tid] = cpus
	}
	return out
}

// TestUpNodeCPUs: by default each of 2 nodes runs, every thread of it,
// on its own half of the CPUs up may use; --node-cpus off, or a
// --node-procs other than auto, leaves them on all of those CPUs.
func TestUpNodeCPUs(t *testing.T) {
	all := allowedCPUs()
	if len(all) < 2 {
		t.Skipf("%d CPUs: nothing to share between 2 nodes", len(all))
	}
	shares := cpuShares(all, 2)
	for _, tc := range []struct {
		name  string
		flags []string
		want  [][]int
	}{
		{"default", nil, shares},
		{"auto", []string{"--node-cpus", "auto"}, shares},
		{"off", []string{"--node-cpus", "off"}, [][]int{all, all}},
		{"procs 1", []string{"--node-procs", "1"}, [][]int{all, all}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, questd := fakeCluster(t)
			u := startUp(t, append([]string{"--nodes", "2", "--questd", questd, "--insecure"}, tc.flags...)...)
			nodes := parseUpLines(t, u.waitUp(t))
			if len(nodes) != 2 {
				t.Fatalf("%d nodes up, want 2", len(nodes))
			}
			for i, n := range nodes {
				threads := threadCPUs(t, n.pid)
				if len(threads) == 0 {
					t.Errorf("%s: no threads", n.name)
				}
				for tid, cpus := range threads {
					if !reflect.DeepEqual(cpus, tc.want[i]) {
						t.Errorf("%s thread %d: CPUs %v, want %v", n.name, tid, cpus, tc.want[i])
					}
				}
			}
			u.cancel()
			if code := u.wait(t); code != 0 {
				t.Errorf("exit %d", code)
			}
		})
	}
}
