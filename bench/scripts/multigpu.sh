#!/usr/bin/env bash
# Issue 17's measurements on a multi-GPU kind, in one device call (the
# binaries built beforehand on a machine with Go, see README: building for
# a GPU host):
#
#   eval "$(scripts/cuda-sdk.sh --env)"
#   go test -c -tags cuda -ldflags="-s -w" -o .gpubuild/cuda.test ./kernels/cuda/
#   # on the device machine, from the repository root:
#   bench/scripts/multigpu.sh OUTDIR [GPUS]
#
# 1. NCCL all-gather p50/p99 through PyTorch for 2..GPUS ranks (powers of
#    two), 1 KiB to 1 MiB per rank: the anchor.
# 2. BenchmarkCPScaling (kernels/cuda): one decode layer, CP 1..GPUS on
#    GPUs 0..GPUS-1, at 1M tokens (batch 1 and 16 at 128K), with the phases
#    and the collectives' p50/p99.
# Everything goes to OUTDIR; NVLink multicast stays off.
set -euo pipefail
out=${1:?usage: $0 OUTDIR [GPUS]}
gpus=${2:-$(nvidia-smi -L | wc -l)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv >"$out/gpus.csv"
nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true
for ((n = 2; n <= gpus; n *= 2)); do
	torchrun --standalone --nproc-per-node "$n" bench/scripts/nccl_allgather.py >>"$out/nccl-allgather.jsonl" 2>>"$out/nccl.err"
done
devs=$(seq -s, 0 $((gpus - 1)))
cd kernels/cuda
QUESTRT_BENCH_DEVICES=$devs QUESTRT_BENCH_CONTEXTS=1048576 QUESTRT_BENCH_BATCHES=1 \
	../../.gpubuild/cuda.test -test.run '^$' -test.bench CPScaling -test.benchtime 200x >"$out/cp-1m-b1.txt" 2>&1
QUESTRT_BENCH_DEVICES=$devs QUESTRT_BENCH_CONTEXTS=131072 QUESTRT_BENCH_BATCHES=1,16 \
	../../.gpubuild/cuda.test -test.run '^$' -test.bench CPScaling -test.benchtime 200x >"$out/cp-128k.txt" 2>&1
grep -h '^Benchmark' "$out"/cp-*.txt || true
cat "$out/nccl-allgather.jsonl" || true
