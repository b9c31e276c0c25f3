#!/bin/bash
# usage: run.sh which(old|new) tag bglen promptlen maxtokens requests
which=$1; tag=$2; bg=$3; pl=$4; mt=$5; rq=$6
port=$((20000 + RANDOM % 20000))
out=/tmp/h-serve-bench/$tag
/tmp/h-serve-bin/questd-$which --model /work/shared/models/passkey-llama-v1 --http-addr 127.0.0.1:$port --grpc-addr 127.0.0.1:0 \
  --gossip-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --insecure --grow-reservations $QEXTRA > $out.questd.log 2>&1 &
qpid=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:$port/v1/models >/dev/null && break; sleep 0.5; done
echo "$tag $which start $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> /tmp/h-serve-bench/run.log
/tmp/h-serve-bin/questctl bench serve --addr 127.0.0.1:$port --prompt-len $pl --concurrency ${CONC:-4} --requests $rq --max-tokens $mt \
  --background-prompt-len $bg --selector quest --warmup 1 --timeout 10m --json > $out.jsonl 2> $out.stderr
echo "$tag $which end $(date +%T) load $(cut -d' ' -f1 /proc/loadavg) rc $?" >> /tmp/h-serve-bench/run.log
kill $qpid; wait $qpid 2>/dev/null
