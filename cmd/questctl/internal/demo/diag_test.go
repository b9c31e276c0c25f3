package demo

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// The diagnostics tests live here, beside the demo that depends on them:
// they drive engine and shard through their exported API only.

const (
	dgQ, dgKV, dgD, dgS = 8, 2, 32, 16
	dgTokens            = 4096 // 256 pages
	dgBudget            = 128  // K = 8 pages
)

// diagData is a fixed-seed sequence: keys and values [t][KV][D] and a
// query [Q][D], with a few keys pointing along the query of each KV head
// so that the selection matters.
type diagData struct {
	k, v, q []float32
}

func newDiagData(seed uint64) diagData {
	rng := rand.New(rand.NewPCG(seed, 7))
	vec := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	dd := diagData{k: vec(dgTokens * dgKV * dgD), v: vec(dgTokens * dgKV * dgD), q: vec(dgQ * dgD)}
	g := dgQ / dgKV
	for i := range 24 {
		t := (i*dgTokens)/24 + 5
		for kvh := range dgKV {
			for j := range dgD {
				dd.k[(t*dgKV+kvh)*dgD+j] += dd.q[kvh*g*dgD+j]
			}
		}
	}
	return dd
}

// naiveDiag computes the diagnostics of one step in float64 straight from
// the keys and values, given the pages each query head attended: the
// dense softmax, its top-R tokens (ties to the earlier token), the mass
// inside the attended pages, and the output error of attending only
// those pages against attending all.
func naiveDiag(dd diagData, selected [][]int32, topR int) (recall, mass, rel float64) {
	g := dgQ / dgKV
	scale := 1 / math.Sqrt(dgD)
	var num, den float64
	for h := range dgQ {
		kvh := h / g
		logit := make([]float64, dgTokens)
		mx := math.Inf(-1)
		for t := range dgTokens {
			var dot float64
			for j := range dgD {
				dot += float64(dd.q[h*dgD+j]) * float64(dd.k[(t*dgKV+kvh)*dgD+j])
			}
			logit[t] = dot * scale
			mx = max(mx, logit[t])
		}
		in := func(t int) bool { _, ok := slices.BinarySearch(selected[h], int32(t/dgS)); return ok }
		var zAll, zSel float64
		od, os := make([]float64, dgD), make([]float64, dgD)
		for t := range dgTokens {
			e := math.Exp(logit[t] - mx)
			zAll += e
			if in(t) {
				zSel += e
			}
			for j := range dgD {
				x := e * float64(dd.v[(t*dgKV+kvh)*dgD+j])
				od[j] += x
				if in(t) {
					os[j] += x
				}
			}
		}
		mass += min(zSel/zAll, 1)
		order := make([]int, dgTokens)
		for t := range order {
			order[t] = t
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(logit[b], logit[a]) })
		hit := 0
		for _, t := range order[:topR] {
			if in(t) {
				hit++
			}
		}
		recall += float64(hit) / float64(topR)
		for j := range dgD {
			d := os[j]/zSel - od[j]/zAll
			num += d * d
			den += (od[j] / zAll) * (od[j] / zAll)
		}
	}
	return recall / dgQ, mass / dgQ, math.Sqrt(num / den)
}

func checkAgainstNaive(t *testing.T, name string, dd diagData, dg shard.Diagnostics) {
	t.Helper()
	recall, mass, rel := naiveDiag(dd, dg.Selected, 10)
	if dg.Recall != recall || math.Abs(dg.MassRecall-mass) > 1e-5 || math.Abs(dg.RelL2-rel) > 1e-4*max(1, rel) {
		t.Errorf("%s: recall %v mass %v rel L2 %v, naive float64 reference %v %v %v", name, dg.Recall, dg.MassRecall, dg.RelL2, recall, mass, rel)
	}
	if mass > 0.9999 || rel < 1e-3 {
		t.Errorf("%s: mass %v rel %v: the selection left nothing out; the test data do not test much", name, mass, rel)
	}
}

type diagLayout struct {
	name   string
	cp, tp int
	gqa    kernels.GQAMode
	device bool
}

func newDiagEngine(t *testing.T, lay diagLayout, cpu *kernels.CPU, dd diagData) (*engine.Engine, engine.SeqID) {
	t.Helper()
	ec := engine.DefaultConfig()
	ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = 1, dgQ, dgKV, dgD, dgS
	ec.CP, ec.TP, ec.CapacityPages = lay.cp, lay.tp, dgTokens/dgS/lay.cp+4
	ec.Policy.PageSize, ec.Policy.BudgetTokens, ec.Policy.DenseLayers, ec.Policy.GQA = dgS, dgBudget, 0, lay.gqa
	ec.Backend = cpu
	if lay.device {
		ec.Backend, ec.DeviceResident = backendtest.FakeDevice{CPU: cpu}, true
	}
	e, err := engine.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	id, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Append(id, 0, dd.k, dd.v); err != nil {
		t.Fatal(err)
	}
	return e, id
}

// TestEngineDiagnosticsNaive: the engine's diagnostics (recall, mass
// recall, rel L2) equal a naive float64 reference over the keys and
// values on a fixed seed, for single-shard, CP x TP and per-head layouts;
// on host-resident shards they copy no page data out of the pools, and on
// device-resident (pretend device) shards they read every page back once
// and give the very same values.
func TestEngineDiagnosticsNaive(t *testing.T) {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	dd := newDiagData(3)
	for _, lay := range []diagLayout{
		{name: "cp1-tp1", cp: 1, tp: 1},
		{name: "cp3-tp2", cp: 3, tp: 2},
		{name: "per-head", cp: 2, tp: 1, gqa: kernels.PerHead},
	} {
		e, id := newDiagEngine(t, lay, cpu, dd)
		var res engine.Result
		if err := e.Step(context.Background(), 0, []engine.Request{{Seq: id, Q: dd.q}}, engine.StepOptions{Diagnostics: true}, &res); err != nil {
			t.Fatal(err)
		}
		checkAgainstNaive(t, lay.name, dd, res.Diag[0])
		for tp := range lay.tp {
			for cp := range lay.cp {
				if n := e.Shard(tp, cp).ReadBackBytes(); n != 0 {
					t.Errorf("%s: shard (tp %d, cp %d) copied %d bytes of page data for diagnostics on the CPU", lay.name, tp, cp, n)
				}
			}
		}
		// The same on a pretend device: identical values, each page read
		// back once (keys, with their values and summaries).
		lay.device = true
		de, did := newDiagEngine(t, lay, cpu, dd)
		var dres engine.Result
		if err := de.Step(context.Background(), 0, []engine.Request{{Seq: did, Q: dd.q}}, engine.StepOptions{Diagnostics: true}, &dres); err != nil {
			t.Fatal(err)
		}
		a, b := res.Diag[0], dres.Diag[0]
		if a.Recall != b.Recall || a.MassRecall != b.MassRecall || a.RelL2 != b.RelL2 || a.PagesRead != b.PagesRead {
			t.Errorf("%s: device-resident diagnostics %+v differ from host %+v", lay.name, b, a)
		}
		var got int64
		for tp := range lay.tp {
			for cp := range lay.cp {
				got += de.Shard(tp, cp).ReadBackBytes()
			}
		}
		kvT := dgKV / lay.tp
		want := int64(dgTokens/dgS) * int64(lay.tp) * int64(2*kvT*dgS*dgD+kvT*2*dgD) * 4
		if got != want {
			t.Errorf("%s: device diagnostics read back %d bytes, want %d (every page once)", lay.name, got, want)
		}
	}
}

// TestEngineDiagnosticsAllocations: a diagnostics step allocates a small
// fraction of the sequence's key bytes beyond what the same step without
// diagnostics does (it used to copy K, V and summaries of every page).
func TestEngineDiagnosticsAllocations(t *testing.T) {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	dd := newDiagData(4)
	e, id := newDiagEngine(t, diagLayout{cp: 1, tp: 1}, cpu, dd)
	req := []engine.Request{{Seq: id, Q: dd.q}}
	var res engine.Result
	alloc := func(opt engine.StepOptions) uint64 {
		const runs = 8
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range runs {
			if err := e.Step(context.Background(), 0, req, opt, &res); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&m1)
		return (m1.TotalAlloc - m0.TotalAlloc) / runs
	}
	alloc(engine.StepOptions{Diagnostics: true}) // warm up
	plain := alloc(engine.StepOptions{Phased: true})
	diag := alloc(engine.StepOptions{Diagnostics: true})
	keyBytes := uint64(len(dd.k) * 4)
	if diag > plain+keyBytes/8 {
		t.Errorf("a diagnostics step allocates %d bytes, %d without diagnostics: more than 1/8 of the %d key bytes", diag, plain, keyBytes)
	}
	if n := e.Shard(0, 0).ReadBackBytes(); n != 0 {
		t.Errorf("%d bytes of page data copied", n)
	}
}

// TestShardDiagnosticsNaive: the shard's own diagnostics (shard.Step with
// Diagnostics, as replay runs it) against the same naive reference, host
// and pretend device, and PageKeys: in place on the host (the store's own
// memory), chunked copies on the device with the same contents.
func TestShardDiagnosticsNaive(t *testing.T) {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	dd := newDiagData(5)
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = dgS, dgBudget, 0
	var diags []shard.Diagnostics
	var shards []*shard.Shard
	var ids []pagestore.SeqID
	for _, dev := range []bool{false, true} {
		var be kernels.Backend = cpu
		if dev {
			be = backendtest.FakeDevice{CPU: cpu}
		}
		sh, err := shard.New(shard.Config{Store: pagestore.Config{Layers: 1, Geometry: plan.Geometry{QHeads: dgQ, KVHeads: dgKV, HeadDim: dgD, PageSize: dgS}, Capacity: dgTokens/dgS + 2},
			Policy: pol, DeviceResident: dev}, be)
		if err != nil {
			t.Fatal(err)
		}
		defer sh.Close()
		id := sh.Store().Create()
		if err := sh.Append(id, 0, dd.k, dd.v); err != nil {
			t.Fatal(err)
		}
		var res shard.StepResult
		if err := sh.Step(context.Background(), 0, []shard.SeqStep{{Seq: id, Q: dd.q}}, shard.StepOptions{Diagnostics: true}, &res); err != nil {
			t.Fatal(err)
		}
		checkAgainstNaive(t, map[bool]string{false: "host shard", true: "device shard"}[dev], dd, res.Diag[0])
		diags = append(diags, res.Diag[0])
		shards, ids = append(shards, sh), append(ids, id)
	}
	if a, b := diags[0], diags[1]; a.Recall != b.Recall || a.MassRecall != b.MassRecall || a.RelL2 != b.RelL2 {
		t.Errorf("device diagnostics %v %v %v differ from host %v %v %v", b.Recall, b.MassRecall, b.RelL2, a.Recall, a.MassRecall, a.RelL2)
	}
	if n := shards[0].ReadBackBytes(); n != 0 {
		t.Errorf("host shard copied %d bytes of page data", n)
	}
	// PageKeys: the host reader aliases the pool, the device one copies.
	host, dev := shards[0], shards[1]
	table, err := host.Store().AppendPageTable(nil, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	dtable, err := dev.Store().AppendPageTable(nil, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	hk, err := host.PageKeys(0, table)
	if err != nil {
		t.Fatal(err)
	}
	dk, err := dev.PageKeys(0, dtable)
	if err != nil {
		t.Fatal(err)
	}
	before := dev.ReadBackBytes()
	for i := range hk.Len() {
		a, err := hk.Keys(context.Background(), i)
		if err != nil {
			t.Fatal(err)
		}
		if pk, _ := host.Store().PageKV(0, int(table[i]), 0); &a[0] != &pk[0] {
			t.Fatalf("page %d: host keys are a copy, not the pool", i)
		}
		b, err := dk.Keys(context.Background(), i)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			t.Fatalf("page %d: device keys differ from host keys", i)
		}
	}
	if got, want := dev.ReadBackBytes()-before, int64(len(table))*int64(2*dgKV*dgS*dgD+dgKV*2*dgD)*4; got != want {
		t.Errorf("device PageKeys read back %d bytes, want %d (each page once)", got, want)
	}
	if _, err := hk.Keys(context.Background(), hk.Len()); err == nil {
		t.Error("Keys past the list accepted")
	}
	if _, err := host.PageKeys(0, []int32{-1}); err == nil {
		t.Error("PageKeys accepted page -1")
	}
	if _, err := host.PageKeys(1, table); err == nil {
		t.Error("PageKeys accepted layer 1 of 1")
	}
}
