package cuda

import (
	"strings"
	"testing"
)

// TestPTXMatchesSource fails when a .cu, or a header it includes, changed
// without running gen.sh.
func TestPTXMatchesSource(t *testing.T) {
	for _, c := range []struct {
		name, ptx string
		kernels   []string
	}{
		{"quest", PTX, []string{"quest_topk", "quest_reduce", "quest_merge", "quest_score_bf16", "quest_attend_f16", "quest_append_f32", "quest_convert_bf16", "quest_append_fp8", "quest_rescan_slots_fp8"}},
		{"slots", PTXSlots, []string{"quest_slots_move", "quest_rescan_slots_bf16", "quest_rescan_slots_f32", "quest_slot_table_write", "quest_slot_resolve"}},
		{"mma", PTXMMA, []string{"quest_scoremma_bf16_d128", "quest_scoremma_f16_d64_h16", "quest_attendmma_bf16_d128", "quest_attendmma_f16_d64_h16"}},
		{"model", PTXModel, modelKernelNames()},
		{"prefill", PTXPrefill, prefillKernelNames()},
	} {
		want, err := sourceHash(c.name + ".cu")
		if err != nil {
			t.Fatal(err)
		}
		if got := PTXSourceHash(c.ptx); got != want {
			t.Errorf("%s.ptx was built from source %q, %s.cu and its headers are %q: run kernels/cuda/gen.sh", c.name, got, c.name, want)
		}
		for _, fn := range c.kernels {
			if !strings.Contains(c.ptx, ".entry "+fn+"(") {
				t.Errorf("%s.ptx lacks kernel %s", c.name, fn)
			}
		}
		if !strings.Contains(c.ptx, ".target sm_90") {
			t.Errorf("%s.ptx is not for sm_90", c.name)
		}
	}
}

// TestHeadersCovered checks that every embedded header is included by a
// .cu, so that some PTX's recorded hash covers it.
func TestHeadersCovered(t *testing.T) {
	files, err := sources.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f.Name(), ".cu") {
			hdrs, err := sourceHeaders(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hdrs {
				covered[h] = true
			}
		}
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f.Name(), ".cuh") {
			n++
			if !covered[f.Name()] {
				t.Errorf("%s is included by no .cu: no PTX hash covers it", f.Name())
			}
		}
	}
	if n == 0 || !covered["common.cuh"] {
		t.Errorf("%d headers embedded, common.cuh covered %v", n, covered["common.cuh"])
	}
}
