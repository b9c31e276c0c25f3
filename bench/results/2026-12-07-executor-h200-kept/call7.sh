#!/usr/bin/env bash
# Call 7: tests of the kept uploads; questrt (uploads skipped / always) beside the anchor at 1K-128K; 512K when the card is an H200; the timeline of one step.
set -u
root=$PWD; d=$root/.gpubuild; cd $d
tar -xzf call7.tgz && chmod +x questctl cuda.test
L=$OUT/log.txt; J=$OUT/lines.jsonl
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >> $L
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
T0=$SECONDS; tm() { echo "TIME $1: $((SECONDS-T0)) s (at $SECONDS)" >> $L; T0=$SECONDS; }
left() { [ $SECONDS -lt $1 ]; }
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys=$NSYS mem=$MEM" >> $L
(cd $root/kernels/cuda && timeout 100 $d/cuda.test -test.v -test.run 'TestKeptUploads|TestTensorStepMatchesQueued|TestEngineDeviceTensors|TestQueuedStepsMatchStep|TestFusedStepOnDevice|TestPTXMatchesSource' 2>&1 | grep -v Warning | grep -E "^(---|    ---|ok|FAIL|PASS|panic)|_test.go" | head -100 > $OUT/tests.txt)
tm tests
Q="./questctl bench decode --backend cuda --config config-8b-1m.json --dense=false --batch 1"
echo '#questrt-b1-kept' >> $J; timeout 100 $Q --steps 20 --context 1024,32768,131072 >> $J 2>> $L; tm b1
echo '#questrt-b1-always' >> $J; timeout 100 $Q --steps 20 --context 1024,32768,131072 --cuda-kernels uploads=always >> $J 2>> $L; tm b1always
echo '#anchor-b1' >> $J; CTX=1024,32768,131072 BATCH=1 LAYERS=32 PREFILL= timeout 90 python3 llama_decode_anchor.py >> $J 2>> $L; tm anchor
prof() { # context
  if [ -n "$NSYS" ]; then
    timeout 100 $NSYS profile -t cuda --capture-range=cudaProfilerApi --capture-range-end=stop -o $d/p$1 -f true $Q --steps 3 --context $1 --profile-range >> $L 2>&1
    timeout 40 $NSYS stats -r cuda_gpu_trace -f csv -o $OUT/p$1 $d/p$1.nsys-rep >> $L 2>&1
  else
    timeout 100 /usr/local/cuda/bin/ncu --profile-from-start off --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv $Q --steps 3 --context $1 --profile-range > $OUT/ncu$1.csv 2>> $L
  fi
  tm prof$1
}
prof 1024
if [ "$MEM" -gt 100000 ]; then
  left 360 && { echo '#questrt-512k-fp8sum' >> $J; timeout 150 $Q --steps 20 --context 524288 --summary-dtype fp8 >> $J 2>> $L; tm q512; }
  left 490 && { echo '#anchor-512k' >> $J; CTX=524288 BATCH=1 LAYERS=32 PREFILL= timeout 90 python3 llama_decode_anchor.py >> $J 2>> $L; tm a512; }
else
  left 420 && { echo '#questrt-b1-fp8sum-128k' >> $J; timeout 60 $Q --steps 20 --context 131072 --summary-dtype fp8 >> $J 2>> $L; tm b1fp8; }
  left 480 && { echo '#questrt-b8-32k' >> $J; timeout 60 ./questctl bench decode --backend cuda --config config-8b-1m.json --dense=false --batch 8 --steps 20 --context 32768 >> $J 2>> $L; tm b8; }
  left 540 && prof 131072
fi
ls -la $OUT >> $L
