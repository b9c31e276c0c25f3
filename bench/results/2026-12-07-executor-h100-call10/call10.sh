#!/usr/bin/env bash
# Call 10 (issues 25, 26): GPU tests of 525c40c/581ca17 (score page-number prefetch, argmax) and of the prefill
# attention's skipped rescale and ex2_poly variants; then, in priority order, each step only while the time
# left (LIMIT s in all) allows: 512K new (HEAD) vs old (ee11297) beside the anchor (fp8 summaries on an H200,
# fp8 K/V on an H100), TTFT 32K/128K with the phase split beside the anchor, batch 1 1K/32K/128K, the
# prefill variants, batch 8 at 32K, 1M with fp8 K/V (H200), the attention layer alone.
set -u
LIMIT=${LIMIT:-520}
root=$PWD; d=$root/.gpubuild; cd $d
tar -xzf call10.tgz && chmod +x questctl questctl.old cuda.test
L=$OUT/log.txt; J=$OUT/lines.jsonl
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >> $L
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
T0=$SECONDS; tm() { echo "TIME $1: $((SECONDS-T0)) s (at $SECONDS)" >> $L; T0=$SECONDS; }
fits() { [ $((SECONDS + $1)) -lt $LIMIT ]; } # fits EST: EST more seconds stay within LIMIT
(cd $root/kernels/cuda && timeout 110 $d/cuda.test -test.v -test.run 'TestPTXMatchesSource|TestModelDevice|TestScoreTileMaxima|TestFP8MatchesCPU|TestMMAKernels|TestKeptUploads|TestPrefillMatchesFloat64' 2>&1 | grep -v Warning | grep -E "^(---|    ---|ok|FAIL|PASS|panic)|_test.go" | head -200 > $OUT/tests.txt)
tm tests
run() { # tag bin args...
  local tag=$1 bin=$2; shift 2
  echo "#$tag" >> $J; timeout 120 ./$bin "$@" >> $J 2>> $L; tm $tag
}
anchor() { # tag ctx batch prefill
  echo "#$1" >> $J; CTX=$2 BATCH=$3 LAYERS=32 PREFILL=$4 timeout 90 python3 llama_decode_anchor.py >> $J 2>> $L; tm $1
}
Q="bench decode --backend cuda --config config-8b-1m.json --dense=false"
A="bench attention --backend cuda --batch 1 --budget 4096 --iters 20 --json"
P="$Q --batch 1 --steps 2 --warmup 1 --context 1024"
if [ "$MEM" -gt 100000 ]; then
  X="--summary-dtype fp8"; CT=131072,524288,1048576
else
  X="--kv-cache-dtype fp8 --summary-dtype fp8"; CT=131072,524288
fi
fits 40 && run q512-new questctl $Q --batch 1 --steps 20 --context 524288 $X
fits 40 && run q512-old questctl.old $Q --batch 1 --steps 20 --context 524288 $X
[ "$MEM" -gt 100000 ] && fits 30 && anchor anchor-512k 524288 1 ""
fits 90 && run prefill-new questctl $P --prefill 32768,131072 --phases
fits 40 && anchor anchor-prefill 1024 1 32768,131072
fits 30 && run b1-new questctl $Q --batch 1 --steps 20 --context 1024,32768,131072
fits 30 && anchor anchor-b1 1024,32768,131072 1 ""
fits 40 && run prefill-p2 questctl $P --prefill 131072 --cuda-kernels prefill=prefill_attend_bf16_d128_m2n64w8p2
fits 40 && run prefill-p4 questctl $P --prefill 131072 --cuda-kernels prefill=prefill_attend_bf16_d128_m2n64w8p4
fits 60 && run prefill-old questctl.old $P --prefill 32768,131072
fits 20 && run b8-new questctl $Q --batch 8 --steps 20 --context 32768
fits 20 && anchor anchor-b8 32768 8 ""
[ "$MEM" -gt 100000 ] && fits 60 && run q1m-fp8 questctl $Q --batch 1 --steps 10 --warmup 3 --context 1048000 --kv-cache-dtype fp8 --summary-dtype fp8
fits 20 && run b1-old questctl.old $Q --batch 1 --steps 20 --context 1024,32768,131072
fits 30 && run attn-new questctl $A --kv-cache-dtype bf16 --summary-dtype fp8 --context $CT
fits 40 && run prefill-c8192 questctl $P --prefill 131072 --prefill-chunk 8192
ls -la $OUT >> $L
