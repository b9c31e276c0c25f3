#!/bin/bash
# task 1, second run: the same benchmark, debug log of every prefill chunk (HITL_LOG, uncommitted bench edit)
N=${1:-32767}; tag=${2:-log}
out=/tmp/hitl-out/itl$N-$tag.txt
cd /work/h-itl/serve
echo "== new tokens=$N start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out
HITL_LOG=/tmp/hitl-out/chunks$N-$tag.jsonl /tmp/hitl-bin/serve-log.test -test.run '^$' -test.benchtime=1x -test.timeout 60m \
  -test.bench "BenchmarkPrefillITLDefaults/tokens=$N/relaunch/default=new\$" >> $out 2>&1
echo "== end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) rc $?" >> $out
