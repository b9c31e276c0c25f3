#!/usr/bin/env bash
# One device call of issue 25/26's measurements: the GPU executor beside
# the PyTorch anchor (../shared/anchors/llama_decode_anchor.py) on the
# same GPU, in one run. Run it on the GPU host from a folder DIR that
# holds, built elsewhere (the host has no Go):
#
#   questctl.gz      go build -tags cuda -ldflags="-s -w" ./cmd/questctl, gzipped
#   gpu.test.gz      go test -c -tags cuda ./model/gpu/, gzipped
#   gpudecode.test.gz  go test -c -tags cuda ./bench/gpudecode/, gzipped
#   cuda.test.gz     go test -c -tags cuda ./kernels/cuda/, gzipped
#   config-8b-1m.json  examples/llama-3.1-8b/config.json with
#                    max_position_embeddings 1048576
#   llama_decode_anchor.py, models/passkey-llama-v1/
#
#   OUT=/some/dir bench/scripts/executor-gpu.sh DIR [PARTS]
#
# PARTS (default "tests b1 b8 anchor"; add "fp8-1m" on a GPU with
# 110+ GB): tests = the CUDA tests of model/gpu and bench/gpudecode (the
# device fill equals the host's, greedy tokens against the CPU executor, with bf16 and fp8
# pages prefilled on the device) and the prefill attention's float64
# conformance (bf16, f16, fp8 pages); b1 = bench decode at batch 1 over
# 1K/32K/128K/512K with --phases (a marked step's device timeline per
# phase and the projections' GB/s) and TTFT of 32K/128K prompts, bf16
# and fp8 pages; b8 =
# batch 8 at 32K; anchor = the anchor's lines for both; fp8-1m = fp8 K/V
# at 1,048,576 tokens (16 GB of bf16 weights + 69 GB of codes + 17 GB of
# float32 summaries). Every output lands in OUT, with the GPU's name.
set -u
dir=$1
parts=${2:-"tests b1 b8 anchor"}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$dir"
out=${OUT:?set OUT to the folder for the results}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
for f in questctl gpu.test gpudecode.test cuda.test; do gunzip -kf $f.gz && chmod +x $f; done
has() { [[ " $parts " == *" $1 "* ]]; }
t() { # t NAME CMD...: runs CMD, its output to OUT/NAME.txt, its time to OUT/times.txt
	local name=$1 t0=$SECONDS
	shift
	"$@" 2>&1 | grep -v Warning | tee "$out/$name.txt"
	echo "$name: $((SECONDS - t0)) s" | tee -a "$out/times.txt"
}
if has tests; then
	(cd "$root/model/gpu" && QUESTRT_TEST_MODEL="$dir/models/passkey-llama-v1" timeout 180 "$dir/gpu.test" \
		-test.run 'TestGreedyMatchesCPU|TestGreedyPrefillMatchesCPU|TestPageBytesOnDevice' -test.v 2>&1 |
		grep -E '^(--- |ok|FAIL|PASS|panic)|equal|pages take|within' | tee "$out/tests.txt")
	(cd "$root/bench/gpudecode" && timeout 60 "$dir/gpudecode.test" -test.run 'TestAppendTensorOnDevice' -test.v 2>&1 |
		grep -E '^(--- |ok|FAIL|PASS|panic)|equal' | tee -a "$out/tests.txt")
	(cd "$root/kernels/cuda" && timeout 120 "$dir/cuda.test" -test.run 'TestPrefillMatchesFloat64|TestPTXMatchesSource' -test.v 2>&1 |
		grep -E '^(--- |ok|FAIL|PASS|panic)' | tee "$out/cudatests.txt")
fi
if has b1; then
	t questrt-b1 timeout 300 ./questctl bench decode --backend cuda --config config-8b-1m.json \
		--context 1024,32768,131072,524288 --batch 1 --steps 20 --phases --prefill 32768,131072
	t questrt-prefill-fp8 timeout 150 ./questctl bench decode --backend cuda --config config-8b-1m.json \
		--context 1024 --batch 1 --steps 5 --dense=false --kv-cache-dtype fp8 --prefill 32768,131072
fi
if has b8; then
	t questrt-b8 timeout 120 ./questctl bench decode --backend cuda --config config-8b-1m.json --context 32768 --batch 8 --steps 20
fi
if has anchor; then
	has b1 && CTX=1024,32768,131072,524288 BATCH=1 LAYERS=32 PREFILL=32768,131072 t anchor-b1 timeout 240 python3 llama_decode_anchor.py
	has b8 && CTX=32768 BATCH=8 LAYERS=32 PREFILL= t anchor-b8 timeout 90 python3 llama_decode_anchor.py
fi
if has fp8-1m; then
	t questrt-fp8-1m timeout 300 ./questctl bench decode --backend cuda --config config-8b-1m.json \
		--context 1048000 --batch 1 --steps 10 --warmup 3 --dense=false --kv-cache-dtype fp8
fi
