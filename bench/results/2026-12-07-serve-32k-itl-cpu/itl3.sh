#!/bin/bash
out=/tmp/hitl-out/itl32767-run3.txt
cd /work/h-itl/serve
echo "== new tokens=32767 (run 3) start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out
/tmp/hitl-bin/serve.test -test.run '^$' -test.benchtime=1x -test.timeout 20m \
  -test.bench 'BenchmarkPrefillITLDefaults/tokens=32767/relaunch/default=new$' >> $out 2>&1
echo "== end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) rc $?" >> $out
