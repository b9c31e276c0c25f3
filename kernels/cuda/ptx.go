// Package cuda is the CUDA backend of questrt's kernels: CUDA C sources
// (quest.cu, mma.cu, slots.cu, model.cu, prefill.cu) compiled to PTX for sm_90 by gen.sh and
// embedded here, and, in files built with the cuda tag, a kernels.Backend
// driving them through gorgonia.org/cu. The embedded PTX and its source
// check are part of every build so that CPU-only CI notices a .cu, or a
// header it includes, edited without regenerating the PTX.
//
// One concept per file, CUDA and Go alike. quest.cu is one translation
// unit, compiled into the one module quest.ptx, that includes a header per
// concept: common.cuh, convert.cuh, page.cuh (append, rescan, page
// tables), score.cuh, topk.cuh with topk_thr.cuh, topk_radix.cuh and
// topk_sample.cuh, attend.cuh, merge.cuh, fp8.cuh (fp8 summaries) and
// kvfp8.cuh (fp8 K/V records: plan.FP8 pages quantized by the append and
// dequantized by the attention kernel, byte-compatible with the CPU page
// store's records). The Go side keeps the device loop in backend.go and
// has a file per concept beside it (launch.go, transfer.go, layers.go,
// pool.go, append.go, tables.go, score.go, topk.go, attend.go, merge.go,
// step.go, rank.go, validate.go; fp8.go, kvfp8.go, mma.go, slots.go;
// model.go, tensor.go and prefill.go for the device executor).
package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// PTX is the module with every Quest kernel, compiled from quest.cu and
// the headers it includes.
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

// PTXModel is the module with the model kernels of the device executor
// (embedding, RMSNorm, GEMV, RoPE, SwiGLU, argmax), compiled from
// model.cu.
//
//go:embed model.ptx
var PTXModel string

// PTXPrefill is the module with the prefill kernels of the device
// executor (the GEMM of a chunk's projections and its causal attention
// over the sequence's pages), compiled from prefill.cu.
//
//go:embed prefill.ptx
var PTXPrefill string

// sources holds the CUDA C the PTX modules are compiled from.
//
//go:embed *.cu *.cuh
var sources embed.FS

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

// localInclude matches an #include of a header of this directory.
var localInclude = regexp.MustCompile(`(?m)^[ \t]*#[ \t]*include[ \t]*"([^"]+)"`)

// sourceHeaders returns the local headers the embedded source file cu
// includes (#include "x.cuh", directly or through other headers), in name
// order.
func sourceHeaders(cu string) ([]string, error) {
	seen := map[string]bool{}
	var hdrs []string
	todo := []string{cu}
	for len(todo) > 0 {
		f := todo[0]
		todo = todo[1:]
		text, err := sources.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cu, err)
		}
		for _, m := range localInclude.FindAllSubmatch(text, -1) {
			if h := string(m[1]); !seen[h] {
				seen[h] = true
				hdrs = append(hdrs, h)
				todo = append(todo, h)
			}
		}
	}
	sort.Strings(hdrs)
	return hdrs, nil
}

// sourceHash returns the SHA-256 (hex) that gen.sh records for the embedded
// source file cu: of its text followed by the text of each of its
// sourceHeaders.
func sourceHash(cu string) (string, error) {
	hdrs, err := sourceHeaders(cu)
	if err != nil {
		return "", err
	}
	sum := sha256.New()
	for _, f := range append([]string{cu}, hdrs...) {
		text, err := sources.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("%s: %w", cu, err)
		}
		sum.Write(text)
	}
	return hex.EncodeToString(sum.Sum(nil)), nil
}
