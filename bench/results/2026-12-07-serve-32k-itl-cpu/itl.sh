#!/bin/bash
# task 1: BenchmarkPrefillITLDefaults, 32K prompt beside 4 relaunched streams, new defaults
N=${1:-32767}
out=/tmp/hitl-out/itl$N.txt
cd /work/h-itl/serve
echo "== new tokens=$N start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out
/tmp/hitl-bin/serve.test -test.run '^$' -test.benchtime=1x -test.timeout 60m \
  -test.bench "BenchmarkPrefillITLDefaults/tokens=$N/relaunch/default=new\$" >> $out 2>&1
echo "== end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) rc $?" >> $out
