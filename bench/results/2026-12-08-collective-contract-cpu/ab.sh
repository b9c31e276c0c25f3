#!/bin/bash
# Alternating builds over rounds; one JSON line per configuration, annotated
# with the build, the round and the 1-minute load average before the run.
# usage: ab.sh OUT.jsonl ROUNDS build...   (builds: base new)
out=$1; rounds=$2; shift 2
for r in $(seq 1 $rounds); do
  for b in "$@"; do
    bin=/tmp/h30-$b
    load=$(cut -d' ' -f1 /proc/loadavg)
    $bin bench collective --nodes 2,4 --batch 1,16 --transport grpc --steps 200 --warmup 20 --json 2>/dev/null \
      | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l); d['h30_build']='$b'; d['h30_round']=$r; d['h30_load_before']=$load; print(json.dumps(d))
" >> $out
  done
done
