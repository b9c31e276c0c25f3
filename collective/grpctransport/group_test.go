package grpctransport

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/questrt/questrt/collective"
)

// The collective package's group operations give the same results, bit
// for bit, over gRPC streams as in one process.

// runGroups runs f on every member's Group concurrently and returns the
// results by rank.
func runGroups[T any](gs []*collective.Group, f func(r int, g *collective.Group) (T, error)) ([]T, []error) {
	out := make([]T, len(gs))
	errs := make([]error, len(gs))
	var wg sync.WaitGroup
	for r, g := range gs {
		wg.Go(func() { out[r], errs[r] = f(r, g) })
	}
	wg.Wait()
	return out, errs
}

// bothGroups returns the Groups of an in-process group and of a gRPC
// group of n members.
func bothGroups(t *testing.T, n int) (inproc, grpc []*collective.Group) {
	for _, tr := range collective.NewInprocGroup(n) {
		t.Cleanup(func() { tr.Close() })
		inproc = append(inproc, collective.NewGroup(tr))
	}
	for _, tr := range newGroup(t, n, nil) {
		grpc = append(grpc, collective.NewGroup(tr))
	}
	return inproc, grpc
}

// same runs op on both groups and requires equal results without errors.
func same[T any](t *testing.T, what string, inproc, grpc []*collective.Group, op func(r int, g *collective.Group) (T, error), eq func(a, b T) bool) {
	t.Helper()
	want, errs := runGroups(inproc, op)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s in process, rank %d: %v", what, r, err)
		}
	}
	got, errs := runGroups(grpc, op)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s over gRPC, rank %d: %v", what, r, err)
		}
	}
	for r := range want {
		if !eq(got[r], want[r]) {
			t.Errorf("%s rank %d: gRPC %v, in process %v", what, r, got[r], want[r])
		}
	}
}

// randomCandidates draws every rank's local candidates of rows rows
// (unique pages, at most k[row] per rank, frequent ties).
func randomCandidates(rng *rand.Rand, n, rows int) (k []int, local [][][]collective.Candidate) {
	k = make([]int, rows)
	local = make([][][]collective.Candidate, n)
	for r := range n {
		local[r] = make([][]collective.Candidate, rows)
	}
	for row := range rows {
		k[row] = rng.IntN(24)
		for r := range n {
			for p := r; p < 300 && len(local[r][row]) < k[row]; p += n {
				if rng.IntN(3) == 0 {
					local[r][row] = append(local[r][row], collective.Candidate{Score: float32(rng.IntN(8)) / 4, Page: int32(p)})
				}
			}
		}
	}
	return k, local
}

// randomState draws a partial state of heads heads of d (some empty).
func randomState(rng *rand.Rand, heads, d int) (o, lse []float32) {
	o, lse = make([]float32, heads*d), make([]float32, heads)
	for h := range heads {
		if rng.IntN(5) == 0 {
			lse[h] = float32(math.Inf(-1))
			continue
		}
		lse[h] = float32(rng.NormFloat64() * 4)
		for j := range d {
			o[h*d+j] = float32(rng.NormFloat64())
		}
	}
	return o, lse
}

func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func TestGroupOpsMatchInproc(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			inproc, grpc := bothGroups(t, n)
			rng := rand.New(rand.NewPCG(uint64(n), 11))
			for step := range uint64(20) {
				k, local := randomCandidates(rng, n, 1+rng.IntN(8))
				same(t, fmt.Sprintf("step %d select", step), inproc, grpc, func(r int, g *collective.Group) ([][]int32, error) {
					return g.SelectExact(ctxT(t), collective.MakeTag(step, 0, collective.OpSelect), local[r], k, nil)
				}, func(a, b [][]int32) bool { return slices.EqualFunc(a, b, slices.Equal) })

				const heads, d = 8, 64
				o := make([][]float32, n)
				lse := make([][]float32, n)
				for r := range n {
					o[r], lse[r] = randomState(rng, heads, d)
				}
				root := rng.IntN(n)
				type state struct{ o, lse []float32 }
				eqState := func(a, b state) bool { return bitsEqual(a.o, b.o) && bitsEqual(a.lse, b.lse) }
				same(t, fmt.Sprintf("step %d reduce", step), inproc, grpc, func(r int, g *collective.Group) (state, error) {
					s := state{slices.Clone(o[r]), slices.Clone(lse[r])}
					err := g.Reduce(ctxT(t), collective.MakeTag(step, 0, collective.OpReduce), root, d, s.o, s.lse)
					return s, err
				}, eqState)
				same(t, fmt.Sprintf("step %d allreduce", step), inproc, grpc, func(r int, g *collective.Group) (state, error) {
					s := state{slices.Clone(o[r]), slices.Clone(lse[r])}
					err := g.AllReduce(ctxT(t), collective.MakeTag(step, 0, collective.OpAllReduce), d, s.o, s.lse)
					return s, err
				}, eqState)
				same(t, fmt.Sprintf("step %d allgather", step), inproc, grpc, func(r int, g *collective.Group) ([][]byte, error) {
					return g.AllGather(ctxT(t), collective.MakeTag(step, 0, collective.OpGather), fmt.Appendf(nil, "rank %d step %d", r, step))
				}, func(a, b [][]byte) bool {
					return slices.EqualFunc(a, b, func(x, y []byte) bool { return string(x) == string(y) })
				})
			}
		})
	}
}

// A member that closes mid-operation fails the others' operation promptly
// over gRPC too, naming it.
func TestGroupPeerClosed(t *testing.T) {
	trs := newGroup(t, 3, nil)
	gs := make([]*collective.Group, len(trs))
	for r, tr := range trs {
		gs[r] = collective.NewGroup(tr)
	}
	trs[2].Close()
	_, errs := runGroups(gs[:2], func(r int, g *collective.Group) ([][]byte, error) {
		return g.AllGather(ctxT(t), 1, []byte{byte(r)})
	})
	for r, err := range errs {
		if !errorsIsPeerClosedRank(err, 2) {
			t.Errorf("rank %d: %v, want ErrPeerClosed from rank 2", r, err)
		}
	}
}

func errorsIsPeerClosedRank(err error, rank int) bool {
	var re *collective.RankError
	return errors.Is(err, collective.ErrPeerClosed) && errors.As(err, &re) && re.Rank == rank
}
