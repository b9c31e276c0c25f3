package offload

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// Run runs every configuration of c (valid, and through Preflight) on
// be, the backend c.Backend names (the caller's: Run does not close
// it), writing a progress line to progress before each shard's run and
// calling emit with each result as soon as it is measured.
func Run(ctx context.Context, c Config, be kernels.Backend, progress io.Writer, emit func(Result) error) error {
	for _, n := range c.Contexts {
		for _, budget := range c.Budgets {
			for _, w := range c.Workloads {
				qs := queries(c.Seed, w, c.Warmup+c.Steps, c.QHeads*c.HeadDim)
				fmt.Fprintf(progress, "bench offload: context %d budget %d %s: the all-resident step\n", n, budget, w)
				ref, err := runShard(ctx, c, be, n, budget, 0, 0, qs, nil)
				if err != nil {
					return err
				}
				for _, pct := range c.DevicePct {
					for _, pf := range c.Prefetch {
						fmt.Fprintf(progress, "bench offload: context %d budget %d %s: device budget %d%%, prefetch %d\n", n, budget, w, pct, pf)
						r, err := runShard(ctx, c, be, n, budget, pct, pf, qs, ref.outs)
						if err != nil {
							return err
						}
						sc := c.storeConfig(n, pct)
						out := r.result
						out.Context, out.Budget, out.Pages, out.KPages = n, budget, sc.Capacity, budget/c.PageSize
						out.PageSize, out.QHeads, out.KVHeads, out.HeadDim = c.PageSize, c.QHeads, c.KVHeads, c.HeadDim
						out.Tier, out.Eviction, out.Workload = c.Tier, c.Eviction.String(), w
						out.Backend = c.Backend
						out.DeviceBudgetPct, out.DevicePages, out.Prefetch = pct, sc.DeviceBudget, pf
						out.Steps, out.Warmup = c.Steps, c.Warmup
						out.ResidentStepUS, out.ResidentP50US = ref.result.StepUS, ref.result.StepP50US
						out.Slowdown = out.StepUS / out.ResidentStepUS
						if err := emit(out); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

// runResult is one shard's measurement and, for the all-resident
// shard, its timed steps' outputs.
type runResult struct {
	result Result
	outs   [][]float32
}

// runShard is one shard's run: fill a sequence of n tokens, step the
// queries, time the last c.Steps. pct 0 is the all-resident shard, whose
// timed outputs it returns; otherwise the outputs are compared with ref.
func runShard(ctx context.Context, c Config, be kernels.Backend, n, budget, pct, pf int, qs [][]float32, ref [][]float32) (runResult, error) {
	var out runResult
	sc := c.storeConfig(n, pct)
	var spill *tier.Spill
	if pct > 0 && (c.Tier == "disk" || c.Tier == "host+disk") {
		dir, err := os.MkdirTemp(c.TierDir, "questctl-offload-")
		if err != nil {
			return out, fmt.Errorf("disk tier: %w", err)
		}
		defer os.RemoveAll(dir)
		dc := disktier.DefaultConfig()
		dc.Dir, dc.Slots, dc.PayloadBytes, dc.Durability = dir, sc.Capacity, sc.PayloadBytes(), disktier.SyncNone
		d, err := disktier.Open(dc)
		if err != nil {
			return out, fmt.Errorf("disk tier: %w", err)
		}
		defer d.Close()
		sc.Tier = d
		if c.Tier == "host+disk" {
			host, err := tier.NewMemory(sc.Capacity, sc.PayloadBytes())
			if err != nil {
				return out, fmt.Errorf("host tier: %w", err)
			}
			// The spill tier owns (and closes) both; closing d again
			// above is harmless.
			spill, err = tier.NewSpill(host, d, tier.SpillConfig{Budget: c.hostPages(sc.Capacity)})
			if err != nil {
				return out, fmt.Errorf("host+disk tier: %w", err)
			}
			defer spill.Close()
			sc.Tier = spill
		}
	}
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = c.PageSize, budget, 0
	sh, err := shard.New(shard.Config{Store: sc, Policy: pol, PrefetchPages: pf, DeviceResident: c.Backend == "cuda"}, be)
	if err != nil {
		return out, err
	}
	defer sh.Close()
	id := sh.Store().Create()
	if err := fill(ctx, c, sh, id, n); err != nil {
		return out, err
	}
	// The previous configuration's pools are garbage: collect them now,
	// not during the timed steps.
	runtime.GC()
	var res shard.StepResult
	reqs := []shard.SeqStep{{Seq: id}}
	step := func(q []float32) (time.Duration, error) {
		reqs[0].Q = q
		t0 := time.Now()
		err := sh.Step(ctx, 0, reqs, shard.StepOptions{}, &res)
		return time.Since(t0), err
	}
	for _, q := range qs[:c.Warmup] {
		if _, err := step(q); err != nil {
			return out, err
		}
	}
	before := sh.OffloadStats()
	var spillBefore tier.SpillStats
	if spill != nil {
		spillBefore = spill.Stats()
	}
	times := make([]float64, 0, c.Steps)
	diff, total := 0.0, 0.0
	for i, q := range qs[c.Warmup:] {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		d, err := step(q)
		if err != nil {
			return out, err
		}
		us := float64(d.Nanoseconds()) / 1e3
		times = append(times, us)
		total += us
		if ref == nil {
			out.outs = append(out.outs, slices.Clone(res.O))
			continue
		}
		for j, x := range res.O {
			diff = max(diff, math.Abs(float64(x)-float64(ref[i][j])))
		}
	}
	after := sh.OffloadStats()
	r := &out.result
	steps := float64(c.Steps)
	slices.Sort(times)
	r.StepUS, r.StepP50US = total/steps, times[len(times)/2]
	r.MaxAbsDiff, r.BitIdentical = diff, diff == 0
	if pct == 0 {
		return out, nil
	}
	per := func(a, b int64) float64 { return float64(a-b) / steps }
	perUS := func(a, b time.Duration) float64 { return float64((a - b).Nanoseconds()) / 1e3 / steps }
	hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
	r.HitRate = 1
	if hits+misses > 0 {
		r.HitRate = float64(hits) / float64(hits+misses)
	}
	r.StallUS = perUS(after.Stall, before.Stall)
	r.MissesPerStep = per(after.Misses, before.Misses)
	r.H2DBytesPerStep = per(after.BytesIn+after.PrefetchBytes, before.BytesIn+before.PrefetchBytes)
	r.D2HBytesPerStep = per(after.BytesOut, before.BytesOut)
	r.PassesPerStep = per(after.Passes, before.Passes)
	r.MultiPassSteps = after.MultiPass - before.MultiPass
	r.FusedSteps = after.Fused - before.Fused
	r.PrefetchIssuedPerStep = per(after.PrefetchIssued, before.PrefetchIssued)
	r.PrefetchHitsPerStep = per(after.PrefetchHits, before.PrefetchHits)
	r.PrefetchWastedPerStep = per(after.PrefetchWasted, before.PrefetchWasted)
	r.PrefetchWaitUS = perUS(after.PrefetchWait, before.PrefetchWait)
	r.PrefetchPlanUS = perUS(after.PrefetchPlan, before.PrefetchPlan)
	if spill != nil {
		st := spill.Stats()
		r.SpillResult = &SpillResult{
			HostBudgetPct: c.HostBudget, HostPages: st.Budget,
			HostSlots: st.Upper, DiskSlots: st.Lower,
			Spills: st.Spills, SpilledBytes: st.SpilledBytes, SpillErrors: st.SpillErrors,
			SpillsPerStep:    per(st.Spills, spillBefore.Spills),
			HostReadsPerStep: per(st.UpperReads, spillBefore.UpperReads),
			DiskReadsPerStep: per(st.LowerReads, spillBefore.LowerReads),
		}
	}
	return out, nil
}

// fill appends n tokens of pseudo-random keys and values in
// [-1, 1) (the same for every shard of a run: chunk i comes from seed and
// i) to layer 0.
func fill(ctx context.Context, c Config, sh *shard.Shard, id pagestore.SeqID, n int) error {
	const chunk = 1024
	tok := c.KVHeads * c.HeadDim
	k, v := make([]float32, chunk*tok), make([]float32, chunk*tok)
	for at, i := 0, 0; at < n; at, i = at+chunk, i+1 {
		if err := ctx.Err(); err != nil {
			return err
		}
		m := min(chunk, n-at)
		// xorshift64, seeded from (seed, i): a million-token fill in a
		// second or two (math/rand/v2 takes tens of seconds), the same
		// data for every shard of a run.
		x := (c.Seed+1)*0x9e3779b97f4a7c15 ^ (uint64(i)+1)*0xbf58476d1ce4e5b9
		for j := range k[:m*tok] {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			k[j] = float32(x>>40)/(1<<23) - 1
			v[j] = float32(x&0xffffff)/(1<<23) - 1
		}
		if err := sh.Append(id, 0, k[:m*tok], v[:m*tok]); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	return nil
}

// queries returns n queries of dim floats for workload w: random
// (independent), or slow (each a rotation by 0.1 rad of the previous one
// towards a fresh random direction).
func queries(seed uint64, w string, n, dim int) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 1<<40))
	vec := func() []float32 {
		q := make([]float32, dim)
		for j := range q {
			q[j] = float32(rng.NormFloat64() * 2)
		}
		return q
	}
	qs := make([][]float32, n)
	q := vec()
	cs, sn := float32(math.Cos(0.1)), float32(math.Sin(0.1))
	for i := range qs {
		if w == "random" {
			qs[i] = vec()
			continue
		}
		r := vec()
		next := make([]float32, dim)
		for j := range next {
			next[j] = cs*q[j] + sn*r[j]
		}
		q, qs[i] = next, next
	}
	return qs
}
