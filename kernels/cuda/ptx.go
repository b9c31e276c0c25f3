// Package cuda is the CUDA backend of questrt's kernels: CUDA C sources
// (quest.cu, mma.cu, slots.cu) compiled to PTX for sm_90 by gen.sh and embedded here, and, in
// files built with the cuda tag, a kernels.Backend driving them through
// gorgonia.org/cu. The embedded PTX and its source check are part of every
// build so that CPU-only CI notices a .cu edited without regenerating the
// PTX.
package cuda

import (
	_ "embed"
	"strings"
)

// PTX is the module with every Quest kernel, compiled from quest.cu.
//
//go:embed quest.ptx
var PTX string

// PTXMMA is the module with the tensor-core kernels, compiled from mma.cu.
//
//go:embed mma.ptx
var PTXMMA string

// PTXSlots is the module with the offload kernels (slot pools and the
// mapped host tier), compiled from slots.cu.
//
//go:embed slots.ptx
var PTXSlots string

//go:embed quest.cu
var source string

//go:embed slots.cu
var sourceSlots string

//go:embed mma.cu
var sourceMMA string

// PTXSourceHash returns the SHA-256 (hex) of the .cu source recorded in the
// first line of ptx (PTX or PTXMMA) by gen.sh, or "" when the line is
// missing.
func PTXSourceHash(ptx string) string {
	first, _, _ := strings.Cut(ptx, "\n")
	const tag = "// questrt-source-sha256: "
	if !strings.HasPrefix(first, tag) {
		return ""
	}
	return strings.TrimSpace(strings.TrimPrefix(first, tag))
}
