//go:build cuda

package cuda

import (
	"fmt"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/plan"
)

// Kernel launches by name (device goroutine only): the kernels of the
// Quest module, looked up at start-up (loop), and the launch of one.

// questKernelNames lists the kernels of the Quest module (quest.cu) that
// loop looks up by name, besides fp8KernelNames.
func questKernelNames() []string {
	names := []string{"quest_topk", "quest_topk_thr", "quest_topk_thr_prof", "quest_topk_radix", "quest_topk_sample_t1024", "quest_topk_sample_t512", "quest_topk_sample_t256", "quest_topk_local", "quest_topk_merge", "quest_reduce", "quest_merge", "quest_gather_tables", "quest_pick_scores",
		"quest_append_fp8", "quest_rescan_fp8", "quest_rescan_slots_fp8", "quest_attend_fp8"}
	for _, dt := range []plan.DType{plan.Float32, plan.Float16, plan.BFloat16} {
		for _, k := range []string{"convert", "append", "score", "attend", "fill", "summarize", "rescan"} {
			names = append(names, "quest_"+k+"_"+dt.String())
		}
		for _, g := range []int{1, 2, 4, 8} {
			names = append(names, fmt.Sprintf("quest_score128_%s_g%d", dt, g))
		}
		for _, d := range []int{64, 128} {
			names = append(names, fmt.Sprintf("quest_attendp_%s_d%d", dt, d))
			if dt != plan.Float32 {
				names = append(names, fmt.Sprintf("quest_attends16_%s_d%d", dt, d))
			}
		}
		if dt != plan.Float32 {
			names = append(names, "quest_score128g4_"+dt.String())
		}
	}
	return names
}

// launch launches kernel name on the default stream with the 8-byte
// parameters args (device goroutine only; a grid with a zero dimension
// launches nothing).
func (b *Backend) launch(name string, grid [3]int, block, shared int, args ...uint64) error {
	return b.launchMode(false, name, grid, block, shared, args...)
}

// launchMode launches name, as a programmatic dependent of the previous
// kernel when pdl is set (the kernel must then wait with
// griddepcontrol.wait before reading that kernel's output).
func (b *Backend) launchMode(pdl bool, name string, grid [3]int, block, shared int, args ...uint64) error {
	f, ok := b.fn[name]
	if !ok {
		return fmt.Errorf("cuda: no kernel %s", name)
	}
	if grid[0] == 0 || grid[1] == 0 || grid[2] == 0 {
		return nil
	}
	if len(args) > maxParams {
		return fmt.Errorf("cuda: launch %s: %d parameters, at most %d", name, len(args), maxParams)
	}
	n := copy(b.argv[:], args)
	launch := launchArgs
	if pdl {
		launch = launchArgsPDL
	}
	if err := launch(f, grid, block, shared, &b.argv, n); err != nil {
		return fmt.Errorf("cuda: launch %s (grid %v, block %d, %d bytes of shared memory): %w", name, grid, block, shared, err)
	}
	return nil
}

func u(p cu.DevicePtr) uint64 { return uint64(p) }

func b2u(x bool) uint64 {
	if x {
		return 1
	}
	return 0
}

// Shared memory: a launch gets at most 48 KiB without an opt-in attribute,
// which gorgonia.org/cu cannot set; the staged kernels also use 768 bytes of
// static shared memory.
const (
	maxSmem          = 48 << 10
	attendStaticSmem = 768
)
