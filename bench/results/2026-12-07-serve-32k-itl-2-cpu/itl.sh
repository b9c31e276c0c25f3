#!/bin/bash
# BenchmarkPrefillITLDefaults, an N-token prompt beside 4 relaunched streams, defaults (new)
N=${1:-32767}
BIN=${2:-/tmp/hitl2-bin/serve.test}
out=/tmp/hitl2-out/itl$N-$3.txt
cd /work/h-itl/serve
echo "== $BIN tokens=$N start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out
$BIN -test.run '^$' -test.benchtime=1x -test.timeout 60m \
  -test.bench "BenchmarkPrefillITLDefaults/tokens=$N/relaunch/default=new\$" >> $out 2>&1
rc=$?
echo "== end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) rc $rc" >> $out
