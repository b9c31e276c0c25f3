#!/bin/bash
out=$1; rounds=$2; shift 2
for r in $(seq 1 $rounds); do
  for b in "$@"; do
    case $b in
      new) bin=/tmp/hcs-new; env="";;
      presort) bin=/tmp/hcs-exp2; env="HCS_PRESORT=1";;
      presort_noemit) bin=/tmp/hcs-exp2; env="HCS_PRESORT=1 HCS_NOEMIT=1";;
      noemit) bin=/tmp/hcs-exp2; env="HCS_NOEMIT=1";;
    esac
    load=$(cut -d' ' -f1 /proc/loadavg)
    env $env $bin bench collective --nodes 2,4 --batch 1,16 --transport grpc --steps 200 --warmup 20 --json 2>/dev/null \
      | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l); d['hcs_build']='$b'; d['hcs_round']=$r; d['hcs_load_before']=$load; print(json.dumps(d))
" >> $out
  done
done
